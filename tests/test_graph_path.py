"""The graph-captured step inside real runs, on the CPU: the CUDA-only capture fails here, so
the run must fall back to eager steps with a `fallback` event and finish as an eager run does;
checkpoints of either step resume on the other; the profile key and flag turn the graph off."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from gputui.runs import store as runs
from gputui.cli import main
from gputui.train import checkpoint
from gputui.train.graphstep import WARMUP_STEPS

from .conftest import json_lines


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["run", "--json", "--device", "cpu", "--threads", "1", *args])
    return code, json_lines(capsys.readouterr().out)


def _of(got: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in got if e["event"] == kind]


def test_a_capture_that_fails_falls_back_with_an_event_and_the_run_finishes(
        small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    common = ["--data", str(small_data), "--epochs", "2", "--batch-size", "64", "--seed", "5"]
    monkeypatch.setenv("GPUTUI_TEST_GRAPH_ANYWHERE", "1")
    code, got = _run(capsys, *common, "--run-dir", str(tmp_path / "graph"))
    assert code == 0
    assert _of(got, "start")[0]["step_impl"] == "graph"
    [fallback] = _of(got, "fallback")
    assert fallback["from_impl"] == "graph" and fallback["to_impl"] == "eager"
    assert fallback["reason"].startswith("capture failed: ")
    assert fallback["step"] == WARMUP_STEPS  # the capture comes after the warm-up steps
    assert got[-1]["event"] == "done"
    monkeypatch.delenv("GPUTUI_TEST_GRAPH_ANYWHERE")
    code, eager = _run(capsys, *common, "--run-dir", str(tmp_path / "eager"))
    assert code == 0 and _of(eager, "start")[0]["step_impl"] == "eager" and not _of(eager, "fallback")
    # Fused Adam with a tensor learning rate against the default Adam: the same run to float tolerance.
    graph_epochs, eager_epochs = _of(got, "epoch"), _of(eager, "epoch")
    assert [e["train_loss"] for e in graph_epochs] == pytest.approx([e["train_loss"] for e in eager_epochs], rel=1e-3)
    assert [e["test_loss"] for e in graph_epochs] == pytest.approx([e["test_loss"] for e in eager_epochs], rel=1e-3)


@pytest.mark.parametrize("first_graph", [True, False], ids=["graph-then-eager", "eager-then-graph"])
def test_a_checkpoint_of_either_step_resumes_on_the_other(
        first_graph: bool, small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    run_dir = tmp_path / "run"
    if first_graph:
        monkeypatch.setenv("GPUTUI_TEST_GRAPH_ANYWHERE", "1")
    code, got = _run(capsys, "--data", str(small_data), "--epochs", "1", "--batch-size", "64", "--run-dir", str(run_dir))
    assert code == 0
    saved = checkpoint.load(runs.RunDir(run_dir).checkpoint)
    assert all(isinstance(g["lr"], float) for g in saved["optimizer"]["param_groups"])  # never a device tensor
    if first_graph:
        monkeypatch.delenv("GPUTUI_TEST_GRAPH_ANYWHERE")
    else:
        monkeypatch.setenv("GPUTUI_TEST_GRAPH_ANYWHERE", "1")
    code, more = _run(capsys, "--resume", str(run_dir), "--epochs", "2")
    assert code == 0
    start = _of(more, "start")[0]
    assert start["resumed_from_step"] == 8
    assert start["step_impl"] == ("eager" if first_graph else "graph")
    assert more[-1]["event"] == "done" and more[-1]["step"] == 16
    assert all(torch.isfinite(torch.tensor(e["train_loss"])) for e in _of(more, "epoch"))


def test_the_profile_key_and_the_flag_turn_the_graph_off(
        small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTUI_TEST_GRAPH_ANYWHERE", "1")
    common = ["--data", str(small_data), "--epochs", "1", "--batch-size", "64"]
    code, got = _run(capsys, *common, "--no-cuda-graph", "--run-dir", str(tmp_path / "flag"))
    assert code == 0 and _of(got, "start")[0]["step_impl"] == "eager" and not _of(got, "fallback")
    profile = tmp_path / "p.toml"
    profile.write_text("[run]\ncuda_graph = false\n", encoding="utf-8")
    code, got = _run(capsys, *common, "--profile", str(profile), "--run-dir", str(tmp_path / "key"))
    assert code == 0 and _of(got, "start")[0]["step_impl"] == "eager"
    assert "cuda_graph = false" in (tmp_path / "key" / runs.PROFILE).read_text(encoding="utf-8")
    code, got = _run(capsys, *common, "--profile", str(profile), "--cuda-graph", "--run-dir", str(tmp_path / "both"))
    assert code == 0 and _of(got, "start")[0]["step_impl"] == "graph"  # the flag wins over the profile


def test_the_nan_hook_on_the_graph_path_ends_the_run_as_on_the_eager_one(
        small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTUI_TEST_GRAPH_ANYWHERE", "1")
    monkeypatch.setenv("GPUTUI_TEST_NAN_AT_STEP", "6")
    code, got = _run(capsys, "--data", str(small_data), "--epochs", "2", "--batch-size", "64",
                     "--run-dir", str(tmp_path / "r"))
    assert code == 1
    [error] = _of(got, "error")
    assert error["reason"] == "nan" and error["step"] == 6
    saved = checkpoint.load(runs.RunDir(tmp_path / "r").checkpoint)
    assert saved["step"] < 6
    assert all(torch.isfinite(t).all() for t in saved["model"].values())
