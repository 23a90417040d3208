"""Who may reach the slaves' port 22 (`ssh_cidr`): one /32 or /128 by default.

Where it comes from, first found wins: `gputui cloud up --ssh-cidr`, the profile's
`[cloud] ssh_cidr`, the environment (`GPUTUI_SSH_CIDR`, for profiles that leave it out,
such as the shipped one), then this machine's public address as an echo service sees it. The simulated cloud never asks the network: its slaves are
on this machine.
"""

from __future__ import annotations

import ipaddress
import os
import urllib.request
from typing import Callable

from gputui.model.errors import UserError

CHECKIP_URL = "https://checkip.amazonaws.com/"
ENV = "GPUTUI_SSH_CIDR"
EXAMPLE = "203.0.113.7/32"
SIM_ADDRESS = "127.0.0.1"  # the simulated cloud's slaves are reached on this machine
Resolver = Callable[[], str]


def lookup_public_ip(url: str | None = None, timeout_s: float = 5.0) -> str:
    """Ask an echo service (AWS's checkip; `GPUTUI_PUBLIC_IP_URL` overrides) for our address."""
    url = url or os.environ.get("GPUTUI_PUBLIC_IP_URL") or CHECKIP_URL
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - fixed or user-chosen URL
        return str(reply.read(100).decode("ascii", "replace").strip())


def no_lookup() -> str:
    """The simulated cloud's resolver: this machine, without asking the network."""
    return SIM_ADDRESS


def resolver_for(provider: str) -> Resolver:
    """How a provider finds the caller's address: never through the network for the simulated cloud."""
    return no_lookup if provider == "sim" else lookup_public_ip


def check_cidr(value: str, what: str) -> str:
    """`value` as a network in CIDR form (a bare address becomes its /32 or /128); a UserError naming `what`."""
    try:
        return str(ipaddress.ip_network(value.strip(), strict=True))
    except ValueError:
        raise UserError(f"{what} {value!r}: expected a network in CIDR form such as {EXAMPLE} (host bits zero)") from None


def ssh_cidr(configured: str | None, where: str, resolver: Resolver = lookup_public_ip) -> str:
    """The configured CIDR (the flag or the profile), else GPUTUI_SSH_CIDR, else this machine's
    public address as a single-host network."""
    if configured:
        return configured
    env = os.environ.get(ENV, "").strip()
    if env:
        return check_cidr(env, ENV)
    try:
        address = ipaddress.ip_address(resolver())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"could not find this machine's public address to allow SSH from ({exc}); "
            f"set ssh_cidr in [cloud] of {where}, or give it without editing the profile: "
            f"gputui cloud up --ssh-cidr {EXAMPLE}, or {ENV}={EXAMPLE} in the environment"
        ) from None
    return f"{address}/{address.max_prefixlen}"
