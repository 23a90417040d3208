"""The `[cloud]` profile table: where and what to launch, and what it may cost.

Torch-free and boto3-free, so profiles are validated whole by gputui.profiles.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.errors import UserError, read_user_file
from gputui.hosts import USER_NAME, _check_jump
from gputui.paths import profiles_dir
from gputui.schema import Field, Section, Source

REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
ZONE_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
# [cluster] idle_stop_minutes when the profile has no [cluster] table (gputui.cluster.settings' default)
DEFAULT_IDLE_STOP_MINUTES = 30.0
# [cluster] remote_dir's default: where gputui goes on a slave, its nodes' GPUTUI_HOME in `home/` below it
DEFAULT_REMOTE_DIR = "~/.gputui-cluster"
# [cloud] stalled_minutes' default: a run that makes no step for an hour is hung. Generous on purpose:
# longer than what legitimately passes without a step (a node waiting at the rendezvous for
# [cluster] join_timeout, 10 min by default; NCCL's 10 min collective timeout; CUDA graph capture and
# the data set before the first step; an evaluation or a checkpoint), yet a hung collective bills an
# hour, not until the budget or max_hours (off by default) ends it.
DEFAULT_STALLED_MINUTES = 60.0
AMI_RE = re.compile(r"^(ami-[0-9a-f]{8,17}|ssm:/\S+)$")


def _check_region(value: Any) -> str | None:
    return None if REGION_RE.match(value) else "an AWS region such as 'us-east-1'"


def _check_zones(value: Any) -> str | None:
    bad = [z for z in value if not ZONE_RE.match(z)]
    return f"availability zones such as 'us-east-1a' (not {bad[0]!r})" if bad else None


def _check_type(value: Any) -> str | None:
    return None if TYPE_RE.match(value) else "an instance type such as 'g4dn.xlarge'"


def _check_ami(value: Any) -> str | None:
    return None if AMI_RE.match(value) else "an AMI id ('ami-0123456789abcdef0') or 'ssm:/public/parameter/path'"


def _check_cidr(value: Any) -> str | None:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError:
        return "a network in CIDR form such as '203.0.113.7/32' (host bits zero)"
    return None


CLOUD_SECTION = Section(
    name="cloud",
    doc="Spot slaves on AWS EC2: where, what, and what they may cost (gputui cloud ...).",
    fields={
        "region": Field("str", "AWS region to launch in.", "us-east-1", check=_check_region),
        "zones": Field("str_list", "Allowed availability zones, tried cheapest first (default: all of the region).", (), check=_check_zones),
        "instance_type": Field("str", "EC2 instance type of each slave, e.g. g4dn.xlarge.", "g4dn.xlarge", check=_check_type),
        "count": Field("int", "Slaves `gputui cloud up` launches (--count overrides).", 1, minimum=1, maximum=256),
        "ami": Field(
            "str",
            "Machine image: an AMI id, or ssm:<public parameter path> resolved through SSM at launch.",
            "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
            check=_check_ami,
        ),
        "ssh_user": Field("str", "User name to SSH in as (depends on the image).", "ubuntu",
                          check=lambda v: None if USER_NAME.match(v) else "a user name"),
        "trust_on_first_use": Field("bool", "Accept a slave's first SSH host key unchecked (default: no: it is learnt "
                                    "from the instance's console output, where cloud-init prints it, and pinned).", False),
        "public_key": Field("str", "Your SSH public key file, imported as the EC2 key pair (relative to the profile).", "~/.ssh/id_ed25519.pub"),
        "proxy_jump": Field("str", "Jump host(s) in front of the slaves, as OpenSSH's ProxyJump: \"user@bastion:port\", "
                            "comma-separated for a chain (default: none).", None, check=_check_jump),
        "ssh_cidr": Field(
            "str", "Who may reach port 22 (default: this machine's public address as /32, found at launch).", None, check=_check_cidr
        ),
        "max_price": Field("float", "Highest spot price to pay, $/h per instance (default: the on-demand price).", None, minimum=0, exclusive_minimum=True),
        "on_demand_fallback": Field("bool", "Launch on-demand instances when no allowed zone has spot capacity.", False),
        "budget_usd": Field("float", "Spending cap of this cluster in dollars; slaves are stopped when it is reached.", None, minimum=0, exclusive_minimum=True),
        "kwh_price": Field("float", "Electricity price in $/kWh, to cost the energy of local GPUs.", None, minimum=0),
        "on_demand_price": Field("float", "On-demand $/h of instance_type here (default: the AWS Pricing API's price for the region, cached a day; gputui's dated us-east-1 table when it cannot be asked).", None, minimum=0, exclusive_minimum=True),
        "lease_minutes": Field("float", "Each slave powers itself off (and terminates) once its lease passes: this long "
                               "after the master's last renewal, sooner when the budget would run out first.", 10.0,
                               minimum=2, maximum=1440),
        "renew_minutes": Field("float", "How often the master (the budget guard, `gputui run`, the dashboard) renews "
                               "the lease; shorter than lease_minutes.", 2.0, minimum=0.1, maximum=720),
        "max_hours": Field("float", "Each slave powers itself off this many hours after launch, whatever the master "
                           "says (default: no limit).", None, minimum=0, exclusive_minimum=True),
        "stalled_minutes": Field(
            "float", "Each slave powers itself off (ended_by self:stalled) when a run is registered on it (a cluster "
            "node or sweep worker) and no training step has been seen for this long: a hung collective keeps the GPU "
            "busy and the master renewing the lease, but makes no step. Steps are seen through a heartbeat file the "
            "node writes in its gputui home (<remote_dir>/home/heartbeat, at most once a second); for a sweep, a "
            "worker waiting between trials makes no step either. Keep it longer than [cluster] join_timeout, the "
            "longest a node waits at the rendezvous before its first step (0: never).",
            DEFAULT_STALLED_MINUTES, minimum=0, maximum=10080),
    },
    required=("budget_usd",),
)


@dataclass(frozen=True)
class CloudSettings:
    """A validated `[cloud]` table with defaults filled in."""

    budget_usd: float
    region: str = "us-east-1"
    zones: tuple[str, ...] = ()
    instance_type: str = "g4dn.xlarge"
    count: int = 1
    ami: str = CLOUD_SECTION.fields["ami"].default
    ssh_user: str = "ubuntu"
    trust_on_first_use: bool = False
    public_key: str = "~/.ssh/id_ed25519.pub"
    proxy_jump: str | None = None
    ssh_cidr: str | None = None
    max_price: float | None = None
    on_demand_fallback: bool = False
    kwh_price: float | None = None
    on_demand_price: float | None = None
    lease_minutes: float = 10.0
    renew_minutes: float = 2.0
    max_hours: float | None = None
    stalled_minutes: float = DEFAULT_STALLED_MINUTES
    # [cluster] idle_stop_minutes of the same profile: the slaves' own idle stop (0: never)
    idle_stop_minutes: float = DEFAULT_IDLE_STOP_MINUTES
    # [cluster] remote_dir of the same profile: where the budget guard finds the slaves' runs
    remote_dir: str = DEFAULT_REMOTE_DIR
    source: Path | None = None  # the profile file, for messages and relative paths

    def public_key_path(self) -> Path:
        path = Path(self.public_key).expanduser()
        if not path.is_absolute() and self.source is not None:
            path = self.source.parent / path
        return path

    def read_public_key(self) -> str:
        """The public key text (one OpenSSH line); a private key or a missing file is a UserError."""
        path = self.public_key_path()
        where = f"[cloud] public_key in {self.source}" if self.source else "[cloud] public_key"
        text = read_user_file(path, "public key", f" ({where}); make one with ssh-keygen -t ed25519").strip()
        if "PRIVATE KEY" in text:
            raise UserError(f"{path}: this is a private key; {where} must name the .pub file")
        if not re.match(r"^(ssh-rsa|ssh-ed25519|ecdsa-sha2-nistp(256|384|521)) [A-Za-z0-9+/=]+( .*)?$", text):
            raise UserError(f"{path}: not an OpenSSH public key (ssh-ed25519 or ssh-rsa ...); {where}")
        return text.splitlines()[0]


def default_cloud_profile() -> Path:
    return profiles_dir() / "aws-spot.toml"


def load_cloud_settings(path: Path | None) -> CloudSettings:
    """The `[cloud]` table of a profile (default: profiles/aws-spot.toml)."""
    from gputui.profiles import load_profile

    path = path if path is not None else default_cloud_profile()
    profile = load_profile(path)
    table = profile.tables.get("cloud")
    if table is None:
        raise UserError(f"{path}: no [cloud] table; see profiles/aws-spot.toml for one with every key explained")
    region = table.get("region", CLOUD_SECTION.fields["region"].default)
    stray = [z for z in table.get("zones", ()) if not z.startswith(region)]
    if stray:
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "zones", f"{stray[0]!r} is not a zone of region {region!r}")
    if table.get("renew_minutes", 2.0) >= table.get("lease_minutes", 10.0):
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "renew_minutes", "must be shorter than lease_minutes, or a lease could pass between renewals")
    cluster = profile.tables.get("cluster", {})
    stalled = table.get("stalled_minutes", DEFAULT_STALLED_MINUTES)
    join_s = cluster.get("join_timeout", 0.0)
    if stalled and stalled * 60 <= join_s:
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "stalled_minutes", f"must be longer than [cluster] join_timeout ({join_s:g} s), or a node "
            "waiting at the rendezvous counts as stalled; raise it, or set 0 to turn the stop off")
    idle = cluster.get("idle_stop_minutes", DEFAULT_IDLE_STOP_MINUTES)
    remote_dir = cluster.get("remote_dir", DEFAULT_REMOTE_DIR)
    return CloudSettings(source=path, idle_stop_minutes=float(idle), remote_dir=str(remote_dir), **table)
