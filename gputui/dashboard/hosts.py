"""The hosts panel's data: one polling round plus each GPU's recent utilisation, as a frozen frame.

`HostFeed.poll()` blocks (NVML, SSH): the dashboard calls it from a worker thread, and
only one at a time, so the history it keeps is never touched by two threads.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping

from gputui.config.free import FreeRule
from gputui.model.telemetry import HostSnapshot, utilisations
from gputui.monitor.lab import Lab, LabFrame

SPARK_LEN = 60  # samples of utilisation kept per GPU for the sparklines
ENERGY_FLUSH_S = 60.0  # how often metered local GPU energy is written to the ledger


GpuKey = tuple[str, int]  # (host name, GPU index)


Round = dict[str, dict[int, "float | None"]]  # one round's utilisations: host name -> GPU index -> %


class Sparks(Mapping[GpuKey, tuple[float | None, ...]]):
    """Each GPU of the last round's utilisation over the rounds kept, oldest first, put together
    only when asked: a panel asks for the 30 GPUs it shows, not the 2,048 of a lab. Frozen: the
    rounds are a tuple of dicts nobody changes. A GPU missing from a round (its host did not
    answer) has no value for it."""

    def __init__(self, rounds: tuple[Round, ...] = ()) -> None:
        self._rounds = rounds
        self._last: Round = rounds[-1] if rounds else {}

    def __getitem__(self, key: GpuKey) -> tuple[float | None, ...]:
        name, index = key
        if index not in self._last.get(name, ()):
            raise KeyError(key)
        return tuple(r[name][index] for r in self._rounds if index in r.get(name, ()))

    def __iter__(self) -> Iterator[GpuKey]:
        return ((name, index) for name, gpus in self._last.items() for index in gpus)

    def __len__(self) -> int:
        return sum(len(gpus) for gpus in self._last.values())


@dataclass(frozen=True)
class HostsFrame:
    """One round: every host's snapshot, per (host, GPU index) utilisation oldest first, and the
    round's lab (host lines, fleet totals, accounts)."""

    time: float
    hosts: tuple[HostSnapshot, ...]
    util: Mapping[GpuKey, tuple[float | None, ...]] = field(default_factory=dict)
    duration_s: float = 0.0
    lab: LabFrame | None = None

    @property
    def gpu_count(self) -> int:
        return sum(len(h.gpus) for h in self.hosts)


class HostFeed:
    """Polls a telemetry source (Telemetry, SimSource, ReplaySource) and keeps the histories."""

    def __init__(self, source: Any, clock: Callable[[], float] = time.time, spark_len: int = SPARK_LEN,
                 meter: Any = None, rule: FreeRule | None = None) -> None:
        self.source = source
        self.clock = clock
        self._rounds: deque[Round] = deque(maxlen=spark_len)  # each round's utilisations
        self.lab = Lab(rule or FreeRule(), clock)
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
        self._rounds.append({host.name: utilisations(host) for host in hosts})
        if self.meter is not None:
            for host in hosts:
                self.meter.add_snapshot(host)
            if self.clock() - self._flushed >= ENERGY_FLUSH_S:
                self._flush(final=False)
        now = self.clock()
        lab = self.lab.update(hosts, now)
        return HostsFrame(now, tuple(hosts), Sparks(tuple(self._rounds)), time.monotonic() - started, lab)

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
