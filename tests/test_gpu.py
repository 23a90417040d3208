"""GPU paths: skipped cleanly where no CUDA device is visible (CI never has one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .conftest import cli_env, json_lines, run_cli

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
    """One epoch with SGD at a constant rate and TF32 off (NVIDIA_TF32_OVERRIDE=0): no step can
    turn a rounding difference into a whole learning rate, as Adam's first step does (+-lr for
    a gradient whose sign differs between cuDNN and the CPU)."""
    profile = run_dir.parent / (run_dir.name + ".toml")
    profile.write_text("[run]\noptimizer = \"sgd\"\nlr = 0.05\nmomentum = 0.9\nschedule = \"constant\"\nl1 = 0.0\n",
                       encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
                             "--epochs", "1", "--seed", "5", "--run-dir", str(run_dir), *flags],
                            capture_output=True, text=True, timeout=300, env=cli_env(NVIDIA_TF32_OVERRIDE="0"))
    assert result.returncode == 0, result.stderr
    return json_lines(result.stdout)


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
    and says which step ran; no fallback."""
    graph = _sgd_run(small_data, tmp_path / "graph", "--device", "cuda")
    eager = _sgd_run(small_data, tmp_path / "eager", "--device", "cuda", "--no-cuda-graph")
    assert graph[0]["step_impl"] == "graph" and eager[0]["step_impl"] == "eager"
    assert not [e for e in graph if e["event"] == "fallback"]
    losses = lambda events: [e["loss"] for e in events if e["event"] == "step"]  # noqa: E731
    assert losses(graph) == pytest.approx(losses(eager), rel=1e-3)
    a = torch.load(tmp_path / "graph" / "ckpt.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "eager" / "ckpt.pt", weights_only=True)["model"]
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=2e-3, atol=2e-3, msg=key)


def test_cuda_graph_run_stops_on_sigterm_and_resumes_exactly(medium_data: Path, tmp_path: Path) -> None:
    """SIGTERM after the first step event: a checkpoint and exit 0 within 5 s; the resumed run
    ends where an uninterrupted one does (same step count, accuracy within 0.5 point)."""
    import signal
    import time

    from .proc_support import Child

    whole = _sgd_run(medium_data, tmp_path / "whole", "--device", "cuda")
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--data", str(medium_data), "--epochs", "1",
                "--seed", "5", "--device", "cuda", "--run-dir", str(tmp_path / "cut"),
                "--profile", str(tmp_path / "whole.toml")], env=cli_env(GPUTUI_STEP_EVENT_INTERVAL="0")) as child:
        child.wait_for(lambda e: e["event"] == "step" and e["step"] >= 8, timeout=120,
                       what="a step event after the capture")
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        assert child.finish(timeout=30) == 0
        assert time.monotonic() - sent < 5
        assert child.events[0]["step_impl"] == "graph"
    resumed = run_cli("run", "--json", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr
    done = json_lines(resumed.stdout)[-1]
    assert done["event"] == "done" and done["step"] == whole[-1]["step"]
    assert done["test_acc"] == pytest.approx(whole[-1]["test_acc"], abs=0.5)