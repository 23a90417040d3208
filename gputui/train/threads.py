"""How many CPU threads torch gets: from what is free on this machine, not from its core count.

torch's default (one OpenMP thread per core) collapses on a busy machine: its threads spin at
every barrier on cores other processes hold, and a run beside two CPU hogs trained 5-10x slower
than with one thread. So the count is what is free for us: the usable CPUs (cores, this
process's affinity, the cgroup's CPU quota) less what other processes keep busy (sampled from
/proc/stat, this process's own CPU time taken out; the 1-minute load average where there is no
/proc/stat), shared out over the workers (DDP ranks, sweep workers), at least one each.

Threads that wait are left to spin (OpenMP's default): with OMP_WAIT_POLICY=PASSIVE two threads
on an idle 2-core VM trained the fast net at 11-13k samples/s against 22.5k spinning, and beside
CPU hogs the count chosen here is what avoids the collapse (benchmarks/bench_threads.py measures
both; a user's own OMP_WAIT_POLICY is passed on untouched). The count reaches the processes
gputui starts (torchrun's ranks, sweep workers) as OMP_NUM_THREADS (`child_env`), read before
torch starts its pool, with the reason beside it for the rank's start event.

`choose_threads` is the one place the count is decided; it takes a `CpuView` so the rule is
tested with made-up machines. This module imports torch only in `rank_fields`, inside a rank.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

SAMPLE_S = 0.3  # the shortest window other processes' CPU use is sampled over


@dataclass(frozen=True)
class CpuView:
    """What this machine offers us now. None: not known here."""

    cores: int  # os.cpu_count()
    affinity: int | None = None  # CPUs this process may run on (sched_getaffinity)
    quota: float | None = None  # the cgroup's CPU quota, in CPUs (cpu.max, or cfs_quota_us / cfs_period_us)
    busy: float | None = None  # CPUs other processes keep busy
    busy_how: str = "sampled"  # how `busy` was measured, for the why

    def usable(self) -> tuple[float, str]:
        """The CPUs we may use at most, and what bounds them."""
        usable: float = max(1, self.cores)
        what = f"{self.cores} cores"
        if self.affinity is not None and self.affinity < usable:
            usable, what = self.affinity, f"affinity {self.affinity} of {self.cores} cores"
        if self.quota is not None and self.quota < usable:
            usable, what = self.quota, f"cgroup quota {self.quota:g} CPUs"
        return usable, what


def choose_threads(workers: int = 1, view: CpuView | None = None) -> tuple[int, str]:
    """Torch threads for each of `workers` processes (the machine as it is now unless `view`
    is given), and why, in a few words for the run's start event."""
    if view is None:
        view = machine()
    workers = max(1, workers)
    usable, what = view.usable()
    free = usable if view.busy is None else min(usable, max(0.0, usable - view.busy))
    # Half a CPU free or more counts as one (a thread loses little on a CPU that is mostly free),
    # but never past the usable CPUs: a cgroup quota of 1.5 CPUs throttles a second thread.
    n = max(1, min(int(math.floor(usable / workers)), int(math.floor(free / workers + 0.5))))
    others = "others' use not known" if view.busy is None else f"others busy {view.busy:.1f} ({view.busy_how})"
    share = f" over {workers} workers" if workers > 1 else ""
    return n, f"{free:.1f} of {what} free, {others}{share}"


def bounds() -> CpuView:
    """What bounds this process's CPUs (cores, affinity, the cgroup's quota), others' use not
    looked at: it does not change while a run goes on."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    return CpuView(cores=os.cpu_count() or 1, affinity=affinity, quota=cgroup_quota())


def machine(since: "Sample | None" = None, sample_s: float = SAMPLE_S) -> CpuView:
    """This machine now. `since`: a Sample taken earlier (e.g. before torch's import), so the
    window costs no extra wait once it is `sample_s` long."""
    busy, how = others_busy(since, sample_s)
    return replace(bounds(), busy=busy, busy_how=how)


class Governor:
    """Keeps a run's thread count fitting what is free while it trains: a machine that was idle
    at the start and gets busy later (another job, a second run) would otherwise collapse the
    run's spinning threads onto cores others hold. `tick()` is cheap (a read of /proc/stat);
    it re-decides at most every `every_s` seconds over the window since its last decision,
    with this process's own CPU time taken out, and returns the new count when it changed."""

    def __init__(self, threads: int, workers: int = 1, every_s: float = 5.0,
                 view: CpuView | None = None, sample: "Callable[[], Sample] | None" = None) -> None:
        self.threads = threads
        self.workers = workers
        self.every_s = every_s
        self._base = view if view is not None else bounds()  # what others use changes; these do not
        self._sample = sample or take_sample
        self._since = self._sample()
        self.changes = 0

    def tick(self) -> int | None:
        now = self._sample()
        if now.at - self._since.at < self.every_s:
            return None
        busy = busy_between(self._since, now)
        self._since = now
        if busy is None:
            return None
        n, _why = choose_threads(self.workers, CpuView(self._base.cores, self._base.affinity, self._base.quota, busy))
        if n == self.threads:
            return None
        self.threads, self.changes = n, self.changes + 1
        return n


# -- what other processes use ----------------------------------------------------------------

@dataclass(frozen=True)
class Sample:
    """The machine's busy CPU seconds and this process's own, at one moment."""

    at: float
    busy_s: float | None  # None: no /proc/stat
    own_s: float


def take_sample(stat: Path = Path("/proc/stat")) -> Sample:
    """Now. This process's own time counts its waited-for children (a bench's DDP rows)."""
    t = os.times()
    return Sample(time.monotonic(), _busy_seconds(stat), t.user + t.system + t.children_user + t.children_system)


def _busy_seconds(stat: Path) -> float | None:
    """CPU seconds spent busy on the whole machine since boot: all but idle and iowait (steal
    counts: it is CPU the hypervisor gave away)."""
    try:
        first = stat.read_text(encoding="ascii").splitlines()[0].split()
        ticks = [int(v) for v in first[1:]]
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    if first[0] != "cpu" or len(ticks) < 4:
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    guest = sum(ticks[8:10])  # guest time is already counted in user and nice
    return (sum(ticks) - guest - idle) / hz


def busy_between(a: Sample, b: Sample) -> float | None:
    """CPUs other processes kept busy between two samples (this process's own use taken out)."""
    if a.busy_s is None or b.busy_s is None or b.at <= a.at:
        return None
    return max(0.0, (b.busy_s - a.busy_s - (b.own_s - a.own_s)) / (b.at - a.at))


def others_busy(since: Sample | None = None, sample_s: float = SAMPLE_S) -> tuple[float | None, str]:
    """CPUs other processes keep busy now, and how that was measured."""
    first = since if since is not None else take_sample()
    wait = first.at + sample_s - time.monotonic()
    if first.busy_s is not None and wait > 0:
        time.sleep(wait)
    busy = busy_between(first, take_sample())
    if busy is not None:
        return busy, "sampled"
    try:
        return max(0.0, os.getloadavg()[0]), "load average"
    except OSError:
        return None, "not known"


# -- the cgroup's CPU quota ------------------------------------------------------------------

def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 cpu.max ("max 100000", "150000 100000") in CPUs; None without a limit."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us in CPUs; None without a limit (-1)."""
    try:
        quota, period = int(quota_text.strip()), int(period_text.strip())
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_quota(root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """The tightest CPU quota over this process's cgroup and its parents (v2, else v1), in CPUs."""
    try:
        lines = proc_cgroup.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        lines = []
    found: list[float] = []
    for line in lines:
        hierarchy, _sep, rest = line.partition(":")
        controllers, _sep, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # v2
            for folder in _folders(root, path):
                value = parse_cpu_max(_read(folder / "cpu.max"))
                if value is not None:
                    found.append(value)
        elif "cpu" in controllers.split(","):  # v1
            for mount in (root / controllers, root / "cpu", root / "cpu,cpuacct"):
                for folder in _folders(mount, path):
                    value = parse_cfs(_read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us"))
                    if value is not None:
                        found.append(value)
    return min(found) if found else None


def _folders(mount: Path, path: str) -> list[Path]:
    """The cgroup's folder and its parents under `mount` (a container sees its own as the root)."""
    parts = [p for p in path.strip().split("/") if p and p != ".."]
    return [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return ""


# -- the environment of trainer processes ----------------------------------------------------

WHY_ENV = "GPUTUI_THREADS_WHY"  # why a child was given its OMP_NUM_THREADS (for its start event)


def child_env(env: Mapping[str, str], threads: int, why: str) -> dict[str, str]:
    """The environment of a trainer process gputui starts: its torch threads as OMP_NUM_THREADS
    (read when torch starts its pool; torchrun would set 1) and why."""
    out = dict(env)
    out["OMP_NUM_THREADS"] = str(threads)
    out[WHY_ENV] = why
    return out


def run_threads(setting: int | None, env: Mapping[str, str], workers: int = 1,
                view: CpuView | None = None) -> tuple[int, str]:
    """Threads for a training process, and why: the setting (--threads, the profile), else the
    OMP_NUM_THREADS its parent or the user gave it, else what is free (`choose_threads`)."""
    if setting:
        return setting, "set by --threads or the profile"
    given = env.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) > 0:
        return int(given), env.get(WHY_ENV) or "OMP_NUM_THREADS"
    return choose_threads(workers, view)


def too_many_threads(setting: int, workers: int = 1, view: CpuView | None = None) -> str | None:
    """A warning when a thread count someone set (--threads, the profile) gives this machine's
    usable CPUs more threads than they can run at once (what others use aside: that changes),
    else None. torch's threads spin and wait on each other: a run slows down many times."""
    workers = max(1, workers)
    usable, what = (view if view is not None else bounds()).usable()
    if setting * workers <= usable:
        return None
    each = f" in each of {workers} processes" if workers > 1 else ""
    return (f"{setting} threads{each} (--threads or the profile) are more than the {what} here: they wait on "
            "each other and the run slows down; leave threads unset and gputui picks what is free")


def rank_fields(setting: int | None, env: Mapping[str, str]) -> dict[str, object]:
    """A DDP rank's threads and why, for its start event: torch's count now (the setting, else the
    OMP_NUM_THREADS its launcher chose; torch is imported by then)."""
    import torch

    why = "set by --threads or the profile" if setting else env.get(WHY_ENV) or "torch's default"
    return {"threads": torch.get_num_threads(), "threads_why": why}
