"""Local GPU energy: NVML's energy counter where the GPU has one (exact), the trapezoid rule
over power samples where it has not (older GPUs, remote hosts), and the ledger says which."""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import replace
from pathlib import Path

import pytest

from gputui.cli import main
from gputui.cloud.energy import COUNTER, TRAPEZOID, EnergyMeter, Reading, spans
from gputui.cloud.ledger import Ledger
from gputui.model.cloud import energy_kwh
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState
from gputui.sources.nvml import ENERGY_EVERY_S, NvmlSource
from tests.fake_pynvml import FakeDevice, make_pynvml

T0 = 1_800_000_000.0
MJ_PER_KWH = 3.6e9


class Rig:
    """A fake-NVML host whose polls are fed to a meter at a driven clock (one poll a second)."""

    def __init__(self, devices: list[FakeDevice], meter: EnergyMeter) -> None:
        self.devices = devices
        self.now = 0.0
        self.source = NvmlSource(name="ws", module=make_pynvml(devices), clock=lambda: self.now)  # type: ignore[arg-type]
        self.meter = meter

    def poll(self) -> HostSnapshot:
        snap = replace(self.source.poll()[0], time=T0 + self.now)
        self.meter.add_snapshot(snap)
        return snap

    def run(self, seconds: int, burst_mj: int = 0) -> None:
        """One poll a second; between polls each GPU draws its power, plus `burst_mj` that no
        power sample sees (a spike between two readings)."""
        for _ in range(seconds):
            for device in self.devices:
                device.advance(1.0)
                device.energy_mj += burst_mj
            self.now += 1.0
            self.poll()


def lines(ledger: Ledger) -> list[tuple[str, float, float, float, str | None]]:
    """(subject, start, end, kWh, method) of every energy line, in order."""
    raw = sqlite3.connect(ledger.path)
    try:
        return [tuple(r) for r in raw.execute(  # type: ignore[misc]
            "SELECT subject, start, \"end\", quantity, method FROM cost_lines WHERE kind = 'energy' ORDER BY start, id")]
    finally:
        raw.close()


def test_a_gpu_with_an_energy_counter_is_metered_by_it_exactly(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    volta = FakeDevice(uuid="GPU-volta", power_mw=100_000)
    rig = Rig([volta], EnergyMeter(ledger, kwh_price=0.30))
    start_mj = volta.energy_mj
    rig.poll()
    rig.run(int(2 * ENERGY_EVERY_S), burst_mj=50_000)  # 100 W seen, 150 W drawn
    rig.meter.flush(final=False)
    (line,) = lines(ledger)
    subject, start, end, kwh, method = line
    assert (subject, method) == ("ws/gpu0", COUNTER)
    assert (start, end) == (T0, T0 + 2 * ENERGY_EVERY_S)  # from one counter reading to another
    assert kwh == pytest.approx((volta.energy_mj - start_mj) / MJ_PER_KWH, rel=1e-12)  # 150 W x 60 s
    assert kwh == pytest.approx(150.0 * 2 * ENERGY_EVERY_S / 3.6e6)  # the power samples would say 100 W
    ledger.close()


def test_a_gpu_without_one_is_metered_by_the_trapezoid_and_the_ledger_says_so(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    kepler = FakeDevice(uuid="GPU-kepler", power_mw=100_000, not_supported={"nvmlDeviceGetTotalEnergyConsumption"})
    rig = Rig([kepler], EnergyMeter(ledger, kwh_price=0.30))
    rig.poll()
    rig.run(60, burst_mj=50_000)
    rig.meter.flush(final=False)  # nothing to hold back: no counter reading
    (line,) = lines(ledger)
    assert line[4] == TRAPEZOID and (line[1], line[2]) == (T0, T0 + 60)
    assert line[3] == pytest.approx(100.0 * 60 / 3.6e6)  # what power saw, the burst unseen
    ledger.close()


def test_periodic_flushes_stay_on_the_counter_and_the_final_one_loses_nothing(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    volta = FakeDevice(uuid="GPU-volta", power_mw=200_000)
    rig = Rig([volta], EnergyMeter(ledger, kwh_price=0.30))
    rig.poll()
    rig.run(45)  # counter read at 0 and 30: 31..45 follow the last reading
    rig.meter.flush(final=False)
    assert [(l[1] - T0, l[2] - T0, l[4]) for l in lines(ledger)] == [(0, 30, COUNTER)]  # the tail waits
    rig.run(20)  # the counter again at 60
    rig.meter.flush(final=False)
    rig.run(5)
    rig.meter.flush()  # the last one (closing): the tail after the counter's last reading by power
    got = [(l[1] - T0, l[2] - T0, l[4]) for l in lines(ledger)]
    assert got == [(0, 30, COUNTER), (30, 60, COUNTER), (60, 70, TRAPEZOID)]  # no gap, no overlap
    assert sum(l[3] for l in lines(ledger)) == pytest.approx(200.0 * 70 / 3.6e6)
    ledger.close()


def test_a_counter_that_goes_back_falls_back_to_power_for_that_stretch() -> None:
    readings = [Reading(0.0, 100.0, 1_000_000.0), Reading(10.0, 100.0, 2_000_000.0),
                Reading(20.0, 100.0, 5_000.0), Reading(30.0, 100.0, 1_005_000.0)]  # a driver reload at ~15 s
    got = spans(readings)
    assert [(s.start, s.end, s.method) for s in got] == [(0, 10, COUNTER), (10, 20, TRAPEZOID), (20, 30, COUNTER)]
    assert [s.kwh for s in got] == pytest.approx([1e6 / MJ_PER_KWH, 1000 / 3.6e6, 1e6 / MJ_PER_KWH])


def test_remote_and_counterless_snapshots_integrate_power_as_before(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "l.sqlite3")
    meter = EnergyMeter(ledger, kwh_price=0.25, kinds=("local", "ssh"))
    samples = [(5000.0 + 30 * k, 200.0 + 10 * (k % 3)) for k in range(121)]
    for when, watts in samples:
        meter.add_snapshot(HostSnapshot("far", HostState("ok"), when, kind="ssh", gpus=(GpuSample(0, power_w=watts),)))
    assert meter.flush() == pytest.approx(energy_kwh(samples))
    assert [l[4] for l in lines(ledger)] == [TRAPEZOID]
    ledger.close()


def test_gputui_cost_names_the_energy_method(capsys: pytest.CaptureFixture[str]) -> None:
    now = time.time()
    with Ledger() as ledger:
        ledger.add_energy("ws/gpu0", "local", None, now - 600, now - 300, 0.05, 0.30, method=COUNTER)
        ledger.add_energy("ws/gpu1", "local", None, now - 600, now - 300, 0.04, 0.30, method=TRAPEZOID)
    assert main(["cost", "--json"]) == 0
    (cluster,) = json.loads(capsys.readouterr().out)["clusters"]
    assert cluster["energy_methods"] == [COUNTER, TRAPEZOID]
    assert main(["cost"]) == 0
    assert "energy by counter, trapezoid" in capsys.readouterr().out
