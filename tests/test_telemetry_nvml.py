"""The NVML source against a fake pynvml (missing functions, NOT_SUPPORTED, no driver) and,
where a GPU and its driver are present, against the real one."""

from __future__ import annotations

import getpass
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import pytest

from gputui.model.telemetry import HostState
from gputui.sources.nvml import ENERGY_EVERY_S, NvmlSource
from gputui.sources.nvsmi import GPU_FIELDS, parse_report
from tests.fake_pynvml import (
    H100_LATENCY_S,
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    FakeDevice,
    h100_from_reference,
    make_pynvml,
)
from tests.sshd_fixture import NVSMI_DATA

H100 = NVSMI_DATA / "h100-r580-recorded"
MIB = 2**20

GONE_PID = 2**22 + 12345  # above any pid_max default: no such process


def source(module: object) -> NvmlSource:
    return NvmlSource(name="box", module=module)  # type: ignore[arg-type]


def test_reads_every_metric_of_every_gpu() -> None:
    devices = [
        FakeDevice(uuid="GPU-a", processes=[(os.getpid(), 512 * 2**20), (GONE_PID, None)]),
        FakeDevice(name="NVIDIA GeForce RTX 4090", uuid="GPU-b", util=(3, 1), pstate=8, fan=30),
    ]
    nv = make_pynvml(devices)
    src = source(nv)
    first = src.poll()[0].gpus[0]
    assert (first.pcie_rx_kib_s, first.pcie_tx_kib_s) == (None, None)  # a rate needs two readings
    devices[0].advance(2.0, tx_bytes_s=512 * 1024, rx_bytes_s=2048 * 1024)
    snap = src.poll()[0]
    assert snap.state == HostState.OK and snap.message is None and snap.kind == "local"
    assert snap.driver == "550.90.07" and snap.duration_s is not None and snap.mem_total_mib
    a, b = snap.gpus
    assert (a.index, a.name, a.uuid) == (0, "NVIDIA A100-SXM4-80GB", "GPU-a")
    assert (a.util_pct, a.mem_util_pct, a.mem_used_mib, a.mem_total_mib) == (87, 41, 60 * 1024, 80 * 1024)
    assert (a.temperature_c, a.power_w, a.power_limit_w, a.fan_pct) == (65, 312.5, 400, 40)
    assert (a.clock_sm_mhz, a.clock_mem_mhz, a.pcie_rx_kib_s, a.pcie_tx_kib_s) == (1410, 1593, 2048, 512)
    assert (a.pstate, a.ecc_corrected, a.ecc_uncorrected, a.throttle) == ("P0", 3, 0, ())
    mine, gone = a.processes
    assert mine.pid == os.getpid() and mine.user == getpass.getuser() and mine.gpu_memory_mib == 512
    assert "python" in (mine.name or "") or "pytest" in (mine.name or "")
    assert mine.rss_mib and mine.rss_mib > 1 and mine.running_s is not None and mine.running_s > 0
    assert mine.cpu_pct is not None and mine.cpu_pct >= 0 and mine.sm_pct is None  # SM % only when asked for
    assert gone.user is None and gone.gpu_memory_mib is None and gone.name == "/usr/bin/fake-process"
    assert (gone.cpu_pct, gone.rss_mib, gone.running_s) == (None, None, None)
    assert (b.name, b.pstate, b.util_pct, b.processes) == ("NVIDIA GeForce RTX 4090", "P8", 3, ())


def test_init_once_handles_kept_and_shutdown_on_close() -> None:
    nv = make_pynvml([FakeDevice(), FakeDevice()])
    src = source(nv)
    for _ in range(3):
        src.poll()
    assert nv.calls["nvmlInit"] == 1 and nv.calls["nvmlDeviceGetHandleByIndex"] == 2
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 6  # one pass per poll over both GPUs
    src.close()
    src.close()
    assert nv.calls["nvmlShutdown"] == 1 and not nv.state["init"]


def test_unsupported_calls_are_probed_once_and_read_as_none() -> None:
    device = FakeDevice(not_supported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEccErrors", "pcie_counters",
                                       "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"})
    nv = make_pynvml([device])
    src = source(nv)
    for _ in range(4):
        device.advance(1.0, 1e6, 1e6)
        gpu = src.poll()[0].gpus[0]
        assert gpu.fan_pct is None and gpu.ecc_corrected is None and gpu.ecc_uncorrected is None
        assert gpu.pcie_rx_kib_s is None and gpu.pcie_tx_kib_s is None and gpu.throttle is None
        assert gpu.util_pct == 87 and gpu.temperature_c == 65
    assert nv.calls["nvmlDeviceGetFanSpeed"] == 1
    assert nv.calls["nvmlDeviceGetTotalEccErrors"] == 2  # corrected and uncorrected, once each
    assert nv.calls["nvmlDeviceGetFieldValues"] == 1  # the GPU has no PCIe counters: asked once
    assert nv.calls["nvmlDeviceGetCurrentClocksEventReasons"] == nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 1
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 4
    assert nv.calls["nvmlDeviceGetPcieThroughput"] == 0  # never the 20 ms call as a fallback


def test_old_driver_without_v3_process_call_falls_back_and_remembers() -> None:
    device = FakeDevice(processes=[(GONE_PID, 2**30)])
    nv = make_pynvml([device], unlinked={"nvmlDeviceGetComputeRunningProcesses_v3"})
    src = source(nv)
    for _ in range(3):
        (proc,) = src.poll()[0].gpus[0].processes
        assert proc.pid == GONE_PID and proc.gpu_memory_mib == 1024
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses_v3"] == 1
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses_v2"] == 3


def test_old_pynvml_lacking_functions() -> None:
    nv = make_pynvml(
        [FakeDevice(processes=[(GONE_PID, 2**20)])],
        missing={"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
                 "nvmlDeviceGetFieldValues", "nvmlDeviceGetCurrentClocksEventReasons"},
    )
    src = source(nv)
    gpu = src.poll()[0].gpus[0]
    gpu = src.poll()[0].gpus[0]
    assert gpu.pcie_rx_kib_s is None and gpu.processes[0].pid == GONE_PID
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses"] == 2
    assert gpu.throttle == () and nv.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2  # the pre-R535 name


def test_a_lost_gpu_reads_none_and_is_asked_again() -> None:
    device = FakeDevice()
    nv = make_pynvml([device])
    src = source(nv)
    device.lost = True
    gpu = src.poll()[0].gpus[0]
    assert gpu.util_pct is None and gpu.name is None and gpu.index == 0
    device.lost = False
    assert src.poll()[0].gpus[0].util_pct == 87  # a transient error is not cached


@pytest.mark.parametrize(
    ("error", "state", "words"),
    [
        (NVML_ERROR_LIBRARY_NOT_FOUND, HostState.NO_DRIVER, "no NVIDIA driver"),
        (NVML_ERROR_DRIVER_NOT_LOADED, HostState.NO_DRIVER, "not loaded"),
        (NVML_ERROR_NO_PERMISSION, HostState.ERROR, "permission"),
    ],
)
def test_no_driver_is_a_state_not_an_exception(error: int, state: HostState, words: str) -> None:
    src = source(make_pynvml([], init_error=error))
    snap = src.poll()[0]
    assert snap.state == state and words in (snap.message or "") and snap.gpus == ()
    assert snap.mem_total_mib is not None  # the host part still works
    src.close()


def test_driver_without_gpus() -> None:
    snap = source(make_pynvml([])).poll()[0]
    assert snap.state == HostState.OK and snap.message == "no GPU" and snap.gpus == ()


def test_real_pynvml_never_raises() -> None:
    """Whatever this machine has (no driver here), the real module gives a state."""
    src = NvmlSource()
    snap = src.poll()[0]
    src.close()
    assert snap.state in (HostState.OK, HostState.NO_DRIVER, HostState.ERROR)
    assert snap.state.worked or snap.message


def _real_gpus() -> int:
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return int(count)
    except Exception:  # noqa: BLE001
        return 0


@pytest.mark.gpu
@pytest.mark.skipif(_real_gpus() == 0, reason="no NVIDIA GPU and driver here")
def test_real_driver_reads_gpus(tmp_path: Path) -> None:
    """On a GPU machine: read the real GPUs and record what was read (GPUTUI_NVML_RECORD)."""
    src = NvmlSource()
    snaps = [src.poll()[0] for _ in range(3)]
    src.close()
    snap = snaps[-1]
    assert snap.state == HostState.OK and snap.driver and snap.gpus
    for gpu in snap.gpus:
        assert gpu.name and gpu.uuid and gpu.mem_total_mib and gpu.mem_total_mib > 0
        assert gpu.temperature_c is None or 0 < gpu.temperature_c < 120
    out = Path(os.environ.get("GPUTUI_NVML_RECORD", tmp_path / "nvml.json"))
    out.write_text(json.dumps([s.to_dict() for s in snaps], indent=2))


# -- what a poll costs: the calls made, priced with the H100's measured latencies -----------

STATIC_CALLS = {"nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetEnforcedPowerLimit"}
PER_POLL_CALLS = {
    "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetFieldValues",
    "nvmlDeviceGetPerformanceState", "nvmlDeviceGetTemperature", "nvmlDeviceGetFanSpeed", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetCurrentClocksEventReasons",
}
BUDGET_S_PER_GPU = 2e-3  # issue 14's target for one GPU's share of a poll


def busy_host(n: int = 8) -> list[FakeDevice]:
    """n GPUs each running one training process (this one, so psutil can read it)."""
    return [FakeDevice(uuid=f"GPU-{i}", processes=[(os.getpid(), 2**30)], process_sm={os.getpid(): 90}) for i in range(n)]


def one_poll(src: NvmlSource, nv: object) -> Counter[str]:
    before = Counter(nv.calls)  # type: ignore[attr-defined]
    src.poll()
    return Counter(nv.calls) - before  # type: ignore[attr-defined]


def modelled_cost_s(calls: Counter[str]) -> float:
    return sum(H100_LATENCY_S[name] * n for name, n in calls.items())


def test_a_poll_makes_only_the_cheap_calls_and_reads_static_fields_once() -> None:
    """The CI guard of the 2 ms/GPU target: which calls a poll makes, priced at the H100's
    measured latency per call (benchmarks/bench_nvml_poll.py --fake measures the wall time).

    The energy counter (3.0 ms a call) is read on the first poll and then once every
    ENERGY_EVERY_S (30 s) per GPU: at the dashboard's one poll a second, that adds 0.1 ms a GPU
    on average, and the average poll stays within half the budget."""
    devices = busy_host()
    nv = make_pynvml(devices, latency=H100_LATENCY_S)
    now = [0.0]
    src = NvmlSource(name="box", module=nv, clock=lambda: now[0])  # type: ignore[arg-type]
    first = one_poll(src, nv)
    assert {name: first[name] for name in STATIC_CALLS} == {name: 8 for name in STATIC_CALLS}
    assert first["nvmlDeviceGetTotalEnergyConsumption"] == 8
    window = [first]
    for _ in range(int(ENERGY_EVERY_S) - 1):  # one poll a second until the counter is due again
        now[0] += 1.0
        calls = one_poll(src, nv)
        window.append(calls)
        assert set(calls) == PER_POLL_CALLS, set(calls) ^ PER_POLL_CALLS
        assert calls["nvmlDeviceGetFieldValues"] == 8  # both PCIe directions in one call per GPU
        assert calls["nvmlDeviceGetPcieThroughput"] == calls["nvmlDeviceGetTotalEnergyConsumption"] == 0
        assert calls["nvmlDeviceGetProcessUtilization"] == 0  # 1.7 ms: only for a process table
        assert modelled_cost_s(calls) / 8 <= BUDGET_S_PER_GPU / 2, modelled_cost_s(calls)
    now[0] += 1.0
    due = one_poll(src, nv)
    assert set(due) == PER_POLL_CALLS | {"nvmlDeviceGetTotalEnergyConsumption"}, set(due) ^ PER_POLL_CALLS
    assert due["nvmlDeviceGetTotalEnergyConsumption"] == 8  # once per GPU, not more
    steady = window[1:] + [due]  # one interval of polls, one of them reading the counter
    assert sum(modelled_cost_s(c) for c in steady) / len(steady) / 8 <= BUDGET_S_PER_GPU / 2


def test_the_energy_counter_is_read_when_due_and_dropped_where_unsupported() -> None:
    volta, kepler = FakeDevice(uuid="GPU-volta"), FakeDevice(uuid="GPU-kepler",
                                                             not_supported={"nvmlDeviceGetTotalEnergyConsumption"})
    nv = make_pynvml([volta, kepler])
    now = [0.0]
    src = NvmlSource(name="box", module=nv, clock=lambda: now[0])  # type: ignore[arg-type]
    a, b = src.poll()[0].gpus
    assert a.energy_mj == 5_000_000_000 and b.energy_mj is None
    volta.advance(ENERGY_EVERY_S)
    now[0] += ENERGY_EVERY_S / 2
    assert src.poll()[0].gpus[0].energy_mj is None  # not due yet: not read
    now[0] += ENERGY_EVERY_S / 2
    a, b = src.poll()[0].gpus
    assert a.energy_mj == 5_000_000_000 + 312_500 * ENERGY_EVERY_S and b.energy_mj is None
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == 2 + 1  # the old GPU was asked once
    off = make_pynvml([FakeDevice()])
    NvmlSource(name="box", module=off, energy_every_s=None).poll()  # type: ignore[arg-type]
    assert off.calls["nvmlDeviceGetTotalEnergyConsumption"] == 0


def test_process_sm_is_read_only_when_asked_and_only_for_busy_gpus() -> None:
    devices = busy_host(2) + [FakeDevice(uuid="GPU-idle")]
    nv = make_pynvml(devices, latency=H100_LATENCY_S)
    src = NvmlSource(name="box", module=nv, process_sm=True)  # type: ignore[arg-type]
    src.poll()
    calls = one_poll(src, nv)
    assert calls["nvmlDeviceGetProcessUtilization"] == 2  # not for the idle GPU
    gpus = src.poll()[0].gpus
    assert [p.sm_pct for g in gpus for p in g.processes] == [90, 90]
    devices[0].process_sm.clear()  # no sample since the last poll: NVML says NOT_FOUND
    assert src.poll()[0].gpus[0].processes[0].sm_pct is None
    devices[0].process_sm[os.getpid()] = 40
    assert src.poll()[0].gpus[0].processes[0].sm_pct == 40  # NOT_FOUND was not taken for "unsupported"
    # what the table costs: the busy GPUs pay the 1.7 ms call (reported, not the 2 ms target)
    assert modelled_cost_s(calls) > 2 * 1.674e-3


def test_h100_memory_used_agrees_with_nvidia_smi_through_the_v2_call() -> None:
    """The H100's numbers (nvidia-smi -q -x during training): NVML v2 says what nvidia-smi and
    the SSH path say; v1 (a driver without v2) counts the 480 MiB reserve, as gputui did."""
    device = h100_from_reference(H100 / "nvidia-smi-q.xml")
    recorded_fields = tuple(f for f in GPU_FIELDS if f != "clocks_event_reasons.active")  # as that poll asked
    ssh = parse_report((H100 / "ssh-poll-output.txt").read_text(), recorded_fields).gpus[0]
    xml_used = float(str(ET.parse(H100 / "nvidia-smi-q.xml").getroot().findtext("gpu/fb_memory_usage/used")).split()[0])
    nv = make_pynvml([device], driver="580.159.04")
    src = source(nv)
    for _ in range(2):
        gpu = src.poll()[0].gpus[0]
        assert gpu.mem_used_mib is not None and ssh.mem_used_mib is not None
        assert abs(gpu.mem_used_mib - ssh.mem_used_mib) < 1 and abs(gpu.mem_used_mib - xml_used) < 1
        assert gpu.mem_total_mib == ssh.mem_total_mib == 81559 and gpu.fan_pct is None
    assert nv.calls["nvmlDeviceGetMemoryInfo_v2"] == 2 and nv.calls["nvmlDeviceGetMemoryInfo"] == 0
    recorded = json.loads((H100 / "monitor-once-training.json").read_text())["hosts"][0]["gpus"][0]["mem_used_mib"]
    for old in (make_pynvml([device], unlinked={"nvmlDeviceGetMemoryInfo_v2"}),  # a driver before v2
                make_pynvml([device], missing={"nvmlMemory_v2"})):  # a pynvml before v2
        src = source(old)
        for _ in range(3):
            v1 = src.poll()[0].gpus[0].mem_used_mib
            assert v1 is not None and abs(v1 - recorded) < 1  # 1100.8: the v1 reading of that H100
        assert old.calls["nvmlDeviceGetMemoryInfo"] == 3 and old.calls["nvmlDeviceGetMemoryInfo_v2"] <= 1  # probed once


def test_pcie_rates_come_from_the_byte_counters() -> None:
    device = FakeDevice()
    nv = make_pynvml([device])
    src = source(nv)
    assert src.poll()[0].gpus[0].pcie_rx_kib_s is None  # the first poll has nothing to compare with
    device.advance(0.5, tx_bytes_s=10 * MIB, rx_bytes_s=3 * MIB)
    gpu = src.poll()[0].gpus[0]
    assert (gpu.pcie_tx_kib_s, gpu.pcie_rx_kib_s) == (10 * 1024, 3 * 1024)
    device.pcie_bytes = (0, 0)  # the driver was reloaded: counters start again
    device.advance(1.0, 0, 0)
    assert src.poll()[0].gpus[0].pcie_rx_kib_s is None
    device.advance(1.0, tx_bytes_s=MIB, rx_bytes_s=2 * MIB)
    assert src.poll()[0].gpus[0].pcie_rx_kib_s == 2048
    assert nv.calls["nvmlDeviceGetPcieThroughput"] == 0


def test_throttle_reasons_are_short_codes() -> None:
    devices = [FakeDevice(reasons=0x4 | 0x20), FakeDevice(reasons=0x1), FakeDevice(reasons=0x48), FakeDevice(reasons=0x10 | 0x2)]
    gpus = source(make_pynvml(devices)).poll()[0].gpus
    assert [g.throttle for g in gpus] == [("power-cap", "sw-thermal"), ("idle",), ("hw-slowdown", "hw-thermal"),
                                         ("app-clocks", "sync-boost")]
    assert [g.throttled for g in gpus] == [True, False, True, True]
    old = make_pynvml([FakeDevice(reasons=0x4)], unlinked={"nvmlDeviceGetCurrentClocksEventReasons"})
    src = source(old)
    for _ in range(2):
        assert src.poll()[0].gpus[0].throttle == ("power-cap",)
    assert old.calls["nvmlDeviceGetCurrentClocksEventReasons"] == 1 and old.calls["nvmlDeviceGetCurrentClocksThrottleReasons"] == 2


def test_a_process_cpu_share_tells_a_busy_process_from_an_idle_one() -> None:
    import psutil

    from tests.proc_support import wait_until

    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    idle = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        busy = psutil.Process(burner.pid)
        wait_until(lambda: sum(busy.cpu_times()[:2]) >= 1.0, 120, "the busy loop to use 1 s of CPU")
        device = FakeDevice(processes=[(burner.pid, MIB), (idle.pid, MIB)])
        hot, cold = source(make_pynvml([device])).poll()[0].gpus[0].processes
        assert hot.cpu_pct is not None and cold.cpu_pct is not None
        # A busy loop against a process that only started: no absolute share (a loaded machine gives
        # the loop a small one), but at least twice the idle one's.
        assert hot.cpu_pct > 0 and hot.cpu_pct > 2 * cold.cpu_pct, (hot, cold)
        assert hot.running_s is not None and hot.running_s >= 1.0
    finally:
        burner.kill()
        idle.kill()
        burner.wait(30)
        idle.wait(30)
