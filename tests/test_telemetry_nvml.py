"""The NVML source against a fake pynvml (missing functions, NOT_SUPPORTED, no driver) and,
where a GPU and its driver are present, against the real one."""

from __future__ import annotations

import getpass
import json
import os
from pathlib import Path

import pytest

from gputui.model.telemetry import HostState
from gputui.sources.nvml import NvmlSource
from tests.fake_pynvml import (
    NVML_ERROR_DRIVER_NOT_LOADED,
    NVML_ERROR_LIBRARY_NOT_FOUND,
    NVML_ERROR_NO_PERMISSION,
    FakeDevice,
    make_pynvml,
)

GONE_PID = 2**22 + 12345  # above any pid_max default: no such process


def source(module: object) -> NvmlSource:
    return NvmlSource(name="box", module=module)  # type: ignore[arg-type]


def test_reads_every_metric_of_every_gpu() -> None:
    devices = [
        FakeDevice(uuid="GPU-a", processes=[(os.getpid(), 512 * 2**20), (GONE_PID, None)]),
        FakeDevice(name="NVIDIA GeForce RTX 4090", uuid="GPU-b", util=(3, 1), pstate=8, fan=30),
    ]
    nv = make_pynvml(devices)
    snap = source(nv).poll()[0]
    assert snap.state == HostState.OK and snap.message is None and snap.kind == "local"
    assert snap.driver == "550.90.07" and snap.duration_s is not None and snap.mem_total_mib
    a, b = snap.gpus
    assert (a.index, a.name, a.uuid) == (0, "NVIDIA A100-SXM4-80GB", "GPU-a")
    assert (a.util_pct, a.mem_util_pct, a.mem_used_mib, a.mem_total_mib) == (87, 41, 60 * 1024, 80 * 1024)
    assert (a.temperature_c, a.power_w, a.power_limit_w, a.fan_pct) == (65, 312.5, 400, 40)
    assert (a.clock_sm_mhz, a.clock_mem_mhz, a.pcie_rx_kib_s, a.pcie_tx_kib_s) == (1410, 1593, 2048, 512)
    assert (a.pstate, a.ecc_corrected, a.ecc_uncorrected) == ("P0", 3, 0)
    mine, gone = a.processes
    assert mine.pid == os.getpid() and mine.user == getpass.getuser() and mine.gpu_memory_mib == 512
    assert "python" in (mine.name or "") or "pytest" in (mine.name or "")
    assert gone.user is None and gone.gpu_memory_mib is None and gone.name == "/usr/bin/fake-process"
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
    device = FakeDevice(not_supported={"nvmlDeviceGetFanSpeed", "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetPcieThroughput"})
    nv = make_pynvml([device])
    src = source(nv)
    for _ in range(4):
        gpu = src.poll()[0].gpus[0]
        assert gpu.fan_pct is None and gpu.ecc_corrected is None and gpu.ecc_uncorrected is None
        assert gpu.pcie_rx_kib_s is None and gpu.pcie_tx_kib_s is None
        assert gpu.util_pct == 87 and gpu.temperature_c == 65
    assert nv.calls["nvmlDeviceGetFanSpeed"] == 1
    assert nv.calls["nvmlDeviceGetTotalEccErrors"] == 2  # corrected and uncorrected, once each
    assert nv.calls["nvmlDeviceGetUtilizationRates"] == 4


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
        missing={"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetPcieThroughput"},
    )
    gpu = source(nv).poll()[0].gpus[0]
    assert gpu.pcie_rx_kib_s is None and gpu.processes[0].pid == GONE_PID
    assert nv.calls["nvmlDeviceGetComputeRunningProcesses"] == 1


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
