"""What a dashboard session is made of, from its options: the telemetry source, the cloud
(real or simulated), the training child's command line. No Textual, no torch.

`--demo` swaps everything that needs hardware or an account for the simulations
(gputui.sources.sim, gputui.cloud.sim) while the training stays real: the seed network
on this machine's CPU with the bundled MNIST.
"""

from __future__ import annotations

import base64
import hashlib
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from gputui.dashboard.child import Progress, TrainingChild, program_of, run_argv
from gputui.dashboard.hosts import HostFeed
from gputui.dashboard.cost import SlaveLine
from gputui.model.errors import UserError
from gputui.model.cloud import CloudEvent
from gputui.model.paths import data_home, profiles_dir

if TYPE_CHECKING:
    from gputui.dashboard.slaves import SlaveControl

DEMO_BUDGET_USD = 2.0
DEMO_SSH_CIDR = "198.51.100.7/32"  # a documentation network: the simulated cloud opens nothing
DEMO_AMI = "ami-0123456789abcdef0"
EC2_PACE_S = 15.0  # seconds between cloud polls on EC2 (and on any cloud with no slave up)


@dataclass(frozen=True)
class DashboardOptions:
    """How the dashboard was asked to run."""

    profile: Path
    demo: bool = False
    sim_hosts: int = 3
    sim_gpus: int = 4
    seed: int = 0
    host_interval_s: float = 1.0
    cloud_interval_s: float | None = None  # default: 2 s on the simulated cloud, 15 s on EC2
    train_args: tuple[str, ...] = ()  # extra `gputui run` flags for new runs (tests: a small data set)

    @property
    def cloud_interval(self) -> float:
        if self.cloud_interval_s is not None:
            return self.cloud_interval_s
        return 2.0 if self.demo else EC2_PACE_S

    def cloud_pace(self, slaves: int) -> float:
        """Seconds to the next cloud poll after one that showed `slaves` slaves (any state). The
        demo's simulated cloud is polled every 2 s while it has slaves (one boots in seconds there);
        with none, at EC2's pace: a launch or a stop from here polls at once (SlavesChanged), so
        only a slave started elsewhere waits for it. An interval set on purpose (tests) is kept."""
        if self.cloud_interval_s is None and not slaves:
            return max(self.cloud_interval, EC2_PACE_S)
        return self.cloud_interval


def resolve_profile(path: Path | None) -> Path:
    """The profile to open (default: profiles/local.toml), checked now: a bad one is exit 2."""
    from gputui.config.profile import load_profile

    if path is None:
        path = profiles_dir() / "local.toml"
    path = path.expanduser()
    load_profile(path)
    return path.resolve()


HERE_LOOKED = 64  # at most this many *.toml files of the current directory are looked into


def list_profiles(current: Path | None = None, here: Path | None = None) -> list[Path]:
    """The profiles of the current directory (`here`: a project's own, e.g. train.toml beside
    train.py; only files this account owns, never another account's in a shared directory), the
    ones that ship in profiles/, and the current one, wherever it is."""
    import os

    from gputui.config.profile import looks_like_profile

    found = sorted(p.resolve() for p in profiles_dir().glob("*.toml")) if profiles_dir().is_dir() else []
    try:
        mine = sorted((Path.cwd() if here is None else here).glob("*.toml"))[:HERE_LOOKED]
    except OSError:
        mine = []
    uid = os.getuid() if hasattr(os, "getuid") else None
    own = []
    for path in mine:
        try:
            ours = uid is None or path.stat().st_uid == uid
        except OSError:
            continue
        if ours and path.resolve() not in found and looks_like_profile(path):
            own.append(path.resolve())
    found = own + found
    if current is not None and current.resolve() not in found:
        found.insert(0, current.resolve())
    return found


def demo_public_key() -> Path:
    """A public-key line for the simulated cloud's key pair (no private key exists for it)."""
    path = data_home() / "demo" / "demo_ed25519.pub"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        body = base64.b64encode(b"\x00\x00\x00\x0bssh-ed25519\x00\x00\x00\x20" + hashlib.sha256(b"gputui demo").digest())
        path.write_text(f"ssh-ed25519 {body.decode()} gputui-demo (simulated cloud only)\n", encoding="utf-8")
    return path


class Backend:
    """Builds the parts of a session. Tests pass their own source, provider and clocks
    (`stop_clock`: what a stopping training child measures its SIGKILL bound with)."""

    def __init__(self, options: DashboardOptions, clock: Callable[[], float] = time.time,
                 host_source: Any = None, provider: Any = None,
                 stop_clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options
        self.clock = clock
        self.stop_clock = stop_clock
        self._host_source = host_source
        self._provider = provider
        self.child_progress: Progress | None = None  # the app listens to its training children's stops

    def with_profile(self, profile: Path) -> "Backend":
        other = Backend(replace(self.options, profile=profile), self.clock, self._host_source, self._provider,
                        self.stop_clock)
        other.child_progress = self.child_progress
        return other

    @property
    def profile(self) -> Path:
        return self.options.profile

    def host_feed(self, slaves: Callable[[], Sequence[SlaveLine]] = tuple) -> HostFeed:
        """The telemetry feed (blocks: NVML and SSH start here). `slaves`: the demo shows them as hosts."""
        o = self.options
        if self._host_source is not None:
            source = self._host_source
        elif o.demo:
            from gputui.dashboard.demo import DemoSource
            from gputui.sources.sim import SimSource

            sim = SimSource(hosts=o.sim_hosts, gpus=o.sim_gpus, seed=o.seed, clock=self.clock)
            source = DemoSource(sim, slaves, o.seed, self.clock)
        else:
            from gputui.monitor.polling import TelemetryRequest, build_source

            source = build_source(TelemetryRequest(profile=o.profile))
        return HostFeed(source, clock=self.clock, meter=self.energy_meter(), rule=self.free_rule())

    def free_rule(self) -> Any:
        """The profile's [free] rule (the defaults where the profile cannot be read: the run says why)."""
        from gputui.config.profile import load_profile
        from gputui.model.errors import GputuiError
        from gputui.monitor.lab import free_rule

        try:
            return free_rule(load_profile(self.profile))
        except GputuiError:
            return free_rule(None)

    def energy_meter(self) -> Any:
        """Meters this machine's GPU energy into the ledger when [cloud] sets kwh_price; else None."""
        from gputui.model.errors import GputuiError

        try:
            settings = self.cloud_settings()
        except GputuiError:
            return None  # a broken [cloud] table is reported by the cost panel
        if settings is None or settings.kwh_price is None:
            return None
        from gputui.cloud.energy import EnergyMeter
        from gputui.cloud.ledger import Ledger

        return EnergyMeter(Ledger(), settings.kwh_price)

    def cloud_settings(self) -> Any:
        """The [cloud] settings, or None when the profile has none (and this is no demo)."""
        from gputui.cloud.settings import CloudSettings, load_cloud_settings
        from gputui.config.profile import load_profile

        has_cloud = "cloud" in load_profile(self.profile).tables
        if not has_cloud and not self.options.demo:
            return None
        settings = load_cloud_settings(self.profile) if has_cloud else CloudSettings(budget_usd=DEMO_BUDGET_USD, ami=DEMO_AMI)
        if self.options.demo:
            settings = replace(settings, public_key=str(demo_public_key()), ssh_cidr=settings.ssh_cidr or DEMO_SSH_CIDR)
        return settings

    def slaves(self, say: Callable[[str], None], listener: Callable[[CloudEvent], None]) -> "SlaveControl | None":
        """The cluster's slaves (blocks: opens the ledger, maybe boto3); None without [cloud]."""
        from gputui.cloud.ledger import Ledger
        from gputui.cloud.context import CloudContext
        from gputui.cloud.provider import check_cluster_name, default_owner
        from gputui.cloud.factory import make_provider
        from gputui.dashboard.slaves import SlaveControl

        settings = self.cloud_settings()
        if settings is None:
            return None
        provider = self._provider
        if provider is None:
            provider = make_provider("sim" if self.options.demo else None, settings.region)
        cluster = check_cluster_name("demo" if self.options.demo else self.profile.stem)
        ctx = CloudContext(settings, provider, Ledger(), cluster, default_owner(), clock=self.clock, listener=listener)
        return SlaveControl(ctx, self.options.cloud_interval, say)

    def training_argv(self, resume: bool) -> list[str]:
        extra = [] if resume else list(self.options.train_args)  # a resumed run keeps its own settings
        if self.options.demo:  # a program has no evaluations of gputui's to ask for (it refuses the flag)
            evals = not resume and not program_of(self.profile)
            extra = ["--device", "cpu"] + (["--evals-per-epoch", "4"] if evals else []) + extra
        return run_argv(None if resume else self.profile, resume, extra)

    def training_child(self, resume: bool) -> TrainingChild:
        return TrainingChild(self.training_argv(resume), on_progress=self.child_progress, clock=self.stop_clock)


def check_options(options: DashboardOptions) -> None:
    if not 1 <= options.sim_hosts <= 1024 or not 0 <= options.sim_gpus <= 16:
        raise UserError("the demo simulates 1 to 1024 hosts of 0 to 16 GPUs")
