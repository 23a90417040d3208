"""The shipped examples of your own program (examples/), each through the real `gputui run -- ...`:
mnist_plain and mnist_ddp (two gloo ranks) train to `done` with their metrics; Ctrl-C stops a
run with its checkpoint, and `--resume` goes on from the program's own step; print_only's lines
become metrics through profiles/print_only.toml's `metrics_regex`.

Every wait is tied to an event of the run's --json output and bounded; the runs train a few
steps of small_data (512 training images, 256 test images)."""

from __future__ import annotations

import json
import re
import signal
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from .conftest import REPO, cli_env, json_lines, run_cli
from .proc_support import Child, wait_until

pytestmark = pytest.mark.integration

PLAIN = ["python", "examples/mnist_plain.py"]
DDP = ["python", "examples/mnist_ddp.py"]


def gputui_run(*args: str) -> Child:
    """`gputui run --json ARGS` from the repository's root (the examples' documented place)."""
    return Child([sys.executable, "-m", "gputui", "run", "--json", *args], env=cli_env(), cwd=str(REPO),
                 name="gputui run " + " ".join(args[-4:]))


def events_of(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


def metrics(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == "metrics"]


def reported(run_dir: Path) -> list[dict[str, Any]]:
    """The lines the program itself wrote to GPUTUI_EVENTS."""
    return [json.loads(line) for line in (run_dir / "reported.jsonl").read_text().splitlines()]


def test_mnist_plain_trains_to_done_with_its_metrics_and_a_checkpoint(small_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "plain"
    result = run_cli("run", "--json", "--run-dir", str(run_dir), "--", *PLAIN, "--data", str(small_data),
                     "--epochs", "1", "--batch-size", "64", "--log-every", "2", cwd=REPO)
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert events[0]["event"] == "start" and events[0]["workdir"] == str(REPO)
    assert events[0]["program"].startswith("python examples/mnist_plain.py --data ")
    assert events[-1]["event"] == "done" and events[-1]["exit_code"] == 0 and events[-1]["step"] == 8, events[-1]
    seen = metrics(events)
    assert all(e["source"] == "report" for e in seen)
    names = set().union(*(e["values"] for e in seen))
    assert {"loss", "lr", "val_loss", "val_acc"} <= names, names
    assert seen[-1]["values"]["val_acc"] > 0.1 and seen[-1]["epoch"] == 0  # 8 steps of Adam beat chance
    assert [r["step"] for r in reported(run_dir) if "loss" in r["values"]] == [2, 4, 6, 8]
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["batch"], saved["step"]) == (1, 0, 8)


def test_mnist_ddp_trains_on_two_gloo_ranks_and_only_rank_0_reports(small_data: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "ddp"
    result = run_cli("run", "--json", "--run-dir", str(run_dir), "--strategy", "ddp", "--nproc", "2", "--device", "cpu",
                     "--", *DDP, "--data", str(small_data), "--epochs", "1", "--batch-size", "64", "--log-every", "2",
                     cwd=REPO)
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert (events[0]["strategy"], events[0]["world_size"]) == ("ddp", 2)
    # 512 images, 256 a rank: 4 steps of 64 on each rank.
    assert events[-1]["event"] == "done" and events[-1]["step"] == 4, events[-1]
    names = set().union(*(e["values"] for e in metrics(events)))
    assert {"loss", "lr", "val_loss", "val_acc"} <= names, names
    assert not any("rank" in e for e in metrics(events))
    # Both ranks call report.log at the same steps; the lines kept are rank 0's, once each.
    lines = reported(run_dir)
    assert [r["step"] for r in lines if "loss" in r["values"]] == [2, 4], lines
    assert [r["step"] for r in lines if "val_acc" in r["values"]] == [4], lines
    assert torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["step"] == 4  # rank 0 saved it


def stop_after_first_metrics(run: Child) -> tuple[dict[str, Any], dict[str, Any]]:
    """Ctrl-C once the program has reported; its last metrics event before the end, and the end."""
    run.wait_for(lambda e: e["event"] == "metrics", 240, "the first 'metrics' event")
    run.proc.send_signal(signal.SIGINT)
    code = run.finish(120, "the end of the run after SIGINT")
    assert code == 0, run.stderr
    last = metrics(run.events)[-1]
    return last, run.events[-1]


def test_ctrl_c_keeps_mnist_plains_checkpoint_and_resume_goes_on_from_its_step(small_data: Path,
                                                                               tmp_path: Path) -> None:
    run_dir = tmp_path / "stopped"
    # Far more epochs than the test waits for: the run ends only because it is stopped.
    with gputui_run("--run-dir", str(run_dir), "--", *PLAIN, "--data", str(small_data), "--epochs", "1000",
                    "--batch-size", "16", "--log-every", "1") as run:
        before, stopped = stop_after_first_metrics(run)
    assert stopped["event"] == "interrupted" and stopped["reason"] == "SIGINT", run.events[-3:]
    assert stopped["checkpoint"] == str(run_dir / "checkpoints")
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert saved["step"] >= before["step"] and saved["step"] == stopped["step"]  # saved where it stopped
    assert "stopped at epoch" in (run_dir / "output.log").read_text()  # by should_stop(), not by SIGKILL

    with gputui_run("--resume", str(run_dir)) as again:
        start = again.wait_for(lambda e: e["event"] == "start", 120, "the resumed 'start' event")
        first = again.wait_for(lambda e: e["event"] == "metrics", 240, "the first 'metrics' event after --resume")
        again.proc.send_signal(signal.SIGINT)
        assert again.finish(120, "the end of the resumed run after SIGINT") == 0, again.stderr
    assert start["resumed"] is True and start["run_dir"] == str(run_dir)
    # The program's own step, not step 1: the next batch's, or, where the stop came at an epoch's
    # last batch, that epoch's evaluation at the saved step (seen once in a fresh clone's run).
    at_epoch_end = "val_acc" in first["values"]
    assert first["step"] == saved["step"] + (0 if at_epoch_end else 1), (first, saved)
    assert first["epoch"] == saved["epoch"]
    assert first["elapsed_s"] > stopped["elapsed_s"]  # the run's clock goes on
    starts = [e for e in events_of(run_dir) if e["event"] == "start"]
    assert [s["resumed"] for s in starts] == [False, True]  # one events.jsonl for both attempts


def ddp_rank(gputui: int, rank: int) -> psutil.Process | None:
    """The mnist_ddp.py worker of `rank` under the gputui process `gputui` (None while there is none)."""
    for proc in psutil.Process(gputui).children(recursive=True):
        try:
            if proc.cmdline()[1:2] == ["examples/mnist_ddp.py"] and proc.environ().get("RANK") == str(rank):
                return proc
        except (psutil.Error, IndexError):
            continue
    return None


def test_a_stop_that_reaches_one_ddp_rank_stops_both_at_one_step_with_rank_0s_checkpoint(
        small_data: Path, tmp_path: Path) -> None:
    """should_stop() turns True on rank 1 alone (as when one rank sees the stop a step before the
    other): the ranks agree, both leave the loop at the same step, rank 0 saves, the run ends 0."""
    run_dir = tmp_path / "ddp-stopped"
    with gputui_run("--run-dir", str(run_dir), "--strategy", "ddp", "--nproc", "2", "--device", "cpu", "--", *DDP,
                    "--data", str(small_data), "--epochs", "1000", "--batch-size", "16", "--log-every", "1") as run:
        run.wait_for(lambda e: e["event"] == "metrics", 240, "the first 'metrics' event")
        rank_1 = wait_until(lambda: ddp_rank(run.proc.pid, 1), 30, "rank 1's process")
        rank_1.send_signal(signal.SIGTERM)  # gputui.report's handler: should_stop() is True on rank 1 only
        code = run.finish(120, "the end of the run after rank 1 was asked to stop")
    assert code == 0 and run.events[-1]["event"] == "done", (run.events[-2:], run.stderr)
    output = (run_dir / "output.log").read_text()
    said = re.search(r"stopped at epoch (\d+), step (\d+)", output)  # rank 0 prints it, past the barrier
    assert said is not None, output[-2000:]
    saved = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert (saved["epoch"], saved["step"]) == (int(said.group(1)), int(said.group(2)))
    assert saved["epoch"] < 1000


def print_only_profile(tmp_path: Path, *args: str) -> Path:
    """profiles/print_only.toml as shipped, its command given `args` (a quick run) and run from the repo."""
    text = (REPO / "profiles" / "print_only.toml").read_text()
    command = 'command = ["python", "examples/print_only.py"]'
    assert text.count(command) == 1, "profiles/print_only.toml's command changed: update this test"
    text = text.replace(command, "command = " + json.dumps(["python", "examples/print_only.py", *args]))
    text = re.sub(r"(?m)^workdir = .*$", "workdir = " + json.dumps(str(REPO)), text)
    path = tmp_path / "print_only.toml"
    path.write_text(text)
    return path


def test_print_only_lines_become_metrics_through_the_profiles_metrics_regex(tmp_path: Path) -> None:
    run_dir = tmp_path / "printed"
    profile = print_only_profile(tmp_path, "--epochs", "2", "--delay", "0")
    result = run_cli("run", "--json", "--profile", str(profile), "--run-dir", str(run_dir), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    events = json_lines(result.stdout)
    assert events[-1]["event"] == "done", events[-3:]
    seen = metrics(events)
    assert seen and all(e["source"] == "output" for e in seen)
    output = (run_dir / "output.log").read_text()
    train = re.findall(r"Train Epoch: (\d+) .*\tLoss: ([0-9.]+)", output)
    test = re.findall(r"Accuracy: \d+/\d+ \((\d+)%\)", output)
    assert len(train) == 2 * 94 and len(test) == 2  # 938 batches an epoch, a line every 10
    # Every matching line is in one metrics event (a fast burst merges: `merged` counts them).
    assert sum(e.get("merged", 1) for e in seen) == len(train) + len(test)
    last_loss = next(e for e in reversed(seen) if "loss" in e["values"])
    assert last_loss["values"]["loss"] == float(train[-1][1]) and last_loss["epoch"] == 2
    last_test = next(e for e in reversed(seen) if "test_acc" in e["values"])
    assert last_test["values"]["test_acc"] == int(test[-1]) and "test_loss" in last_test["values"]
