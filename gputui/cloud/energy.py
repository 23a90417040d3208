"""Local GPU energy for the ledger, by the GPU's own energy counter where it has one.

Telemetry hands its snapshots in (or plain readings). NVML's total-energy counter (mJ since
the driver loaded; Volta and later) gives the exact energy between two readings: a line
metered that way says `counter`. Where there is no counter (older GPUs, a counter reset
by a driver reload, the stretch before the first or after the last reading), power draw
is integrated by the trapezoid rule (`trapezoid`): a missing reading (None) or a gap longer
than `max_gap_s` is not guessed, energy is counted only where power was measured.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from gputui.cloud.ledger import Ledger
from gputui.model.cloud import energy_kwh
from gputui.model.telemetry import HostSnapshot

COUNTER = "counter"
TRAPEZOID = "trapezoid"


@dataclass(frozen=True)
class Reading:
    """One moment of one GPU: its power draw and, when read then, its energy counter."""

    time: float
    watts: float | None
    energy_mj: float | None = None


@dataclass(frozen=True)
class EnergySpan:
    """Energy over [start, end], and how it was measured (COUNTER or TRAPEZOID)."""

    start: float
    end: float
    kwh: float
    method: str


def spans(readings: list[Reading], max_gap_s: float = 30.0) -> list[EnergySpan]:
    """The energy of time-ordered readings as consecutive spans, each measured one way.

    Between two counter readings the counter's difference is used (a counter that went
    back, a driver reload, falls back to power); before the first and after the last counter
    reading, power by the trapezoid rule. Adjacent spans of one method are merged.
    """
    if len(readings) < 2:
        return []
    marks = [k for k, r in enumerate(readings) if r.energy_mj is not None]
    pieces: list[EnergySpan] = []

    def by_power(first: int, last: int) -> None:
        if last > first:
            part = readings[first:last + 1]
            pieces.append(EnergySpan(part[0].time, part[-1].time, energy_kwh([(r.time, r.watts) for r in part], max_gap_s),
                                     TRAPEZOID))

    if len(marks) < 2:
        by_power(0, len(readings) - 1)
    else:
        by_power(0, marks[0])
        for a, b in zip(marks, marks[1:]):
            before, after = readings[a].energy_mj, readings[b].energy_mj
            if before is not None and after is not None and after >= before:
                pieces.append(EnergySpan(readings[a].time, readings[b].time, (after - before) / 3.6e9, COUNTER))
            else:
                by_power(a, b)
        by_power(marks[-1], len(readings) - 1)
    merged: list[EnergySpan] = []
    for piece in pieces:
        if merged and merged[-1].method == piece.method and merged[-1].end == piece.start:
            last = merged.pop()
            piece = EnergySpan(last.start, piece.end, last.kwh + piece.kwh, piece.method)
        merged.append(piece)
    return merged


class EnergyMeter:
    """Meters energy per subject ("host/gpuN") and flushes energy cost lines to a ledger."""

    def __init__(self, ledger: Ledger, kwh_price: float, cluster: str = "local", run_id: str | None = None,
                 max_gap_s: float = 30.0, kinds: tuple[str, ...] = ("local",)) -> None:
        self.ledger = ledger
        self.kwh_price = kwh_price
        self.cluster = cluster
        self.run_id = run_id
        self.max_gap_s = max_gap_s
        self.kinds = kinds  # telemetry host kinds whose energy this meter pays for
        self._readings: dict[str, list[Reading]] = {}
        self._lock = threading.Lock()

    def add(self, subject: str, when: float, watts: float | None, energy_mj: float | None = None) -> None:
        with self._lock:
            self._readings.setdefault(subject, []).append(Reading(when, watts, energy_mj))

    def add_snapshot(self, snapshot: HostSnapshot) -> None:
        """Every GPU of a telemetry snapshot of a metered host ("host/gpuN"; no reading, no energy)."""
        if snapshot.kind not in self.kinds:
            return
        for gpu in snapshot.gpus:
            self.add(f"{snapshot.name}/gpu{gpu.index}", snapshot.time, gpu.power_w, gpu.energy_mj)

    def flush(self, final: bool = True) -> float:
        """Write the lines (one per subject and method) for the readings so far; return the kWh written.

        The last reading written stays as the start of the next span, so no interval is lost or
        counted twice. `final=False` (a periodic flush) holds back what follows a GPU's last
        counter reading, so the next flush measures it by the counter too.
        """
        total = 0.0
        with self._lock:
            pending: dict[str, list[Reading]] = {}
            for subject, readings in self._readings.items():
                readings = sorted(readings, key=lambda r: r.time)
                marks = [k for k, r in enumerate(readings) if r.energy_mj is not None]
                cut = marks[-1] if not final and marks else len(readings) - 1
                if cut >= 1:
                    pending[subject] = readings[:cut + 1]
                    self._readings[subject] = readings[cut:]
        for subject, readings in pending.items():
            for span in spans(readings, self.max_gap_s):
                self.ledger.add_energy(subject, self.cluster, self.run_id, span.start, span.end, span.kwh,
                                       self.kwh_price, method=span.method)
                total += span.kwh
        return total
