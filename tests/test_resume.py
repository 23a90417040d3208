"""Checkpoints and resume, through real subprocesses: SIGTERM, SIGKILL, corrupt files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from gputui.cli import main

from .conftest import cli_env, json_lines, run_cli


def start(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gputui", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )


def read_until(proc: subprocess.Popen[str], predicate: Any, timeout: float = 120) -> list[dict[str, Any]]:
    """Read JSON events from the child's stdout until `predicate(event)` holds."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(json.loads(line))
        if predicate(seen[-1]):
            return seen
    raise AssertionError(f"no matching event; saw {[e['event'] for e in seen]}")


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "ckpt.pt", weights_only=True)["model"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


# 1024 steps an epoch on the medium slice: long enough to signal a run inside epoch 2.
TRAIN = ["--epochs", "3", "--batch-size", "4", "--seed", "7", "--threads", "1"]
STEPS = 1024


def test_sigterm_checkpoints_exits_0_and_resume_matches_an_uninterrupted_run(
    medium_data: Path, tmp_path: Path
) -> None:
    # Reference: the same run, never interrupted.
    ref = tmp_path / "ref"
    assert main(["run", "--json", "--data", str(medium_data), *TRAIN, "--run-dir", str(ref)]) == 0

    run_dir = tmp_path / "run"
    proc = start("run", "--json", "--data", str(medium_data), *TRAIN, "--run-dir", str(run_dir))
    read_until(proc, lambda e: e["event"] == "step" and e["epoch"] == 2)  # mid-epoch 2
    sent = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent
    assert proc.returncode == 0, err
    assert took < 5.0
    events = json_lines(out)
    assert events[-1]["event"] == "interrupted"
    assert events[-1]["reason"] == "SIGTERM"
    stopped_at = events[-1]["step"]
    assert STEPS < stopped_at < 2 * STEPS  # inside epoch 2
    assert "interrupted: checkpoint saved" in err and "--resume" in err
    assert torch.load(run_dir / "ckpt.pt", weights_only=True)["step"] == stopped_at

    resumed = run_cli("run", "--json", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    again = json_lines(resumed.stdout)
    assert again[0]["event"] == "start" and again[0]["resumed_from_step"] == stopped_at
    first_step = next(e for e in again if e["event"] == "step")
    assert first_step["step"] == stopped_at + 1  # no step lost or repeated
    assert again[-1]["event"] == "done" and again[-1]["epochs"] == 3
    assert again[-1]["elapsed_s"] > events[-1]["elapsed_s"]  # summed across the resume
    assert_same_weights(weights(run_dir), weights(ref))


def test_sigkill_resumes_from_the_last_epoch(medium_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = start("run", "--json", "--data", str(medium_data), *TRAIN, "--run-dir", str(run_dir))
    read_until(proc, lambda e: e["event"] == "step" and e["epoch"] == 2)
    proc.kill()
    proc.communicate(timeout=30)
    state = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert (state["epoch"], state["batch"], state["step"]) == (1, 0, STEPS)
    assert not (run_dir / "ckpt.pt.tmp").exists()

    resumed = run_cli("run", "--json", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[0]["resumed_from_step"] == STEPS
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == [2, 3]


def test_resume_last_and_extend_epochs(small_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "64"]) == 0
    first = json_lines(capsys.readouterr().out)
    assert main(["run", "--json", "--resume", "last", "--epochs", "2"]) == 0
    second = json_lines(capsys.readouterr().out)
    assert second[0]["run_id"] == first[0]["run_id"]
    assert second[0]["resumed_from_step"] == 8
    assert [e["epoch"] for e in second if e["event"] == "epoch"] == [2]
    assert second[-1]["step"] == 16


def test_resume_refuses_settings_that_break_the_checkpoint(
    small_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", "last", "--batch-size", "32"]) == 2
    assert "--batch-size: cannot change when resuming" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["garbage", "truncate", "empty", "pickle"])
def test_corrupt_checkpoint_is_a_clear_error(small_data: Path, tmp_path: Path, damage: str) -> None:
    run_dir = tmp_path / "r"
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "1", "--run-dir", str(run_dir)]) == 0
    ckpt = run_dir / "ckpt.pt"
    if damage == "garbage":
        ckpt.write_bytes(os.urandom(4096))
    elif damage == "truncate":
        ckpt.write_bytes(ckpt.read_bytes()[:2000])
    elif damage == "empty":
        ckpt.write_bytes(b"")
    else:  # a checkpoint carrying an arbitrary object is refused by weights_only loading
        torch.save({"format": 1, "evil": Path("/")}, ckpt)
    result = run_cli("run", "--resume", str(run_dir), "--epochs", "2")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "checkpoint" in lines[0], result.stderr


def test_full_disk_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from gputui.errors import GputuiError
    from gputui.train import checkpoint

    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, {"step": 1})

    def no_space(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(GputuiError, match="cannot write checkpoint .*No space left on device; free space"):
        checkpoint.save(path, {"step": 2})
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 1  # the old checkpoint is intact
    assert not (tmp_path / "ckpt.pt.tmp").exists()
