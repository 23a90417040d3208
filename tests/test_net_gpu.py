"""`gputui run --device auto` for the networks on a machine of several GPUs: the least used free
GPU by the profile's [free], matched to torch's index by UUID (gputui.jobs.gpus.net_gpu,
gputui.jobs.run._free_gpu). No GPU here: torch's CUDA calls and NVML's answer are stand-ins."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from gputui.config.free import FreeRule
from gputui.jobs import gpus, run as run_job
from gputui.model.telemetry import GpuProcess, GpuSample

UUIDS = ["GPU-aaaa0000-0000-0000-0000-000000000000", "GPU-bbbb0000-0000-0000-0000-000000000000",
         "GPU-cccc0000-0000-0000-0000-000000000000"]


def nvml(*gpus: tuple[float, float, bool]) -> list[GpuSample]:
    """NVML's GPUs in its (PCI) order: (utilisation, memory in use MiB, a process on it)."""
    return [GpuSample(i, name=f"H100 #{i}", uuid=UUIDS[i], util_pct=u, mem_used_mib=m, mem_total_mib=81559.0,
                      processes=(GpuProcess(100 + i, "python train.py", "bob", m),) if p else ())
            for i, (u, m, p) in enumerate(gpus)]


def test_the_least_used_free_gpu_is_taken_by_torchs_index() -> None:
    found = nvml((0.0, 100.0, True), (0.0, 600.0, False), (0.0, 300.0, False))  # GPU 0: least used, but held
    torch_order = [UUIDS[2].lower(), UUIDS[0][4:], UUIDS[1]]  # another order; with and without "GPU-"
    index, why = gpus.net_gpu(torch_order, read=lambda: (found, None))  # type: ignore[misc]
    assert index == 0  # NVML's GPU 2 (300 MiB) is torch's cuda:0
    assert why.startswith("auto: 2 of 3 GPUs free by [free]") and "GPU 2 (cuda:0, H100 #2)" in why


def test_with_none_free_the_least_used_is_taken_and_said() -> None:
    found = nvml((95.0, 60000.0, True), (40.0, 20000.0, True), (99.0, 70000.0, True))
    picked = gpus.net_gpu(UUIDS, read=lambda: (found, None))
    assert picked is not None and picked[0] == 1 and "none of 3 GPUs free" in picked[1]
    strict = gpus.net_gpu(UUIDS, read=lambda: (nvml((0.0, 600.0, False), (0.0, 900.0, False)), None),
                          rule=FreeRule(max_memory_mib=700.0))
    assert strict is not None and strict[0] == 0 and "1 of 2 GPUs free" in strict[1]


def test_gpus_nvml_cannot_match_leave_torchs_default() -> None:
    assert gpus.net_gpu(UUIDS, read=lambda: ([], "no driver")) is None
    other = [GpuSample(0, uuid="GPU-ffff"), GpuSample(1, uuid=None)]
    assert gpus.net_gpu(UUIDS, read=lambda: (other, None)) is None


def fake_cuda(monkeypatch: pytest.MonkeyPatch, count: int) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=UUIDS[::-1][i][4:]))


def test_a_run_on_several_gpus_takes_the_free_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    fake_cuda(monkeypatch, 3)
    found = nvml((0.0, 200.0, False), (90.0, 50000.0, True), (95.0, 60000.0, True))
    monkeypatch.setattr(gpus, "local_gpus", lambda: (found, None))
    device, why = run_job._free_gpu(torch.device("cuda", 0), "auto: CUDA (H100)", tmp_path / "profile.toml")
    assert device == torch.device("cuda", 2)  # torch sees them in reverse: NVML's GPU 0 is cuda:2
    assert "GPU 0 (cuda:2" in why


def test_a_failing_nvml_keeps_cuda_0_and_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    fake_cuda(monkeypatch, 2)

    def broken() -> Any:
        raise RuntimeError("NVML_ERROR_UNINITIALIZED")

    monkeypatch.setattr(gpus, "local_gpus", broken)
    device, why = run_job._free_gpu(torch.device("cuda", 0), "auto: CUDA (H100)", tmp_path / "profile.toml")
    assert device == torch.device("cuda", 0)
    assert why == "auto: CUDA (H100); the free GPU could not be chosen (RuntimeError: NVML_ERROR_UNINITIALIZED)"
    fake_cuda(monkeypatch, 1)  # one GPU: nothing to choose, NVML not even asked
    assert run_job._free_gpu(torch.device("cuda", 0), "auto: CUDA (H100)", tmp_path / "p.toml") == (
        torch.device("cuda", 0), "auto: CUDA (H100)")
