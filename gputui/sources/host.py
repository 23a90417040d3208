"""Host CPU and memory: local through psutil, remote from /proc text; the CPU maths both share."""

from __future__ import annotations

import time
from dataclasses import dataclass

# Below this many seconds of CPU time (all cores) between two readings, a percentage is noise.
MIN_CPU_WINDOW_S = 0.05
# The first reading waits at most this long for a second one (so `gputui monitor --once` has a CPU %).
FIRST_SAMPLE_WAIT_S = 0.5
FIRST_SAMPLE_STEP_S = 0.02


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative CPU time of a host: busy and total, in any one unit (seconds or jiffies)."""

    busy: float
    total: float


def cpu_percent(before: CpuTimes | None, after: CpuTimes | None, min_total: float = 0.0) -> float | None:
    """Busy share of the CPU time between two readings, in %, or None if too short to tell."""
    if before is None or after is None:
        return None
    total = after.total - before.total
    if total <= min_total or total <= 0:
        return None
    return max(0.0, min(100.0, 100.0 * (after.busy - before.busy) / total))


def parse_proc_stat_line(line: str) -> CpuTimes | None:
    """The `cpu ...` line of /proc/stat (jiffies): idle and iowait count as not busy."""
    parts = line.split()
    if len(parts) < 5 or parts[0] != "cpu":
        return None
    try:
        values = [float(v) for v in parts[1:]]
    except ValueError:
        return None
    # user nice system idle iowait irq softirq steal guest guest_nice; guest* are already in user/nice
    counted = values[:8]
    idle = counted[3] + (counted[4] if len(counted) > 4 else 0.0)
    total = sum(counted)
    return CpuTimes(busy=total - idle, total=total)


def parse_meminfo(text: str) -> tuple[float | None, float | None]:
    """(used MiB, total MiB) from /proc/meminfo text; used = MemTotal - MemAvailable."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        fields = rest.split()
        if key in ("MemTotal", "MemAvailable", "MemFree") and fields:
            try:
                values[key] = float(fields[0]) / 1024.0  # kB -> MiB
            except ValueError:
                continue
    total = values.get("MemTotal")
    available = values.get("MemAvailable", values.get("MemFree"))
    if total is None:
        return None, None
    return (None if available is None else total - available), total


class LocalHost:
    """CPU % since the previous reading and memory of this machine, through psutil.

    The first `sample()` comes right after the reading taken at construction, too soon for a
    percentage: it takes readings a short interval apart (at most FIRST_SAMPLE_WAIT_S) until the
    window is long enough, so a single poll (`gputui monitor --once`) shows the CPU % too."""

    def __init__(self, first_wait_s: float = FIRST_SAMPLE_WAIT_S) -> None:
        import psutil

        self._psutil = psutil
        self._last = self._times()
        self._first_wait_s = first_wait_s
        self._settled = False  # a percentage was given once: later samples never wait

    def _times(self) -> CpuTimes | None:
        try:
            t = self._psutil.cpu_times()
        except Exception:  # noqa: BLE001 - a host metric is never worth an exception
            return None
        idle = t.idle + getattr(t, "iowait", 0.0)
        total = sum(t)
        # guest time is already counted in user/nice on Linux
        total -= getattr(t, "guest", 0.0) + getattr(t, "guest_nice", 0.0)
        return CpuTimes(busy=total - idle, total=total)

    def sample(self) -> tuple[float | None, float | None, float | None]:
        """(CPU %, memory used MiB, memory total MiB); None for what cannot be read."""
        now = self._times()
        cpu = cpu_percent(self._last, now, MIN_CPU_WINDOW_S)
        if cpu is None and not self._settled and self._last is not None and now is not None:
            deadline = time.monotonic() + self._first_wait_s
            while cpu is None and now is not None and time.monotonic() < deadline:
                time.sleep(FIRST_SAMPLE_STEP_S)
                now = self._times()
                cpu = cpu_percent(self._last, now, MIN_CPU_WINDOW_S)
        self._settled = self._settled or cpu is not None
        if cpu is not None or self._last is None:
            self._last = now  # keep the older reading until the window is long enough
        used: float | None
        total: float | None
        try:
            vm = self._psutil.virtual_memory()
            used, total = (vm.total - vm.available) / 2**20, vm.total / 2**20
        except Exception:  # noqa: BLE001
            used = total = None
        return cpu, used, total
