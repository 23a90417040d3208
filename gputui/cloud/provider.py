"""The provider contract: price, launch, describe, terminate, list by tag.

Two implementations: gputui.cloud.ec2 (boto3) and gputui.cloud.sim (simulated, for
the demo mode and UI tests). Both take and return the typed records of
gputui.model.cloud.
"""

from __future__ import annotations

import base64
import binascii
import getpass
import os
import re
import socket
from dataclasses import dataclass, field
from typing import Mapping, Protocol, Sequence, runtime_checkable

from gputui.cloud.pricing import SourcedPrice
from gputui.cloud.tags import TAG_CLUSTER, TAG_MANAGED, TAG_OWNER
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import InstanceInfo


# Capacity and price errors: another zone (or on-demand) may succeed.
ZONE_ERRORS = frozenset({
    "InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity",
    "SpotMaxPriceTooLow", "Unsupported", "InsufficientFreeAddressesInSubnet", "SpotCapacityNotAvailable",
})
# Quota errors that no other zone fixes; on-demand has its own quota, so it may still work.
QUOTA_ERRORS = frozenset({"MaxSpotInstanceCountExceeded", "InstanceLimitExceeded", "VcpuLimitExceeded"})


class CapacityError(GputuiError):
    """A launch refused for capacity, price or quota: the caller may try elsewhere."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    @property
    def account_wide(self) -> bool:
        return self.code in QUOTA_ERRORS


@dataclass(frozen=True)
class LaunchRequest:
    """One `run_instances` call: `count` instances in one zone and one market."""

    instance_type: str
    count: int
    zone: str
    lifecycle: str  # "spot" or "on-demand"
    image_id: str
    key_name: str
    security_group_id: str
    max_price: float | None = None
    tags: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class CloudProvider(Protocol):
    """What gputui needs from a cloud. Methods raise UserError (credentials, permissions,
    bad input), CapacityError (launch refused for capacity/price/quota) or GputuiError."""

    name: str  # "ec2" or "sim": recorded in the ledger with each instance
    region: str

    def zones(self) -> list[str]:
        """The region's availability zones that are available."""

    def spot_prices(self, instance_type: str, zones: Sequence[str]) -> dict[str, float]:
        """The current spot price ($/h) of `instance_type` per zone; zones without one are left out."""

    def spot_source(self) -> str:
        """Where spot_prices come from now, for every price shown: "api 2026-11-25", "sim"."""

    def on_demand_price(self, instance_type: str) -> SourcedPrice | None:
        """The region's on-demand $/h with its source ("api 2026-11-25"; "table 2024-06-01" when the
        cloud cannot say), or None when nothing knows it. Never raises: pricing blocks no command."""

    def resolve_image(self, ami: str) -> str:
        """An AMI id from an id or 'ssm:<public parameter path>'."""

    def ensure_key_pair(self, name: str, public_key: str, tags: Mapping[str, str]) -> str:
        """Import `public_key` as key pair `name` unless it exists; return the name."""

    def ensure_security_group(self, name: str, ssh_cidr: str, tags: Mapping[str, str]) -> str:
        """A group allowing 22/tcp from `ssh_cidr` only and all traffic between its members; its id."""

    def launch(self, request: LaunchRequest) -> list[InstanceInfo]:
        """Start `request.count` instances in one zone (callers cope with fewer) or raise CapacityError."""

    def describe(self, ids: Sequence[str]) -> list[InstanceInfo]:
        """The instances among `ids` that the cloud still knows."""

    def terminate(self, ids: Sequence[str]) -> None:
        """Ask for `ids` to be terminated (returns without waiting)."""

    def list_tagged(self, tags: Mapping[str, str]) -> list[InstanceInfo]:
        """Every instance of the region carrying all of `tags`, in any state the cloud still shows."""

    def console_host_keys(self, instance_id: str) -> list[str]:
        """The SSH host keys ("ssh-ed25519 AAAA...") the instance printed on its console at boot
        (cloud-init does), read through the cloud's API: a channel the network cannot forge.
        Empty until they are printed."""


_KEY_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_BLOCK = re.compile(r"-----BEGIN SSH HOST KEY KEYS-----(.*?)-----END SSH HOST KEY KEYS-----", re.DOTALL)


def parse_console_host_keys(text: str) -> list[str]:
    """The host keys of the last block cloud-init printed (a reboot prints another), as
    "type base64" lines; anything else in the block is ignored."""
    blocks = _BLOCK.findall(text or "")
    keys = []
    for line in (blocks[-1] if blocks else "").splitlines():
        words = line.strip().split()
        if len(words) >= 2 and words[0] in _KEY_TYPES:
            try:
                base64.b64decode(words[1], validate=True)
            except (ValueError, binascii.Error):
                continue
            keys.append(f"{words[0]} {words[1]}")
    return keys


def default_owner() -> str:
    """Who launched: `GPUTUI_OWNER`, or user@host."""
    env = os.environ.get("GPUTUI_OWNER")
    if env:
        return env
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # pragma: no cover - no passwd entry
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def instance_tags(cluster: str, owner: str) -> dict[str, str]:
    """The tags every gputui instance carries."""
    return {TAG_MANAGED: "true", TAG_CLUSTER: cluster, TAG_OWNER: owner, "Name": f"gputui-{cluster}"}


def check_cluster_name(name: str) -> str:
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", name):
        raise UserError(f"--cluster {name!r}: use letters, digits, '-', '_' or '.' (at most 63)")
    return name

