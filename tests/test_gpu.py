"""GPU paths: skipped cleanly where no CUDA device is visible (CI never has one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .conftest import json_lines, run_cli

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_auto_picks_cuda_and_trains(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--json", "--data", str(small_data), "--epochs", "1", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert events[0]["device"].startswith("cuda")
    assert events[-1]["event"] == "done"


def test_dataparallel(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--json", "--data", str(small_data), "--epochs", "1", "--strategy", "dataparallel",
                     "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert events[0]["strategy"] == "dataparallel"
    assert events[0]["gpus"] == list(range(torch.cuda.device_count()))


def test_ddp_nccl_one_process_per_gpu(small_data: Path, tmp_path: Path) -> None:
    result = run_cli("run", "--json", "--data", str(small_data), "--epochs", "1", "--strategy", "ddp",
                     "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert events[0]["world_size"] == torch.cuda.device_count()
    assert events[-1]["event"] == "done"


def test_cuda_matches_cpu_to_tolerance(small_data: Path, tmp_path: Path) -> None:
    common = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--seed", "5"]
    cpu = run_cli(*common, "--device", "cpu", "--run-dir", str(tmp_path / "cpu"))
    gpu = run_cli(*common, "--device", "cuda", "--run-dir", str(tmp_path / "gpu"))
    assert cpu.returncode == 0 and gpu.returncode == 0
    a = torch.load(tmp_path / "cpu" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "gpu" / "ckpt.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-2, atol=1e-3, msg=key)
