"""The `[cloud]` profile table: where and what to launch, and what it may cost.

Declared once, as `CloudSettings`; torch-free and boto3-free. Loading it from a profile (and
its checks against the other tables) is gputui.cloud.settings.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.config.hosts import USER_NAME, check_jump
from gputui.config.schema import REQUIRED, key, section_of
from gputui.model.errors import UserError, read_user_file

# [cluster]'s defaults, written here since a cloud's slaves follow them too (a [cluster] table holds
# its [cloud], so config.cluster imports this module, never the other way):
# [cluster] idle_stop_minutes' default: also the slaves' own idle stop when a profile has [cloud] but no [cluster]
DEFAULT_IDLE_STOP_MINUTES = 30.0
# [cluster] remote_dir's default: where gputui goes on a slave, its nodes' GPUTUI_HOME in `home/` below it
DEFAULT_REMOTE_DIR = "~/.gputui-cluster"

REGION_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")
ZONE_RE = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d[a-z]$")
TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9-]+$")
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


@dataclass(frozen=True)
class CloudSettings:
    """A validated `[cloud]` table with defaults filled in."""

    budget_usd: float = key("float", "Spending cap of this cluster in dollars; slaves are stopped when it is reached.",
                            None, attr=REQUIRED, minimum=0, exclusive_minimum=True)
    region: str = key("str", "AWS region to launch in.", "us-east-1", check=_check_region)
    zones: tuple[str, ...] = key("str_list", "Allowed availability zones, tried cheapest first (default: all of the "
                                 "region).", (), check=_check_zones)
    instance_type: str = key("str", "EC2 instance type of each slave, e.g. g4dn.xlarge.", "g4dn.xlarge",
                             check=_check_type)
    count: int = key("int", "Slaves `gputui cloud up` launches (--count overrides).", 1, minimum=1, maximum=256)
    ami: str = key("str", "Machine image: an AMI id, or ssm:<public parameter path> resolved through SSM at launch.",
                   "ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
                   check=_check_ami)
    ssh_user: str = key("str", "User name to SSH in as (depends on the image).", "ubuntu",
                        check=lambda v: None if USER_NAME.match(v) else "a user name")
    trust_on_first_use: bool = key("bool", "Accept a slave's first SSH host key unchecked (default: no: it is learnt "
                                   "from the instance's console output, where cloud-init prints it, and pinned).", False)
    public_key: str = key("str", "Your SSH public key file, imported as the EC2 key pair (relative to the profile).",
                          "~/.ssh/id_ed25519.pub")
    proxy_jump: str | None = key("str", "Jump hosts in front of the slaves, as OpenSSH's ProxyJump: "
                                 "\"user@bastion:port\", comma-separated for a chain (default: none).", None,
                                 check=check_jump)
    ssh_cidr: str | None = key("str", "Who may reach port 22 (default: this machine's public address as /32, found "
                               "at launch).", None, check=_check_cidr)
    max_price: float | None = key("float", "Highest spot price to pay, $/h per instance (default: the on-demand "
                                  "price).", None, minimum=0, exclusive_minimum=True)
    on_demand_fallback: bool = key("bool", "Launch on-demand instances when no allowed zone has spot capacity.", False)
    kwh_price: float | None = key("float", "Electricity price in $/kWh, to cost the energy of local GPUs.", None,
                                  minimum=0)
    on_demand_price: float | None = key("float", "On-demand $/h of instance_type here (default: the AWS Pricing API's "
                                        "price for the region, cached a day; gputui's dated us-east-1 table when it "
                                        "cannot be asked).", None, minimum=0, exclusive_minimum=True)
    lease_minutes: float = key("float", "Each slave powers itself off (and terminates) once its lease passes: this "
                               "long after the master's last renewal, sooner when the budget would run out first.",
                               10.0, minimum=2, maximum=1440)
    renew_minutes: float = key("float", "How often the master (the budget guard, `gputui run`, the dashboard) renews "
                               "the lease; shorter than lease_minutes.", 2.0, minimum=0.1, maximum=720)
    max_hours: float | None = key("float", "Each slave powers itself off this many hours after launch, whatever the "
                                  "master says (default: no limit).", None, minimum=0, exclusive_minimum=True)
    stalled_minutes: float = key(
        "float", "Each slave powers itself off (ended_by self:stalled) when a run is registered on it (a cluster "
        "node or sweep worker) and no training step has been seen for this long: a hung collective keeps the GPU "
        "busy and the master renewing the lease, but makes no step. Steps are seen through a heartbeat file the "
        "node writes in its gputui home (<remote_dir>/home/heartbeat, at most once a second); for a sweep, a "
        "worker waiting between trials makes no step either. Keep it longer than [cluster] join_timeout, the "
        "longest a node waits at the rendezvous before its first step (0: never).",
        DEFAULT_STALLED_MINUTES, minimum=0, maximum=10080)
    # Not keys of [cloud]:
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


CLOUD_SECTION = section_of(CloudSettings, "cloud",
                           "Spot slaves on AWS EC2: where, what, and what they may cost (gputui cloud ...).",
                           required=("budget_usd",))
