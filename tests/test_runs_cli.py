"""`gputui runs` (the run history) and `gputui runs export ID --csv`, on real runs and hand-made run dirs."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui.runs import history
from gputui.runs import store as runs
from gputui.cli import main
from gputui.cloud.ledger import Ledger

from .conftest import cli_env, json_lines
from .proc_support import Child


def listed(capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, dict[str, Any]]:
    """`gputui runs --json`, by run id."""
    capsys.readouterr()
    assert main(["runs", "--json", *extra]) == 0
    doc = json.loads(capsys.readouterr().out)
    return {r["run_id"]: r for r in doc["runs"]}


def hand_made(home: Path, name: str, events: list[dict[str, Any]]) -> runs.RunDir:
    """A run directory written by hand (the events are built here, as data from disk is)."""
    run = runs.RunDir(home / name)
    run.path.mkdir(parents=True)
    run.profile.write_text('[run]\nmodel = "fast"\ndevice = "auto"\nstrategy = "ddp"\nepochs = 4\n')
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events))
    return run


START = {"event": "start", "time": 1_000_000_000.0, "run_id": "x", "model": "fast", "device": "cuda:0",
         "strategy": "ddp", "world_size": 2, "epochs": 4, "total_steps": 40}


def test_a_finished_run_is_listed_with_its_numbers_and_cost(small_data: Path, gputui_home: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "2", "--batch-size", "64"]) == 0
    events = json_lines(capsys.readouterr().out)
    run_id = events[0]["run_id"]
    done = events[-1]
    accs = [e["test_acc"] for e in events if e["event"] in ("eval", "epoch")]
    # A second run, not in the cost ledger, and energy billed to the first.
    hand_made(gputui_home / "runs", "unrecorded", [START])
    with Ledger() as ledger:
        ledger.add_energy("gpu0", "local", run_id, events[0]["time"], done["time"], 0.5, 0.3)  # inside the run
    found = listed(capsys)
    assert set(found) == {run_id, "unrecorded"}
    row = found[run_id]
    assert (row["model"], row["device"], row["strategy"], row["world_size"]) == ("seed", "cpu", "single", 1)
    assert (row["epochs_done"], row["epochs"], row["state"]) == (2, 2, "done")
    assert row["started"] == events[0]["time"] and row["path"] == str(gputui_home / "runs" / run_id)
    assert row["best_acc"] == max(accs) and row["final_acc"] == done["test_acc"]
    assert row["train_s"] == done["elapsed_s"]
    assert row["cost_usd"] == pytest.approx(0.15)
    assert found["unrecorded"]["cost_usd"] is None  # not in the ledger: n/a, not $0
    assert list(found) == ["unrecorded", run_id]  # oldest first
    # The table says the same.
    assert main(["runs"]) == 0
    table = capsys.readouterr().out
    line = next(ln for ln in table.splitlines() if run_id in ln)
    for cell in ("seed", "cpu", "single", "2/2", f"{done['test_acc']:.2f}%", "$0.1500", "done"):
        assert cell in line, (cell, line)
    assert "n/a" in next(ln for ln in table.splitlines() if "unrecorded" in ln)


def test_states_from_the_last_event_and_the_ledger(gputui_home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = gputui_home / "runs"
    step = {"event": "step", "time": 1_000_000_001.0, "epoch": 1, "step": 5, "loss": 1.0, "elapsed_s": 1.0}
    hand_made(home, "done", [START, step, {"event": "done", "step": 40, "epochs": 4, "test_acc": 90.0, "best_acc": 91.0}])
    hand_made(home, "interrupted", [START, step, {"event": "interrupted", "step": 5, "epoch": 1, "reason": "SIGTERM"}])
    hand_made(home, "failed", [START, step, {"event": "error", "message": "CUDA out of memory [cloud]x", "exit_code": 1}])
    hand_made(home, "killed", [START, step])
    hand_made(home, "crashed", [START, step])
    hand_made(home, "resumed-then-killed", [START, {"event": "interrupted", "step": 5, "reason": "SIGINT"}, START])
    hand_made(home, "nothing", [])
    with Ledger() as ledger:
        ledger.start_run("crashed", "local", 1_000_000_000.0)
        ledger.end_run("crashed", 1_000_000_002.0, "failed")
    found = listed(capsys)
    states = {k: (v["state"], v["detail"]) for k, v in found.items()}
    assert states["done"] == ("done", None)
    assert states["interrupted"] == ("interrupted", "SIGTERM")
    assert states["failed"] == ("failed", "CUDA out of memory [cloud]x")
    assert states["killed"][0] == "stopped" and "without a last event" in states["killed"][1]
    assert states["crashed"][0] == "failed"  # the ledger saw it fail
    assert states["resumed-then-killed"][0] == "stopped"
    assert states["nothing"][0] == "stopped"
    assert found["done"]["best_acc"] == 91.0 and found["done"]["final_acc"] == 90.0
    # Profile values where no start event says better.
    assert (found["nothing"]["model"], found["nothing"]["device"], found["nothing"]["epochs"]) == ("fast", "auto", 4)
    assert main(["runs"]) == 0
    out = capsys.readouterr().out
    assert "CUDA out of memory [cloud]x" in out and "ddp x2" in out  # data is text, never markup


def test_a_run_is_running_while_its_process_writes_its_log(medium_data: Path, gputui_home: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--json", "--data", str(medium_data), "--epochs", "3", "--batch-size", "4", "--threads", "1",
            "--evals-per-epoch", "4"]
    with Child([sys.executable, "-m", "gputui", *args], env=cli_env(), name="gputui run") as child:
        start = child.wait_for(lambda e: e["event"] == "eval", 240, "the first evaluation")
        run_id = child.events[0]["run_id"]
        row = listed(capsys)[run_id]
        assert row["state"] == "running" and row["final_acc"] == start["test_acc"], row
        # A reader of the log (a dashboard, `tail -f`) does not make it run.
        reader = subprocess.Popen([sys.executable, "-c", "import sys; f = open(sys.argv[1]); print('open', flush=True); "
                                   "sys.stdin.read()", str(gputui_home / "runs" / run_id / "events.jsonl")],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert reader.stdout is not None and reader.stdout.readline() == "open\n"
            child.proc.kill()
            child.finish(60, "the killed run's remaining output")
            row = listed(capsys)[run_id]
        finally:
            reader.kill()
            reader.wait(30)
    assert row["state"] == "stopped", row


def test_export_writes_the_curves(small_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_dir = tmp_path / "r"
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "2", "--batch-size", "64",
                 "--evals-per-epoch", "2", "--run-dir", str(run_dir)]) == 0
    events = json_lines(capsys.readouterr().out)
    curve = [e for e in events if e["event"] in ("step", "eval", "epoch")]
    assert main(["runs", "export", str(run_dir), "--csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [r["event"] for r in rows] == [e["event"] for e in curve]
    assert list(rows[0]) == list(history.CSV_COLUMNS)
    for row, event in zip(rows, curve):
        for column in history.CSV_COLUMNS[1:]:
            expected = event.get(column)
            assert (float(row[column]) if row[column] else None) == expected, (column, row, event)
    # To a file, and by id under --dir.
    target = tmp_path / "curves.csv"
    assert main(["runs", "export", "r", "--dir", str(tmp_path), "--csv", str(target)]) == 0
    assert f"wrote {len(curve)} rows" in capsys.readouterr().err
    assert list(csv.DictReader(target.open())) == rows


@pytest.mark.parametrize("args, message", [
    (["runs", "export", "nope", "--csv"], "nope: no such run"),
    (["runs", "export", "last"], "name the format: --csv"),
])
def test_export_errors_are_one_line(args: list[str], message: str, small_data: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "64"]) == 0
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err


def test_a_resume_replaces_the_steps_it_repeats() -> None:
    """A run killed past its checkpoint re-runs those steps: each step appears once in the curves."""
    events = [START] + [{"event": "step", "step": s, "epoch": 1, "loss": 2.0 - s / 10} for s in (2, 4, 6, 8)]
    events.append({"event": "eval", "step": 8, "epoch": 1, "test_acc": 50.0})
    events.append({**START, "resumed_from_step": 4})
    events += [{"event": "step", "step": s, "epoch": 1, "loss": 1.0 - s / 100} for s in (6, 8)]
    rows = history.curves(events)
    assert [(r["event"], r["step"]) for r in rows] == [("step", 2), ("step", 4), ("step", 6), ("step", 8)]
    assert rows[-1]["loss"] == pytest.approx(0.92)


def test_no_runs_yet(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs"]) == 0
    assert "no runs in" in capsys.readouterr().err


def test_runs_does_not_load_torch(small_data: Path, tmp_path: Path) -> None:
    hand_made(tmp_path / "runs", "r", [START, {"event": "step", "step": 1, "loss": 1.0}])
    code = ("import sys; from gputui.cli import main; "
            f"assert main(['runs', '--dir', {str(tmp_path / 'runs')!r}]) == 0; "
            f"assert main(['runs', 'export', 'r', '--dir', {str(tmp_path / 'runs')!r}, '--csv']) == 0; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=cli_env())
    assert result.returncode == 0, result.stderr
    assert "fast" in result.stdout and "\nstep,1," in result.stdout


# -- gputui runs rm ------------------------------------------------------------------------------

DONE = [START, {"event": "done", "step": 40, "epochs": 4, "test_acc": 90.0, "best_acc": 91.0}]


def test_rm_removes_finished_runs_and_keeps_their_spend(gputui_home: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    home = gputui_home / "runs"
    keep = hand_made(home, "keep", DONE)
    gone = [hand_made(home, name, DONE) for name in ("old-1", "old-2")]
    (gone[0].path / "ckpt.pt").write_bytes(b"\0" * 5000)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious.txt").write_text("mine")
    (gone[1].path / "data").symlink_to(outside)  # a link inside a run: removed, never followed
    (gone[1].path / "file").symlink_to(outside / "precious.txt")
    with Ledger() as ledger:
        ledger.start_run("old-1", "local", 1_000_000_000.0)
        ledger.end_run("old-1", 1_000_000_100.0, "done")
    capsys.readouterr()
    assert main(["runs", "rm", "old-1", str(gone[1].path), "old-1", "--yes"]) == 0  # a run named twice: once
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("removed run old-1 (") and "KiB" in err[0]
    assert err[1].startswith("removed run old-2 (") and len(err) == 2, err
    assert not gone[0].path.exists() and not gone[1].path.exists() and keep.path.is_dir()
    assert (outside / "precious.txt").read_text() == "mine"
    assert set(listed(capsys)) == {"keep"}
    with Ledger() as ledger:
        assert "old-1" in {run_id for run_id, *_rest in ledger.runs()}  # money spent is history


@pytest.mark.parametrize("case", ["unknown", "running", "elsewhere", "linked", "no terminal"])
def test_rm_refuses_in_one_line_and_removes_nothing(case: str, gputui_home: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    home = gputui_home / "runs"
    other = hand_made(home, "other", DONE)
    elsewhere = hand_made(tmp_path / "project", "myrun", DONE)  # a --run-dir inside the user's own project
    refs, message = {
        "unknown": (["nothere"], "runs rm nothere: no such run"),
        "running": (["live"], "runs rm live: run live is running; stop it first"),
        "elsewhere": ([str(elsewhere.path)], f"is not a run directory in {home}"),
        "linked": (["link"], f"is not a run directory in {home}"),
        "no terminal": (["live"], "runs rm: removing 2 runs: no terminal to ask on, pass --yes to go ahead"),
    }[case]
    live = hand_made(home, "live", [START])
    if case == "running":
        runs.write_pid(live, os.getpid())  # this test's process: alive, and the one that wrote it
    (home / "link").symlink_to(elsewhere.path)
    capsys.readouterr()
    assert main(["runs", "rm", "other", *refs] + ([] if case == "no terminal" else ["--yes"])) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert other.path.is_dir() and live.path.is_dir() and elsewhere.events.is_file()


@pytest.mark.parametrize("answer", ["n", "y"])
def test_rm_on_a_terminal_asks_first(answer: str, gputui_home: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.views import cloud as view

    run = hand_made(gputui_home / "runs", "r1", DONE)
    asked: list[str] = []
    monkeypatch.setattr(view.sys.stdin, "isatty", lambda: True, raising=False)
    monkeypatch.setattr("builtins.input", lambda question: asked.append(question) or answer)
    assert main(["runs", "rm", "r1"]) == (0 if answer == "y" else 1)
    err = capsys.readouterr().err
    assert len(asked) == 1 and asked[0].startswith("remove 1 run (") and asked[0].endswith("? [y/N] ")
    assert "r1  done  " in err  # what it would remove, listed before the question
    assert run.path.exists() == (answer == "n")
    assert ("nothing removed" in err) == (answer == "n")
