"""The run history of a run of the user's own program (`gputui run -- PROGRAM`, issue 31): how
`gputui runs` lists it (the program's name where a net's model is, its objective's last and best
value), `gputui runs export ID --csv` (a column for every metric it reported), and the summary
cache (summary.json) folding its events. Runs are written by hand with gputui's own event
builder and encoder (events.make, store.encode); one real `gputui run -- python -c ...` at the end."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.model.events import make
from gputui.runs import history, summaries
from gputui.runs import store as runs

from .conftest import cli_env

PROGRAM = "python train.py --lr 3"
# What `gputui run -- PROGRAM` writes as the run's profile: the [run] defaults (a net's among them) and the command.
PROFILE = '[run]\nmodel = "seed"\ndevice = "auto"\nstrategy = "single"\nepochs = 12\ncommand = ["python", "train.py", "--lr", "3"]\n'


def start(**extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"run_id": "p", "run_dir": "/runs/p", "program": PROGRAM, "workdir": "/w", "device": "cpu",
                              "device_choice": "no GPU", "gpus": [], "strategy": "single", "world_size": 1,
                              "resumed": False, "direction": "maximize"}
    fields.update(extra)
    return make("start", **fields)


def metrics(values: dict[str, float], elapsed: float, step: int | None = None, epoch: int | None = None,
            **extra: Any) -> dict[str, Any]:
    fields: dict[str, Any] = {"values": values, "elapsed_s": elapsed, "source": "report", **extra}
    if step is not None:
        fields["step"] = step
    if epoch is not None:
        fields["epoch"] = epoch
    return make("metrics", **fields)


def program_run(home: Path, events: list[dict[str, Any]], name: str = "p") -> runs.RunDir:
    run = runs.RunDir(home / name)
    run.path.mkdir(parents=True)
    run.profile.write_text(PROFILE)
    append(run, events)
    return run


def append(run: runs.RunDir, events: list[dict[str, Any]]) -> None:
    with open(run.events, "a", encoding="utf-8") as fh:
        fh.write("".join(runs.encode(event) + "\n" for event in events))


def listed(capsys: pytest.CaptureFixture[str], home: Path) -> dict[str, dict[str, Any]]:
    """`gputui runs --json --dir HOME`, by run id."""
    capsys.readouterr()
    assert main(["runs", "--json", "--dir", str(home)]) == 0
    return {r["run_id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}


def exported(capsys: pytest.CaptureFixture[str], home: Path, run_id: str = "p") -> list[list[str]]:
    """`gputui runs export ID --csv` (to stdout), as CSV rows, the header first."""
    capsys.readouterr()
    assert main(["runs", "export", run_id, "--csv", "--dir", str(home)]) == 0
    return list(csv.reader(io.StringIO(capsys.readouterr().out)))


# -- listing ----------------------------------------------------------------------------------------

def test_a_program_run_is_listed_by_its_program_name_not_the_profiles_default_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(), metrics({"loss": 1.0}, 1.5, step=1),
                           make("done", exit_code=0, elapsed_s=2.25, step=1)])
    row = listed(capsys, tmp_path)["p"]
    assert (row["model"], row["program"], row["state"], row["train_s"], row["epochs"]) == \
        ("train.py", PROGRAM, "done", 2.25, None)
    capsys.readouterr()
    assert main(["runs", "--dir", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert "train.py" in table and "seed" not in table and "0/12" not in table


def test_a_program_run_not_yet_started_is_named_from_its_profiles_command(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [])
    row = listed(capsys, tmp_path)["p"]
    assert (row["model"], row["program"]) == ("train.py", PROGRAM)


@pytest.mark.parametrize(("command", "name"), [
    ("python train.py --lr 3", "train.py"),
    ("/usr/bin/python3.11 -u /home/me/proj/train.py", "train.py"),
    ("python -m mypkg.train --epochs 2", "mypkg.train"),
    ("torchrun --nproc_per_node 2 train.py", "train.py"),
    ("env CUDA_LAUNCH_BLOCKING=1 python fit.py", "fit.py"),
    ("./a.out --epochs 3", "a.out"),
    ("python -c 'print(1)'", "python"),
    ("x" * 100, "x" * 31 + "…"),
])
def test_a_programs_name_is_the_script_it_runs_short(command: str, name: str) -> None:
    assert history.program_name(command) == name


@pytest.mark.parametrize(("direction", "best"), [("maximize", 0.9), ("minimize", 0.5)])
def test_the_objectives_last_and_best_value_follow_its_direction(
        direction: str, best: float, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(objective="val_acc", direction=direction),
                           metrics({"val_acc": 0.5, "loss": 2.0}, 1.0),
                           metrics({"loss": 1.0}, 1.5),  # no objective in it: changes neither
                           metrics({"val_acc": 0.9}, 2.0),
                           metrics({"val_acc": 0.1 if direction == "minimize" else 0.99}, 2.1, rank=1),  # another rank's
                           metrics({"val_acc": 0.7}, 3.0, epoch=2),
                           make("done", exit_code=0, elapsed_s=3.5)])
    row = listed(capsys, tmp_path)["p"]
    assert (row["objective"], row["direction"], row["objective_last"], row["objective_best"], row["epoch"]) == \
        ("val_acc", direction, 0.7, best, 2)
    cells = history.cells(history.RunSummary(**row))
    assert cells[5:8] == ["2", f"val_acc {best:g}", "0.7"]


def test_a_program_runs_code_is_its_latest_starts_and_the_listing_shows_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    commit = "0123456789abcdef0123456789abcdef01234567"
    program_run(tmp_path, [start(git_commit=commit, git_dirty=False), start(git_commit=commit, git_dirty=True)])
    program_run(tmp_path, [start(git_commit=commit)], name="q")  # git could not say whether it changed
    program_run(tmp_path, [start(git_commit=commit), start()], name="r")  # resumed outside the work tree
    rows = listed(capsys, tmp_path)
    assert [(rows[k]["git_commit"], rows[k]["git_dirty"]) for k in "pqr"] == [(commit, True), (commit, None),
                                                                               (None, None)]
    assert [history.cells(history.RunSummary(**rows[k]))[2] for k in "pqr"] == [
        "train.py @0123456-dirty", "train.py @0123456", "train.py"]


def test_without_an_objective_the_accuracy_columns_say_not_available(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(), metrics({"val_acc": 0.5}, 1.0)])
    row = listed(capsys, tmp_path)["p"]
    assert (row["objective"], row["objective_last"], row["objective_best"]) == (None, None, None)
    assert history.cells(history.RunSummary(**row))[5:8] == ["n/a", "n/a", "n/a"]


@pytest.mark.parametrize(("last", "state", "detail"), [
    (make("interrupted", reason="stopped by the user", elapsed_s=2.0, exit_code=-15), "interrupted", "stopped by the user"),
    (make("error", message="python exited with code 3: ValueError: bad", exit_code=3, elapsed_s=2.0), "failed",
     "python exited with code 3: ValueError: bad"),
    (None, "stopped", "ended without a last event (killed?)"),
])
def test_a_program_runs_state_is_its_last_word_as_for_a_net(last: dict[str, Any] | None, state: str, detail: str,
                                                            tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(), metrics({"loss": 1.0}, 1.0)] + ([last] if last else []))
    row = listed(capsys, tmp_path)["p"]
    assert (row["state"], row["detail"]) == (state, detail)


# -- the summary cache -------------------------------------------------------------------------------

def test_the_cached_summary_carries_the_objective_across_a_fold_from_its_offset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = program_run(tmp_path, [start(objective="val_acc"), metrics({"val_acc": 0.875}, 1.0)]
                      + [metrics({"loss": 1.0}, 2.0)] * 3)
    assert listed(capsys, tmp_path)["p"]["objective_best"] == 0.875
    # The 0.875 rewritten in place (same length, well before the bytes the cache checks): a listing
    # that read the file again from its start would see 0.125. The cache's fold goes on from its offset.
    body = run.events.read_bytes()
    assert body.count(b"0.875") == 1
    run.events.write_bytes(body.replace(b"0.875", b"0.125"))
    append(run, [metrics({"val_acc": 0.5}, 3.0), make("done", exit_code=0, elapsed_s=3.0)])
    row = listed(capsys, tmp_path)["p"]
    assert (row["objective_best"], row["objective_last"], row["state"]) == (0.875, 0.5, "done")


def test_a_summary_cached_before_program_runs_were_folded_is_folded_again(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = program_run(tmp_path, [start(objective="val_acc"), metrics({"val_acc": 0.5}, 1.0)])
    listed(capsys, tmp_path)
    cache = run.path / summaries.SUMMARY
    doc = json.loads(cache.read_text())
    new = ("program", "objective", "direction", "objective_last", "objective_best", "program_epoch")
    for part in ("digest", "whole"):  # as the format-1 cache had it: a net's fields, a model of None
        doc[part] = {k: v for k, v in doc[part].items() if k not in new}
    doc["format"] = 1
    cache.write_text(json.dumps(doc))
    row = listed(capsys, tmp_path)["p"]
    assert (row["model"], row["objective_best"]) == ("train.py", 0.5)


# -- export -----------------------------------------------------------------------------------------

def test_export_writes_a_column_for_every_metric_in_the_order_first_seen(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(),
                           metrics({"loss": 2.0, "acc": 0.1}, 0.5, step=1, epoch=0),
                           metrics({"loss": 1.5}, 1.0, step=2),
                           make("warning", reason="bad_report", message="a line that is not JSON"),
                           metrics({"val_acc": 0.25, "loss": 1.25}, 1.5, step=3, epoch=1),
                           make("done", exit_code=0, elapsed_s=2.0, step=3)])
    assert exported(capsys, tmp_path) == [
        ["elapsed_s", "step", "epoch", "loss", "acc", "val_acc"],
        ["0.5", "1", "0", "2.0", "0.1", ""],
        ["1.0", "2", "", "1.5", "", ""],
        ["1.5", "3", "1", "1.25", "", "0.25"],
    ]


def test_export_has_a_rank_column_only_when_a_report_has_a_rank(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    program_run(tmp_path, [start(strategy="ddp", world_size=2), metrics({"loss": 2.0}, 0.5, step=1, rank=0),
                           metrics({"loss": 2.5}, 0.5, step=1, rank=1)])
    assert exported(capsys, tmp_path) == [["elapsed_s", "step", "epoch", "rank", "loss"],
                                          ["0.5", "1", "", "0", "2.0"], ["0.5", "1", "", "1", "2.5"]]


def test_export_keeps_hostile_metric_names_as_data_in_their_own_columns(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    names = ['=HYPERLINK("http://x")', 'a,b "c"\nd', "+1", "x" * 5000, "ok"]
    program_run(tmp_path, [start(), metrics({name: float(i) for i, name in enumerate(names)}, 1.0, step=1)])
    header, row = exported(capsys, tmp_path)
    assert header[3:] == ["'=HYPERLINK(\"http://x\")", 'a,b "c" d', "'+1", "x" * 199 + "…", "ok"]
    assert row == ["1.0", "1", "", "0.0", "1.0", "2.0", "3.0", "4.0"]


def test_the_dashboards_export_of_a_program_run_is_the_same_csv(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = program_run(tmp_path, [start(), metrics({"loss": 2.0}, 0.5, step=1), metrics({"acc": 0.5}, 1.0, step=2)])
    path, count = history.export_csv(run.path)
    with open(path, newline="", encoding="utf-8") as fh:
        assert (list(csv.reader(fh)), count) == (exported(capsys, tmp_path), 2)


def test_a_nets_export_keeps_its_columns(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = runs.RunDir(tmp_path / "net")
    run.path.mkdir()
    run.profile.write_text('[run]\nmodel = "seed"\n')
    run.events.write_text("".join(runs.encode(e) + "\n" for e in (
        make("start", run_id="net", model="seed", device="cpu", strategy="single", epochs=1),
        make("step", step=1, epoch=1, loss=0.5, elapsed_s=0.1))))
    header, row = exported(capsys, tmp_path, "net")
    assert (header, row[:3], row[5]) == (list(history.CSV_COLUMNS), ["step", "1", "1"], "0.5")


# -- one real run ------------------------------------------------------------------------------------

@pytest.mark.integration
def test_a_real_program_run_is_listed_and_exported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "runs"
    profile = tmp_path / "p.toml"
    profile.write_text('[run]\nobjective = "val_acc"\ndirection = "maximize"\n')
    code = textwrap.dedent("""
        from gputui import report
        for i, acc in enumerate((0.25, 0.5, 0.75)):  # rising: reports a few microseconds apart may be merged
            report.log(step=i, epoch=i // 2, loss=1 / (i + 1), val_acc=acc)
    """)
    done = subprocess.run([sys.executable, "-m", "gputui", "run", "--profile", str(profile), "--json",
                           "--run-dir", str(home / "r1"), "--", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300, env=cli_env(), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    row = listed(capsys, home)["r1"]
    assert (row["model"], row["state"], row["objective"], row["objective_best"], row["objective_last"]) == \
        ("python", "done", "val_acc", 0.75, 0.75)
    table = exported(capsys, home, "r1")
    assert table[0] == ["elapsed_s", "step", "epoch", "loss", "val_acc"]
    assert table[1][1:] == ["0", "0", "1.0", "0.25"] and table[-1][1:] == ["2", "1", str(1 / 3), "0.75"]
