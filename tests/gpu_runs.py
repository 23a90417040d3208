"""The runs tests/test_gpu.py makes on CUDA, written once so their logic also runs on the CPU
(tests/test_gpu_logic.py): sized so that the graph step captures and replays (3 warm-up steps,
a capture, then at least 20 replays) and a stop lands mid-run."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .conftest import cli_env, json_lines, run_cli
from .proc_support import Child

# medium_data (4,096 images) at batch 64: 64 steps an epoch; the stop lands after step 32 (a
# capture at step 4 and 28 replays before it), half way through. At batch 512 it made 8 steps, the
# wait for step 8 saw the run finish, and --resume had nothing left to do.
BATCH = 64
STEPS = 4096 // BATCH
STOP_AT = 32
# small_data (512 images) at batch 16: 32 steps, a capture at step 4 and 28 replays.
SMALL_BATCH = 16


def sgd_run(data: Path, run_dir: Path, *flags: str, batch: int = BATCH, env: dict[str, str] | None = None) -> list[dict]:
    """One epoch with SGD at a constant rate and TF32 off (NVIDIA_TF32_OVERRIDE=0): no step can
    turn a rounding difference into a whole learning rate, as Adam's first step does (+-lr for
    a gradient whose sign differs between cuDNN and the CPU). A step event every step."""
    profile = run_dir.parent / (run_dir.name + ".toml")
    profile.write_text("[run]\noptimizer = \"sgd\"\nlr = 0.05\nmomentum = 0.9\nschedule = \"constant\"\nl1 = 0.0\n",
                       encoding="utf-8")
    result = subprocess.run([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
                             "--epochs", "1", "--seed", "5", "--batch-size", str(batch), "--run-dir", str(run_dir),
                             *flags], capture_output=True, text=True, timeout=300,
                            env=cli_env(NVIDIA_TF32_OVERRIDE="0", GPUTUI_STEP_EVENT_INTERVAL="0", **(env or {})))
    assert result.returncode == 0, result.stderr
    return json_lines(result.stdout)


def step_losses(events: list[dict]) -> list[tuple[int, Any]]:
    return [(e["step"], e["loss"]) for e in events if e["event"] == "step"]


def assert_training_moves(events: list[dict]) -> None:
    """Every step after the capture changed the loss: a graph whose replays do nothing (captured on
    another device's stream) freezes the weights and repeats the last loss."""
    losses = [loss for step, loss in step_losses(events) if step > 4]
    assert len(losses) >= 20, f"{len(losses)} step events after the capture: too few replays to judge"
    stale = sum(a == b for a, b in zip(losses, losses[1:]))
    assert stale < len(losses) // 4, f"{stale} of {len(losses)} step losses repeat the one before: replays moved nothing"


def stop_and_resume(data: Path, tmp_path: Path, device: str, impl: str, env: dict[str, str] | None = None) -> None:
    """SIGTERM at step STOP_AT (the run waits there: GPUTUI_TEST_PAUSE_AT_STEP): a checkpoint and
    exit 0 within 5 s; the resumed run ends where an uninterrupted one does (same step count,
    accuracy within 0.5 point)."""
    whole = sgd_run(data, tmp_path / "whole", "--device", device, env=env)
    assert whole[-1]["event"] == "done" and whole[-1]["step"] == STEPS
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--data", str(data), "--epochs", "1", "--seed", "5",
                "--batch-size", str(BATCH), "--device", device, "--run-dir", str(tmp_path / "cut"),
                "--profile", str(tmp_path / "whole.toml")],
               env=cli_env(NVIDIA_TF32_OVERRIDE="0", GPUTUI_TEST_PAUSE_AT_STEP=str(STOP_AT), **(env or {}))) as child:
        child.wait_for(lambda e: e["event"] == "step" and e["step"] == STOP_AT, timeout=120,
                       what=f"the step event of step {STOP_AT} (the run then waits for the signal)")
        sent = time.monotonic()
        child.proc.send_signal(signal.SIGTERM)
        assert child.finish(timeout=30) == 0, child.stderr
        assert time.monotonic() - sent < 5
        assert child.events[0]["step_impl"] == impl
        stopped = child.events[-1]
        assert stopped["event"] == "interrupted" and stopped["step"] == STOP_AT, stopped
    resumed = run_cli("run", "--json", "--resume", str(tmp_path / "cut"))
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events, f"--resume printed no event: {resumed.stderr.strip()}"
    assert events[0]["resumed_from_step"] == STOP_AT
    done = events[-1]
    assert done["event"] == "done" and done["step"] == whole[-1]["step"]
    assert done["test_acc"] == pytest.approx(whole[-1]["test_acc"], abs=0.5)
