"""Checkpoints and resume, through real subprocesses: SIGTERM, SIGKILL, corrupt files."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gputui.cli import main

from .conftest import cli_env, json_lines, run_cli
from .proc_support import Child


def start(*args: str, pause_at: int | None = None) -> Child:
    """`gputui ARGS`; with `pause_at`, the run waits after that step for a stop (a test hook)."""
    env = cli_env(**({"GPUTUI_TEST_PAUSE_AT_STEP": str(pause_at)} if pause_at is not None else {}))
    return Child([sys.executable, "-m", "gputui", *args], env=env, name="gputui " + " ".join(args[:2]))


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "ckpt.pt", weights_only=True)["model"]


def assert_same_weights(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6, msg=key)


# 32 steps an epoch on the small slice. Evaluations at 5/8, 3/4, 7/8 and the end of each epoch.
# The runs wait at a known step (GPUTUI_TEST_PAUSE_AT_STEP) for the test's signal, so a short run
# is signalled where the test says, whatever the machine's speed.
TRAIN = ["--epochs", "3", "--batch-size", "16", "--seed", "7", "--threads", "1", "--evals-per-epoch", "4"]
STEPS = 32
INSIDE_EPOCH_2 = STEPS + 22  # after epoch 2's first evaluation (its 20th step), before its end


def test_sigterm_checkpoints_exits_0_and_resume_matches_an_uninterrupted_run(
    small_data: Path, tmp_path: Path
) -> None:
    # Reference: the same run, never interrupted.
    ref = tmp_path / "ref"
    assert main(["run", "--json", "--data", str(small_data), *TRAIN, "--run-dir", str(ref)]) == 0

    run_dir = tmp_path / "run"
    with start("run", "--json", "--data", str(small_data), *TRAIN, "--run-dir", str(run_dir),
               pause_at=INSIDE_EPOCH_2) as child:
        # Signalled after step 54, inside epoch 2 and after its first evaluation: the run stops mid-epoch.
        child.wait_for(lambda e: e["event"] == "step" and e["step"] == INSIDE_EPOCH_2, 240, f"step {INSIDE_EPOCH_2}")
        mid = next(e for e in child.events if e["event"] == "eval" and e["epoch"] == 2)
        child.proc.send_signal(signal.SIGTERM)
        code = child.finish(60, "the checkpoint and the exit after SIGTERM")
    events, err = child.events, child.stderr
    assert code == 0, err
    assert events[-1]["event"] == "interrupted", child.kinds()
    assert events[-1]["reason"] == "SIGTERM"
    stopped_at = events[-1]["step"]
    assert mid["step"] <= stopped_at == INSIDE_EPOCH_2  # at the step it was signalled at, after the evaluation
    assert stopped_at % STEPS != 0, stopped_at  # inside an epoch: the resume starts mid-epoch
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


def test_sigkill_resumes_from_the_last_epoch(small_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    profile = tmp_path / "every_epoch.toml"  # a checkpoint at every epoch end (the default waits 5 s)
    profile.write_text('[run]\nmodel = "seed"\ndevice = "auto"\ncheckpoint_every_s = 0\n')
    with start("run", "--json", "--profile", str(profile), "--data", str(small_data), *TRAIN, "--run-dir",
               str(run_dir), pause_at=STEPS + 5) as child:
        # Epoch 1's checkpoint is written before its epoch event; the kill comes inside epoch 2.
        child.wait_for(lambda e: e["event"] == "step" and e["step"] == STEPS + 5, 240, "a step inside epoch 2")
        child.proc.kill()
        child.finish(60, "the killed run's remaining output")
    ended = [e["epoch"] for e in child.events if e["event"] == "epoch"]
    assert ended == [1] and "done" not in child.kinds(), child.kinds()
    last = ended[-1]
    state = torch.load(run_dir / "ckpt.pt", weights_only=True)
    assert (state["epoch"], state["batch"], state["step"]) == (last, 0, last * STEPS)
    assert not (run_dir / "ckpt.pt.tmp").exists()

    resumed = run_cli("run", "--json", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[0]["resumed_from_step"] == last * STEPS
    assert [e["epoch"] for e in events if e["event"] == "epoch"] == list(range(last + 1, 4))


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

    from gputui.model.errors import GputuiError
    from gputui.train import checkpoint

    from .test_security import full_state

    path = tmp_path / "ckpt.pt"
    checkpoint.save(path, full_state(step=1))

    def no_space(*_args: Any, **_kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", no_space)
    with pytest.raises(GputuiError, match="cannot write checkpoint .*No space left on device; free space"):
        checkpoint.save(path, full_state(step=2))
    monkeypatch.undo()
    assert checkpoint.load(path)["step"] == 1  # the old checkpoint is intact
    assert not (tmp_path / "ckpt.pt.tmp").exists()
