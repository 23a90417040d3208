"""A newcomer's first hour: a typo leaves no run behind, and a resumed run's time and cost are
the sums over its segments."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gputui.cli import main
from gputui.cloud.costs import report
from gputui.cloud.ledger import SCHEMA_VERSION, Ledger, default_path
from gputui.runs.history import ledger_view
from gputui.model.cloud import InstanceInfo
from gputui.model.paths import runs_home

T = 1_800_000_000.0


def bad_devices() -> list[str]:
    """Two device specs this machine cannot train on (cuda and cuda:3 on a machine without CUDA)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return ["cuda", "cuda:3"] if count == 0 else [f"cuda:{count}", f"cuda:{count + 3}"]


def no_run_left() -> None:
    home = runs_home()
    assert not home.exists() or list(home.iterdir()) == [], list(home.iterdir())
    ledger = Ledger.existing()
    if ledger is not None:
        with ledger:
            assert ledger.runs() == []


@pytest.mark.parametrize("which", [0, 1])
def test_a_device_this_machine_lacks_exits_2_and_leaves_no_run(which: int, capsys: pytest.CaptureFixture[str]) -> None:
    spec = bad_devices()[which]
    assert main(["run", "--device", spec]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gputui: error: --device {spec}: ") and err.count("\n") == 1
    no_run_left()


def test_a_data_directory_without_the_idx_files_exits_2_and_leaves_no_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "notes.txt").write_text("not MNIST")
    assert main(["run", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "missing train-images-idx3-ubyte[.gz]" in err and err.count("\n") == 1
    no_run_left()


def test_a_missing_data_directory_exits_2_and_leaves_no_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--data", str(tmp_path / "nonexistent")]) == 2
    assert "nonexistent: no such data directory" in capsys.readouterr().err
    no_run_left()


def test_a_check_failed_while_starting_removes_the_directory_it_made(
        small_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Found only once the data is loaded (inside the trainer, as a DDP rank finds its device).
    assert main(["run", "--data", str(small_data), "--batch-size", "4096"]) == 2
    assert "larger than the 512 training images" in capsys.readouterr().err
    no_run_left()


def test_a_run_dir_of_the_users_keeps_what_was_in_it(small_data: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    assert main(["run", "--data", str(small_data), "--batch-size", "4096", "--run-dir", str(mine)]) == 2
    assert sorted(p.name for p in mine.iterdir()) == ["keep.txt"]


def info(launched: float) -> InstanceInfo:
    return InstanceInfo("i-00000000000000001", "g4dn.xlarge", "us-east-1a", "running", "on-demand", launched)


def test_a_resumed_runs_time_and_cost_are_the_sums_of_its_segments(tmp_path: Path) -> None:
    path = tmp_path / "l.sqlite3"
    with Ledger(path) as ledger:
        ledger.record_launch(info(T), "ec2", "us-east-1", "lab", "me", 3.6)  # $0.001 a second
        ledger.start_run("r1", "lab", T + 100)
        ledger.end_run("r1", T + 640, "interrupted")  # 9 minutes
        ledger.start_run("r1", "lab", T + 1000)
        ledger.end_run("r1", T + 1148, "done")  # 2m28s
        (line,) = report(ledger, T + 2000)[1]
    assert line.duration(T + 2000) == pytest.approx(540 + 148)
    assert line.usd == pytest.approx(0.688)
    assert line.usd_per_hour(T + 2000) == pytest.approx(3.6)
    assert line.start == T + 100 and line.end == T + 1148
    statuses, costs = ledger_view(path, T + 2000)  # `gputui runs` shows the same cost
    assert statuses == {"r1": "done"} and costs["r1"] == pytest.approx(0.688)


def test_a_segment_a_killed_process_left_open_ends_where_the_next_begins(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite3") as ledger:
        ledger.start_run("r1", "local", T)  # killed: no end
        ledger.start_run("r1", "local", T + 300)
        ledger.end_run("r1", T + 360, "done")
        assert ledger.segments() == {"r1": [(T, T + 300), (T + 300, T + 360)]}
        assert report(ledger, T + 1000)[1][0].duration(T + 1000) == pytest.approx(360)
        ledger.start_run("r2", "local", T + 900)  # still going: counted to now
        assert report(ledger, T + 1000)[1][1].duration(T + 1000) == pytest.approx(100)


SCHEMA_3_RUNS = "CREATE TABLE runs (id TEXT PRIMARY KEY, cluster TEXT NOT NULL, started REAL NOT NULL, ended REAL, status TEXT)"


def test_a_schema_3_ledger_keeps_its_runs_as_one_segment_each(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    with Ledger(path):
        pass
    raw = sqlite3.connect(path)  # back to schema 3: no segments table
    raw.execute("DROP TABLE segments")
    raw.execute("INSERT INTO runs VALUES ('old', 'local', ?, ?, 'done')", (T, T + 60))
    raw.execute("PRAGMA user_version = 3")
    raw.commit()
    raw.close()
    for _ in range(2):  # the second open finds the segment there and adds none
        with Ledger(path) as ledger:
            assert ledger.schema_version() == SCHEMA_VERSION
            assert ledger.segments() == {"old": [(T, T + 60)]}
            assert ledger.runs() == [("old", "local", T, T + 60, "done")]
    with Ledger(path) as ledger:
        ledger.start_run("old", "local", T + 100)
        ledger.end_run("old", T + 130, "done")
        assert report(ledger, T + 200)[1][0].duration(T + 200) == pytest.approx(90)


def test_gputui_cost_adds_a_resumed_runs_segments(small_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["run", "--model", "fast", "--data", str(small_data), "--json"]
    assert main([*args, "--epochs", "1"]) == 0
    assert main(["run", "--resume", "last", "--epochs", "2", "--json"]) == 0
    capsys.readouterr()
    with Ledger(default_path()) as ledger:
        (segments,) = ledger.segments().values()
    assert len(segments) == 2 and all(end is not None for _start, end in segments)
    assert main(["cost", "--json"]) == 0
    (run,) = json.loads(capsys.readouterr().out)["runs"]
    both = sum(end - start for start, end in segments)  # type: ignore[operator]
    assert run["duration_s"] == pytest.approx(both, abs=0.1)
