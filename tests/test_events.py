"""The one events module: make() refuses what is not in SPEC and numbers that are not finite;
typed() cleans what readers receive; the error event of a run that diverged; the dashboard
folds `error` events."""

from __future__ import annotations

import json
import math

import pytest

from gputui.model import events
from gputui.dashboard.training import TrainingState, event_line
from gputui.model.errors import GputuiError
from gputui.train.distributed import error_event
from gputui.train.loop import Diverged

START = {"event": "start", "run_id": "r1", "model": "seed", "device": "cpu", "strategy": "single", "world_size": 1,
         "epochs": 2, "batch_size": 64, "steps_per_epoch": 8, "total_steps": 16, "resumed_from_step": None}


def test_make_builds_an_event_with_its_time() -> None:
    event = events.make("step", epoch=1, step=3, loss=0.5, l1=0.001, samples_per_s=100.0, lr=0.01, elapsed_s=0.2)
    assert event["event"] == "step" and isinstance(event["time"], float) and event["l1"] == 0.001
    assert json.loads(json.dumps(event, allow_nan=False)) == event


@pytest.mark.parametrize("name, fields, error", [
    ("stepp", {"step": 1}, "unknown event 'stepp'"),
    ("step", {"step": 1, "los": 0.5}, "event 'step' has no field 'los'"),
    ("step", {"step": 1.5}, "field 'step': 1.5 is not int"),
    ("step", {"loss": "0.5"}, "field 'loss': '0.5' is not num"),
    ("start", {"world_size": True}, "field 'world_size': True is not int"),
])
def test_make_refuses_what_spec_does_not_define(name: str, fields: dict[str, object], error: str) -> None:
    with pytest.raises(TypeError, match=error):
        events.make(name, **fields)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_make_refuses_a_number_that_is_not_finite(value: float) -> None:
    with pytest.raises(events.NonFinite, match="event 'step' field 'loss' is"):
        events.make("step", step=1, loss=value)


def test_typed_keeps_finite_numbers_and_turns_the_rest_to_none() -> None:
    got = events.typed({"event": "step", "step": 2, "loss": math.nan, "samples_per_s": "fast", "lr": True,
                        "elapsed_s": 1.5, "note": "kept"})
    assert got == {"event": "step", "step": 2, "loss": None, "samples_per_s": None, "lr": None, "elapsed_s": 1.5,
                   "note": "kept"}


def test_a_diverged_runs_error_event_names_the_reason_step_and_checkpoint() -> None:
    exc = Diverged("training diverged at step 7", reason="nan", step=7, epoch=1, checkpoint="/r/ckpt.pt")
    event = error_event(exc)
    assert (event["event"], event["reason"], event["step"], event["epoch"], event["checkpoint"]) == (
        "error", "nan", 7, 1, "/r/ckpt.pt")
    assert event["exit_code"] == 1 and event["message"] == "training diverged at step 7"
    assert set(error_event(GputuiError("boom"))) == {"event", "time", "message", "exit_code"}


def test_the_dashboard_shows_an_error_event_as_a_failed_run_with_its_message() -> None:
    running = TrainingState().fold(START).fold({"event": "step", "epoch": 1, "step": 3, "loss": 2.0})
    failed = running.fold({"event": "error", "message": "training diverged at step 4", "exit_code": 1,
                           "reason": "nan", "step": 4})
    assert failed.status == "failed" and failed.error == "training diverged at step 4" and failed.exit_code == 1
    assert not failed.active and failed.eta_s is None
    # The process's exit keeps the event's message (stderr's last line says less).
    assert failed.exited(1, "gputui: error: something").error == "training diverged at step 4"
    assert event_line({"event": "error", "message": "training diverged at step 4"}) == (
        "run failed: training diverged at step 4")


def test_an_error_after_done_does_not_undo_the_run() -> None:
    done = TrainingState().fold(START).fold({"event": "done", "step": 16, "epochs": 2, "test_acc": 90.0})
    after = done.fold({"event": "error", "message": "teardown failed", "exit_code": 1})
    assert after.status == "done" and after.error is None
