"""GPU paths: skipped cleanly where no CUDA device is visible (CI never has one)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from . import gpu_runs
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


def _sgd_run(data: Path, run_dir: Path, *flags: str) -> list[dict]:
    return gpu_runs.sgd_run(data, run_dir, *flags, batch=gpu_runs.SMALL_BATCH)


def test_cuda_matches_cpu_to_tolerance(small_data: Path, tmp_path: Path) -> None:
    """The same run on the CPU and on CUDA: every step event's loss within 1e-3 (relative), and the
    final weights within 2e-3: float rounding only."""
    cpu = _sgd_run(small_data, tmp_path / "cpu", "--device", "cpu", "--threads", "1")
    gpu = _sgd_run(small_data, tmp_path / "gpu", "--device", "cuda", "--no-cuda-graph")
    steps = lambda events: [(e["step"], e["loss"]) for e in events if e["event"] == "step"]  # noqa: E731
    assert [s for s, _ in steps(cpu)] == [s for s, _ in steps(gpu)]
    assert [v for _, v in steps(gpu)] == pytest.approx([v for _, v in steps(cpu)], rel=1e-3)
    a = torch.load(tmp_path / "cpu" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "gpu" / "ckpt.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key].cpu(), rtol=2e-3, atol=2e-3, msg=key)


def test_cuda_graph_step_matches_the_eager_step(small_data: Path, tmp_path: Path) -> None:
    """The graph-captured step (the default on CUDA) trains as the eager one does, to float tolerance,
    and says which step ran; no fallback. 32 steps: 3 warm-up steps, a capture, 28 replays, each
    of which moves the loss."""
    graph = _sgd_run(small_data, tmp_path / "graph", "--device", "cuda")
    eager = _sgd_run(small_data, tmp_path / "eager", "--device", "cuda", "--no-cuda-graph")
    assert graph[0]["step_impl"] == "graph" and eager[0]["step_impl"] == "eager"
    assert not [e for e in graph if e["event"] == "fallback"]
    gpu_runs.assert_training_moves(graph)
    losses = lambda events: [e["loss"] for e in events if e["event"] == "step"]  # noqa: E731
    assert len(losses(graph)) == 512 // gpu_runs.SMALL_BATCH
    assert losses(graph) == pytest.approx(losses(eager), rel=1e-3)
    a = torch.load(tmp_path / "graph" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "eager" / "ckpt.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=2e-3, atol=2e-3, msg=key)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second CUDA GPU")
def test_cuda_graph_on_a_second_gpu_trains(small_data: Path, tmp_path: Path) -> None:
    """--device cuda:1: the capture runs on that device's stream, so replays train (issue 29 fix 2)."""
    graph = _sgd_run(small_data, tmp_path / "graph", "--device", "cuda:1")
    assert graph[0]["step_impl"] == "graph" and not [e for e in graph if e["event"] == "fallback"]
    gpu_runs.assert_training_moves(graph)


def test_cuda_graph_run_stops_on_sigterm_and_resumes_exactly(medium_data: Path, tmp_path: Path) -> None:
    """SIGTERM while the run waits at step 32 of 64 (28 replays done): a checkpoint and exit 0 within
    5 s; the resumed run ends where an uninterrupted one does. Its logic runs on the CPU in
    tests/test_gpu_logic.py."""
    gpu_runs.stop_and_resume(medium_data, tmp_path, "cuda", "graph")
