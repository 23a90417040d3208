"""The hosts panel's data: one polling round plus each GPU's recent utilisation, as a frozen frame.

`HostFeed.poll()` blocks (NVML, SSH): the dashboard calls it from a worker thread, and
only one at a time, so the history it keeps is never touched by two threads.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from gputui.model.telemetry import HostSnapshot, TelemetryHistory

SPARK_LEN = 60  # samples of utilisation kept per GPU for the sparklines
ENERGY_FLUSH_S = 60.0  # how often metered local GPU energy is written to the ledger


@dataclass(frozen=True)
class HostsFrame:
    """One round: every host's snapshot and, per (host, GPU index), utilisation oldest first."""

    time: float
    hosts: tuple[HostSnapshot, ...]
    util: Mapping[tuple[str, int], tuple[float | None, ...]] = field(default_factory=dict)
    duration_s: float = 0.0

    @property
    def gpu_count(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)


class HostFeed:
    """Polls a telemetry source (Telemetry, SimSource, ReplaySource) and keeps the histories."""

    def __init__(self, source: Any, clock: Callable[[], float] = time.time, spark_len: int = SPARK_LEN,
                 meter: Any = None) -> None:
        self.source = source
        self.clock = clock
        self.history = TelemetryHistory(maxlen=spark_len)
        self.meter = meter  # a gputui.cloud.energy.EnergyMeter when the profile prices electricity
        self._flushed = clock()
        self.process_sm = False  # wanted: each process's SM % (while the process table is open)
        self._process_sm: bool | None = None  # what the source was last told

    def want_process_sm(self, on: bool) -> None:
        """Ask for per-process SM % from the next poll on (any thread: the poll applies it)."""
        self.process_sm = on

    def poll(self) -> HostsFrame:
        from gputui.monitor.polling import poll_round

        started = time.monotonic()
        wanted = self.process_sm
        if wanted != self._process_sm:
            tell = getattr(self.source, "want_process_sm", None)
            if tell is not None:
                tell(wanted)
            self._process_sm = wanted
        hosts = poll_round(self.source)
        self.history.update(hosts)
        if self.meter is not None:
            for host in hosts:
                self.meter.add_snapshot(host)
            if self.clock() - self._flushed >= ENERGY_FLUSH_S:
                self._flush(final=False)
        util = {(h.name, g.index): tuple(self.history.gpu(h.name, g.index, "util_pct").values())
                for h in hosts for g in h.gpus}
        return HostsFrame(self.clock(), tuple(hosts), util, time.monotonic() - started)

    def training(self, active: bool) -> None:
        """Tell a simulation whether our run is active (its first host then works hard)."""
        set_active = getattr(self.source, "set_active", None)
        if set_active is not None:
            set_active(0, active)

    def _flush(self, final: bool = True) -> None:
        """Write the metered energy; a periodic flush (final=False) keeps the counter's spans whole."""
        from gputui.model.errors import GputuiError

        self._flushed = self.clock()
        try:
            self.meter.flush(final=final)
        except GputuiError:
            pass  # the ledger is unavailable: energy is an estimate, the panel goes on

    def close(self) -> None:
        if self.meter is not None:
            self._flush()
        self.source.close()
