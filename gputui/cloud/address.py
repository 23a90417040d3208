"""This machine's public address, for the default `ssh_cidr` (one /32 or /128)."""

from __future__ import annotations

import ipaddress
import os
import urllib.request
from typing import Callable

from gputui.errors import UserError

CHECKIP_URL = "https://checkip.amazonaws.com/"
Resolver = Callable[[], str]


def lookup_public_ip(url: str | None = None, timeout_s: float = 5.0) -> str:
    """Ask an echo service (AWS's checkip; `GPUTUI_PUBLIC_IP_URL` overrides) for our address."""
    url = url or os.environ.get("GPUTUI_PUBLIC_IP_URL") or CHECKIP_URL
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 - fixed or user-chosen URL
        return str(reply.read(100).decode("ascii", "replace").strip())


def ssh_cidr(configured: str | None, where: str, resolver: Resolver = lookup_public_ip) -> str:
    """The configured CIDR, or this machine's public address as a single-host network."""
    if configured:
        return configured
    try:
        address = ipaddress.ip_address(resolver())
    except (OSError, ValueError) as exc:
        raise UserError(
            f"could not find this machine's public address to allow SSH from ({exc}); "
            f"set ssh_cidr in [cloud] of {where}, e.g. ssh_cidr = \"203.0.113.7/32\""
        ) from None
    return f"{address}/{address.max_prefixlen}"
