"""Local GPU energy for the ledger: NVML power draw x time x $/kWh.

Telemetry hands readings in (any object with `time` and `power_w`, or plain numbers);
the meter integrates them per GPU and writes energy lines when flushed. A missing
reading (None) is not guessed: energy is counted only where power was measured.
"""

from __future__ import annotations

import threading
from typing import Any

from gputui.cloud.ledger import Ledger
from gputui.model.cloud import energy_kwh


class EnergyMeter:
    """Integrates power per subject ("host/gpuN") and flushes energy cost lines to a ledger."""

    def __init__(self, ledger: Ledger, kwh_price: float, cluster: str = "local", run_id: str | None = None,
                 max_gap_s: float = 30.0) -> None:
        self.ledger = ledger
        self.kwh_price = kwh_price
        self.cluster = cluster
        self.run_id = run_id
        self.max_gap_s = max_gap_s
        self._samples: dict[str, list[tuple[float, float | None]]] = {}
        self._lock = threading.Lock()

    def add(self, subject: str, when: float, watts: float | None) -> None:
        with self._lock:
            self._samples.setdefault(subject, []).append((when, watts))

    def add_sample(self, subject: str, sample: Any) -> None:
        """A telemetry reading with `time` and `power_w` attributes (power_w may be None)."""
        self.add(subject, float(sample.time), getattr(sample, "power_w", None))

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
