"""The telemetry data model, the simulated source and record/replay (no I/O but temp files)."""

from __future__ import annotations

import dataclasses
import json
from itertools import count
from pathlib import Path

import pytest

from gputui.model.errors import UserError
from gputui.model.telemetry import (
    GPU_METRICS,
    GpuProcess,
    GpuSample,
    History,
    HostSnapshot,
    HostState,
    TelemetryHistory,
    fmt,
    fmt_pair,
    round_from_dict,
    round_to_dict,
)
from gputui.sources.host import CpuTimes, cpu_percent, parse_meminfo, parse_proc_stat_line
from gputui.sources.replay import Recorder, ReplaySource
from gputui.sources.sim import SimSource


def sample_host(time: float = 100.0, util: float | None = 50.0) -> HostSnapshot:
    gpu = GpuSample(index=0, name="GPU", uuid="GPU-1", util_pct=util, mem_used_mib=10, mem_total_mib=40, pstate="P0",
                    ecc_corrected=2, processes=(GpuProcess(pid=7, name="python", user="ann", gpu_memory_mib=None),))
    return HostSnapshot(name="h", state=HostState.OK, time=time, duration_s=0.01, kind="ssh", address="u@h:22",
                        cpu_pct=None, mem_used_mib=1.0, mem_total_mib=2.0, gpus=(gpu,), driver="550")


def test_states_have_the_exact_names() -> None:
    names = {s.value for s in HostState}
    assert {"ok", "connecting", "unreachable", "auth-failed", "host-key-unknown", "host-key-mismatch", "no-nvidia-smi", "error"} <= names
    assert HostState.OK.worked and HostState.NO_DRIVER.worked and not HostState.UNREACHABLE.worked
    assert str(HostState.AUTH_FAILED) == "auth-failed"


def test_snapshots_are_frozen_and_round_trip_through_json() -> None:
    host = sample_host()
    with pytest.raises(dataclasses.FrozenInstanceError):
        host.name = "x"  # type: ignore[misc]
    doc = json.loads(json.dumps(round_to_dict([host], 123.0)))
    assert doc["version"] == 1 and doc["time"] == 123.0
    assert doc["hosts"][0]["state"] == "ok" and doc["hosts"][0]["gpus"][0]["processes"][0]["user"] == "ann"
    assert round_from_dict(doc) == [host]
    with pytest.raises(ValueError, match="version"):
        round_from_dict({"version": 99, "hosts": []})


def test_missing_metrics_show_as_na() -> None:
    gpu = GpuSample(index=1)
    assert all(getattr(gpu, m) is None for m in GPU_METRICS)
    assert fmt(None) == "n/a" and fmt(41.6, "%") == "42%" and fmt(3.14159, " W", 1) == "3.1 W" and fmt("P2") == "P2"
    assert fmt_pair(None, None) == "n/a" and fmt_pair(10, None, " MiB") == "10/n/a MiB"
    assert gpu.mem_pct is None and sample_host().gpus[0].mem_pct == 25.0


def test_history_is_bounded_and_gives_rates() -> None:
    h = History(maxlen=5)
    for t in range(10):
        h.append(float(t), None if t == 7 else float(t * 2))
    assert len(h) == 5 and h.values() == [10.0, 12.0, None, 16.0, 18.0] and h.last == 18.0
    assert h.rate() == pytest.approx(2.0)
    assert h.mean() == pytest.approx(14.0) and h.peak() == 18.0
    assert h.mean(window=1.0) == pytest.approx(17.0)
    empty = History()
    assert empty.last is None and empty.rate() is None and empty.mean() is None


def test_telemetry_history_tracks_every_metric() -> None:
    th = TelemetryHistory(maxlen=3)
    for t in range(5):
        th.update([sample_host(time=float(t), util=float(t * 10))])
    assert th.gpu("h", 0, "util_pct").values() == [20.0, 30.0, 40.0]
    assert th.gpu("h", 0, "ecc_corrected").rate() == 0.0
    assert th.host("h", "mem_used_mib").values() == [1.0, 1.0, 1.0]
    assert len(th.gpu("other", 0, "util_pct")) == 0
    with pytest.raises(KeyError):
        th.gpu("h", 0, "nonsense")


def test_cpu_and_memory_parsing() -> None:
    before = parse_proc_stat_line("cpu  100 0 100 700 100 0 0 0 0 0")
    after = parse_proc_stat_line("cpu  200 0 200 800 100 0 0 0 0 0")
    assert before == CpuTimes(busy=200, total=1000)
    assert cpu_percent(before, after) == pytest.approx(200 / 300 * 100)
    assert cpu_percent(before, before) is None and cpu_percent(None, after) is None
    assert cpu_percent(before, after, min_total=1000) is None
    assert parse_proc_stat_line("intr 1 2 3") is None and parse_proc_stat_line("cpu x y z w") is None
    used, total = parse_meminfo("MemTotal:  2048000 kB\nMemFree: 1 kB\nMemAvailable:  1024000 kB\n")
    assert (used, total) == (1000.0, 2000.0)
    assert parse_meminfo("garbage") == (None, None)


def test_sim_is_seeded_and_follows_the_run() -> None:
    clock = count(1000.0)
    a = SimSource(hosts=3, gpus=2, seed=7, clock=lambda: float(next(clock)))
    clock2 = count(1000.0)
    b = SimSource(hosts=3, gpus=2, seed=7, clock=lambda: float(next(clock2)))
    for _ in range(5):
        assert a.poll() == b.poll()
    assert SimSource(hosts=3, gpus=2, seed=8).poll()[0].gpus[0].power_w != a.poll()[0].gpus[0].power_w

    sim = SimSource(hosts=1, gpus=2, seed=1)
    sim.set_active(0, False)
    for _ in range(30):
        idle = sim.poll()[0]
    sim.set_active(0, True)
    trace = [sim.poll()[0] for _ in range(40)]
    busy = trace[-1]
    g0, g1 = idle.gpus[0], busy.gpus[0]
    assert g0.util_pct < 5 < 85 < g1.util_pct and g0.power_w < g1.power_w and g0.mem_used_mib < g1.mem_used_mib
    assert g0.temperature_c < g1.temperature_c and busy.gpus[0].processes and not idle.gpus[0].processes
    temps = [h.gpus[0].temperature_c for h in trace]
    assert temps[1] < temps[5] < temps[-1]  # temperature follows power with a lag
    assert all(s.state == HostState.OK and s.kind == "sim" for s in trace)


def test_record_and_replay_round_trip(tmp_path: Path) -> None:
    sim = SimSource(hosts=2, gpus=3, seed=3)
    recorder = Recorder(tmp_path / "rec" / "telemetry.jsonl")
    rounds = []
    for t in range(4):
        hosts = sim.poll()
        rounds.append(hosts)
        recorder.write(hosts, float(t))
    recorder.close()
    replay = ReplaySource(tmp_path / "rec" / "telemetry.jsonl")
    assert [replay.poll() for _ in range(4)] == rounds and replay.finished
    assert replay.poll() == rounds[-1]  # holds the last round
    looping = ReplaySource(tmp_path / "rec" / "telemetry.jsonl", loop=True)
    assert [looping.poll() for _ in range(5)][-1] == rounds[0] and not looping.finished


def test_replay_errors_name_the_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(round_to_dict([sample_host()], 1.0)) + "\n{not json\n")
    with pytest.raises(UserError, match=r"bad\.jsonl:2: not a gputui telemetry round"):
        ReplaySource(bad)
    with pytest.raises(UserError, match="not found"):
        ReplaySource(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no round"):
        ReplaySource(tmp_path / "empty.jsonl")


def test_throttle_codes_text_and_slowdowns() -> None:
    from gputui.model.telemetry import THROTTLE_CODES, throttle_codes, throttle_text

    assert throttle_codes(0) == () and throttle_codes(0x1FF) == THROTTLE_CODES and throttle_codes(0x10000) == ()
    assert throttle_codes(0x84) == ("power-cap", "hw-power-brake")
    assert (throttle_text(None), throttle_text(()), throttle_text(("power-cap", "sw-thermal"))) == ("n/a", "-", "power-cap,sw-thermal")
    assert not GpuSample(0, throttle=None).throttled and not GpuSample(0, throttle=()).throttled
    assert not GpuSample(0, throttle=("idle", "app-clocks", "display-clocks")).throttled
    assert all(GpuSample(0, throttle=(code,)).throttled for code in ("power-cap", "hw-slowdown", "sync-boost", "sw-thermal",
                                                                      "hw-thermal", "hw-power-brake"))


def test_new_fields_round_trip_and_old_documents_still_read() -> None:
    from gputui.model.telemetry import GpuProcess

    gpu = GpuSample(0, throttle=("power-cap",), processes=(GpuProcess(7, sm_pct=50.0, cpu_pct=99.5, rss_mib=10.0, running_s=3.0),))
    doc = gpu.to_dict()
    assert doc["throttle"] == ["power-cap"] and doc["processes"][0]["running_s"] == 3.0
    assert GpuSample.from_dict(doc) == gpu
    old = {"index": 1, "util_pct": 5.0, "processes": [{"pid": 3, "name": "x", "user": "u", "gpu_memory_mib": 1.0}]}
    read = GpuSample.from_dict(old)
    assert read.throttle is None and read.processes[0].cpu_pct is None and read.processes[0].pid == 3
    assert GpuSample.from_dict({"index": 0, "throttle": "power-cap"}).throttle is None  # not a list: n/a
