"""Local GPU energy for the ledger: NVML power draw x time x $/kWh.

Telemetry hands its snapshots in (or plain readings); the meter integrates power per GPU
and writes energy lines when flushed. A missing
reading (None) is not guessed: energy is counted only where power was measured.
"""

from __future__ import annotations

import threading
from gputui.cloud.ledger import Ledger
from gputui.model.cloud import energy_kwh
from gputui.model.telemetry import HostSnapshot


class EnergyMeter:
    """Integrates power per subject ("host/gpuN") and flushes energy cost lines to a ledger."""

    def __init__(self, ledger: Ledger, kwh_price: float, cluster: str = "local", run_id: str | None = None,
                 max_gap_s: float = 30.0, kinds: tuple[str, ...] = ("local",)) -> None:
        self.ledger = ledger
        self.kwh_price = kwh_price
        self.cluster = cluster
        self.run_id = run_id
        self.max_gap_s = max_gap_s
        self.kinds = kinds  # telemetry host kinds whose energy this meter pays for
        self._samples: dict[str, list[tuple[float, float | None]]] = {}
        self._lock = threading.Lock()

    def add(self, subject: str, when: float, watts: float | None) -> None:
        with self._lock:
            self._samples.setdefault(subject, []).append((when, watts))

    def add_snapshot(self, snapshot: HostSnapshot) -> None:
        """Every GPU of a telemetry snapshot of a metered host ("host/gpuN"; no reading, no energy)."""
        if snapshot.kind not in self.kinds:
            return
        for gpu in snapshot.gpus:
            self.add(f"{snapshot.name}/gpu{gpu.index}", snapshot.time, gpu.power_w)

    def flush(self) -> float:
        """Write one line per subject for the readings so far; return the kWh written.

        The last reading stays as the start of the next span, so no interval is lost or
        counted twice.
        """
        total = 0.0
        with self._lock:
            pending = {s: list(v) for s, v in self._samples.items() if len(v) >= 2}
            for subject, samples in pending.items():
                self._samples[subject] = samples[-1:]
        for subject, samples in pending.items():
            kwh = energy_kwh(samples, self.max_gap_s)
            self.ledger.add_energy(subject, self.cluster, self.run_id, samples[0][0], samples[-1][0], kwh, self.kwh_price)
            total += kwh
        return total
