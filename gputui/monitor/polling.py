"""Telemetry orchestration: which sources a request means, and what a round's outcome is.

`gputui monitor` and `gputui doctor` (and, later, the dashboard) build their sources here;
sources live in gputui.sources and know nothing of flags or profiles.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Sequence

from gputui.model.errors import UserError
from gputui.sources.hostspecs import check_unique, hosts_from_profile, parse_host_arg
from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostSnapshot


@dataclass(frozen=True)
class TelemetryRequest:
    """What to watch: the local GPUs, remote hosts, or a simulation or a recording instead."""

    profile: Path | None = None
    hosts: tuple[str, ...] = ()  # --host [user@]address[:port]
    identity: Path | None = None  # --identity, for the --host hosts
    trust_on_first_use: bool = False
    local: bool = True
    sim: int | None = None  # simulated hosts
    sim_gpus: int = 4
    seed: int = 0
    replay: Path | None = None

    def check(self) -> None:
        """Refuse impossible combinations (exit 2)."""
        if self.sim is not None and self.replay is not None:
            raise UserError("--sim and --replay are two sources: choose one")
        if (self.sim is not None or self.replay is not None) and (self.hosts or self.profile):
            raise UserError("--sim and --replay replace the real sources: drop --host/--profile")
        if self.sim is not None and not 1 <= self.sim <= 1024:
            raise UserError(f"--sim {self.sim}: expected 1 to 1024 hosts")
        if not 0 <= self.sim_gpus <= 64:
            raise UserError(f"--sim-gpus {self.sim_gpus}: expected 0 to 64 GPUs")
        if self.identity is not None and not self.hosts:
            raise UserError("--identity applies to --host hosts: add --host user@address")


def remote_specs(request: TelemetryRequest) -> list[HostSpec]:
    """The remote hosts of the profile and of --host, checked (exit 2 on any problem)."""
    specs: list[HostSpec] = []
    if request.profile is not None:
        from gputui.config.profile import load_profile

        specs.extend(hosts_from_profile(load_profile(request.profile)))
    identity = None
    if request.identity is not None:
        identity = request.identity.expanduser()
        if not identity.is_file():
            raise UserError(f"--identity {request.identity}: no such file")
    for text in request.hosts:
        specs.append(replace(parse_host_arg(text), identity_file=identity))
    return check_unique(specs)


class Telemetry:
    """The local host (NVML) and the remote hosts (SSH), polled as one round."""

    def __init__(self, local: Any, remote: Any) -> None:
        self.local = local
        self.remote = remote

    def poll(self, settle: bool = False, wait: float | None = None) -> list[HostSnapshot]:
        """One round: local first (milliseconds), then the remote hosts (see SshSource.poll)."""
        hosts: list[HostSnapshot] = []
        if self.local is not None:
            hosts.extend(self.local.poll())
        if self.remote is not None:
            hosts.extend(self.remote.poll(settle=settle, wait=wait))
        return hosts

    def close(self) -> None:
        for source in (self.local, self.remote):
            if source is not None:
                source.close()

    def want_process_sm(self, on: bool) -> None:
        """A process table is shown: read each local process's SM % (costs 1.7 ms per GPU with
        processes) and each remote process's `ps` row at every poll."""
        if self.local is not None:
            self.local.process_sm = on
        tell = getattr(self.remote, "want_process_sm", None)
        if tell is not None:
            tell(on)

    def kill(self, host: str, pid: int, signal_name: str, process: Any = None) -> Any:
        """Signal a process on one of these hosts: a KillResult (gputui.monitor.processes), never an exception."""
        from gputui.monitor.processes import KillResult, kill_local, kill_remote

        if self.local is not None and host == self.local.name:
            return kill_local(pid, signal_name, process, host=host)
        for remote in getattr(self.remote, "hosts", ()):
            if remote.spec.name == host:
                return kill_remote(remote, pid, signal_name, process)
        return KillResult(False, f"kill refused: no host named {host}")


def kill(source: Any, host: str, pid: int, signal_name: str, process: Any = None) -> Any:
    """Signal a process on a host of any source (a replay refuses; a simulation pretends)."""
    from gputui.monitor.processes import KillResult, signal_name as check

    try:
        sig = check(signal_name)
    except ValueError as exc:
        return KillResult(False, f"kill refused: {exc}")
    if isinstance(source, Telemetry):
        return source.kill(host, pid, sig, process)
    sim_kill = getattr(source, "kill", None)
    if sim_kill is not None:
        ok, line = sim_kill(host, pid, sig)
        return KillResult(ok, line)
    return KillResult(False, f"kill refused: {host} is a recording; nothing runs there")


def build_source(request: TelemetryRequest) -> Any:
    """The source a request means: Telemetry, SimSource or ReplaySource."""
    request.check()
    if request.sim is not None:
        from gputui.sources.sim import SimSource

        return SimSource(hosts=request.sim, gpus=request.sim_gpus, seed=request.seed)
    if request.replay is not None:
        from gputui.sources.replay import ReplaySource

        return ReplaySource(request.replay)
    specs = remote_specs(request)
    remote = None
    if specs:
        from gputui.sources.hostkeys import SshOptions
        from gputui.sources.ssh import SshSource

        remote = SshSource(specs, SshOptions(trust_on_first_use=request.trust_on_first_use))
    local = None
    if request.local:
        from gputui.sources.nvml import NvmlSource

        local = NvmlSource()
    if local is None and remote is None:
        raise UserError("nothing to watch: --no-local needs --host or a profile with [[hosts]]")
    return Telemetry(local, remote)


def round_exit_code(hosts: Sequence[HostSnapshot]) -> int:
    """0 while the local part worked (or, without one, any host did); else 1."""
    local = [h for h in hosts if h.kind == "local"]
    if any(h.state.worked for h in local):
        return 0
    return 0 if any(h.state.worked for h in hosts) else 1


def poll_round(source: Any, settle: bool = False, wait: float | None = None) -> list[HostSnapshot]:
    """One round from any source; `settle` and `wait` matter to remote hosts only."""
    if isinstance(source, Telemetry):
        return source.poll(settle=settle, wait=wait)
    return list(source.poll())
