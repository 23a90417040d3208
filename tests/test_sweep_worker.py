"""`gputui worker`: one process, torch and the data loaded once, trials as JSON lines on stdin."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from gputui.config.run import RunSettings
from tests.proc_support import Child

WAIT = 120  # s: a worker's start (torch, the data) on a slow, busy machine, and a trial or two


def worker(data: Path, *extra: str) -> Child:
    child = Child([sys.executable, "-m", "gputui", "worker", "--device", "cpu", "--threads", "1", "--data", str(data),
                   *extra], name="gputui worker", stdin=__import__("subprocess").PIPE)
    return child


def send(child: Child, message: dict[str, Any]) -> None:
    assert child.proc.stdin is not None
    child.proc.stdin.write(json.dumps(message) + "\n")
    child.proc.stdin.flush()


def trial(number: int, data: Path, run_dir: Path, **run: Any) -> dict[str, Any]:
    cfg = RunSettings(model="fast", data=str(data), **run).resolve()
    return {"op": "trial", "trial": number, "attempt": 1, "profile": cfg.to_toml(), "run_dir": str(run_dir / str(number))}


def ops(child: Child, op: str) -> list[dict[str, Any]]:
    return [e for e in child.events if e.get("op") == op]


def test_one_worker_process_runs_trial_after_trial_without_starting_again(small_data: Path, tmp_path: Path) -> None:
    with worker(small_data) as child:
        ready = child.wait_for(lambda e: e.get("op") == "ready", WAIT, "the worker's ready line")
        for n in range(3):
            send(child, trial(n, small_data, tmp_path, epochs=1, batch_size=64, seed=n))
            result = child.wait_for(lambda e: e.get("op") == "result", WAIT, f"the result of trial {n}")
            assert result["trial"] == n and result["outcome"] == "done", result
        assert child.proc.stdin is not None
        child.proc.stdin.close()
        assert child.finish(WAIT) == 0
    assert len(ops(child, "ready")) == 1 and ready["pid"] == child.proc.pid  # one start for three trials
    starts = [e for e in ops(child, "event") if e["data"]["event"] == "start"]
    assert [e["trial"] for e in starts] == [0, 1, 2]
    assert all(isinstance(e["startup_ms"], (int, float)) for e in starts)
    # each trial is a run directory like `gputui run`'s: its profile and its events, done last
    for n in range(3):
        events = [json.loads(line) for line in (tmp_path / str(n) / "events.jsonl").read_text().splitlines()]
        assert events[0]["event"] == "start" and events[-1]["event"] == "done"
        assert (tmp_path / str(n) / "profile.toml").is_file()
    # eval and epoch events carry their evaluation's index within the trial: 1, 2, ... (the pruner's steps)
    evals = [e["eval"] for e in ops(child, "event") if e["trial"] == 0 and e["data"]["event"] in ("eval", "epoch")]
    assert evals == list(range(1, len(evals) + 1)) and len(evals) >= 2


def test_a_stop_line_ends_the_running_trial_as_pruned_and_a_stale_one_is_ignored(medium_data: Path,
                                                                                  tmp_path: Path) -> None:
    with worker(medium_data) as child:
        child.wait_for(lambda e: e.get("op") == "ready", WAIT, "the worker's ready line")
        send(child, trial(0, medium_data, tmp_path, epochs=3))
        child.wait_for(lambda e: e.get("op") == "event" and e["data"]["event"] == "eval", WAIT, "trial 0's first eval")
        send(child, {"op": "stop", "trial": 99, "reason": "pruned"})  # another trial's: too late, ignored
        send(child, {"op": "stop", "trial": 0, "reason": "pruned"})
        result = child.wait_for(lambda e: e.get("op") == "result", WAIT, "the result of trial 0")
        assert result["outcome"] == "stopped" and result["reason"] == "pruned", result
        # the worker goes on with the next trial, which the stale stop did not touch
        send(child, trial(1, medium_data, tmp_path, epochs=1))
        result = child.wait_for(lambda e: e.get("op") == "result", WAIT, "the result of trial 1")
        assert result["trial"] == 1 and result["outcome"] == "done", result
    last = json.loads((tmp_path / "0" / "events.jsonl").read_text().splitlines()[-1])
    assert last["event"] == "interrupted" and last["reason"] == "pruned"
    assert last["epoch"] == 1  # stopped in its first epoch of three, at the next step


def test_a_failing_trial_is_reported_and_the_worker_goes_on(small_data: Path, tmp_path: Path) -> None:
    with worker(small_data) as child:
        child.wait_for(lambda e: e.get("op") == "ready", WAIT, "the worker's ready line")
        send(child, trial(0, small_data, tmp_path, epochs=1, batch_size=100000))  # larger than the 512 images
        result = child.wait_for(lambda e: e.get("op") == "result", WAIT, "the result of trial 0")
        assert result["outcome"] == "error" and "larger than the 512 training images" in result["error"], result
        send(child, trial(1, small_data, tmp_path, epochs=1))
        result = child.wait_for(lambda e: e.get("op") == "result", WAIT, "the result of trial 1")
        assert result["outcome"] == "done", result


def test_the_end_of_stdin_stops_a_running_trial_and_the_worker(medium_data: Path, tmp_path: Path) -> None:
    with worker(medium_data) as child:
        child.wait_for(lambda e: e.get("op") == "ready", WAIT, "the worker's ready line")
        send(child, trial(0, medium_data, tmp_path, epochs=50))
        child.wait_for(lambda e: e.get("op") == "event" and e["data"]["event"] == "step", WAIT, "a step of trial 0")
        assert child.proc.stdin is not None
        child.proc.stdin.close()  # the master is gone
        assert child.finish(WAIT) == 0
    result = ops(child, "result")[-1]
    assert result["outcome"] == "stopped" and result["reason"] == "master gone", result


def test_a_worker_that_cannot_load_its_data_says_so_on_the_protocol(tmp_path: Path) -> None:
    with worker(tmp_path / "nothing") as child:
        fatal = child.wait_for(lambda e: e.get("op") == "fatal", WAIT, "the fatal line")
        assert child.finish(WAIT) == 2
    assert "no such data directory" in fatal["error"] and "\n" not in fatal["error"]


def test_a_retried_trial_continues_from_the_checkpoint_its_dead_worker_left(small_data: Path, tmp_path: Path) -> None:
    # 8 steps an epoch, a checkpoint at every epoch's end (the default waits checkpoint_every_s = 5 s)
    message = trial(0, small_data, tmp_path, epochs=40, batch_size=64, checkpoint_every_s=0)
    with worker(small_data) as first:
        first.wait_for(lambda e: e.get("op") == "ready", WAIT, "the first worker's ready line")
        send(first, message)
        first.wait_for(lambda e: e.get("op") == "event" and e["data"]["event"] == "epoch", WAIT,
                       "trial 0's first epoch (its checkpoint is written before the event)")
        first.proc.kill()  # SIGKILL: no checkpoint on the way out
    with worker(small_data) as second:
        second.wait_for(lambda e: e.get("op") == "ready", WAIT, "the second worker's ready line")
        send(second, {**message, "attempt": 2, "resume": True})
        start = second.wait_for(lambda e: e.get("op") == "event" and e["data"]["event"] == "start", WAIT,
                                "trial 0's start on the second worker")
        assert start["data"]["resumed_from_step"] >= 8 and start["data"]["resumed_from_step"] % 8 == 0, start
        send(second, {"op": "stop", "trial": 0, "reason": "pruned"})
        result = second.wait_for(lambda e: e.get("op") == "result", WAIT, "the result of trial 0")
        assert result["outcome"] == "stopped", result
    kinds = [json.loads(line)["event"] for line in (tmp_path / "0" / "events.jsonl").read_text().splitlines()]
    assert kinds.count("start") == 2  # one run directory, one log: the second attempt appended to it
