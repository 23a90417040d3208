"""tests/test_gpu.py's runs on the CPU, with the same data sizes: the logic of the GPU tests is
proven here, where no GPU is lent (CI never has one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from . import gpu_runs


@pytest.mark.integration
def test_sigterm_mid_run_and_resume_on_the_cpu(medium_data: Path, tmp_path: Path) -> None:
    """The CUDA SIGTERM/resume test's logic, with the graph step's path on the CPU (its capture
    fails there and the run goes on eagerly): the stop lands mid-run and --resume finishes it."""
    gpu_runs.stop_and_resume(medium_data, tmp_path, "cpu", "graph",
                             env={"GPUTUI_TEST_GRAPH_ANYWHERE": "1"})


@pytest.mark.integration
def test_the_graph_test_is_sized_for_replays(small_data: Path, tmp_path: Path) -> None:
    """The graph-versus-eager test's run makes enough steps after the capture to judge its replays."""
    events = gpu_runs.sgd_run(small_data, tmp_path / "eager", "--device", "cpu", "--threads", "1",
                              batch=gpu_runs.SMALL_BATCH)
    gpu_runs.assert_training_moves(events)
