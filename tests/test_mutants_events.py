"""The training events' writers and readers, in process: run directories, the events.jsonl
log (encode, EventLog, read_events), a DDP rank's `error` event and a cluster rank's tagged
event lines. The CLI tests reach them only through subprocesses, which benchmarks/mutation.py
cannot see into."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path

import pytest

from gputui.cluster.worker import EVENT_TAG, emit_line
from gputui.model.errors import GputuiError, UserError
from gputui.model.paths import runs_home
from gputui.runs.store import EventLog, RunDir, create, encode, find, new_run_id, read_events
from gputui.train.distributed import error_event


def test_a_run_directory_names_its_files() -> None:
    run = RunDir(Path("/r/20260101-000000-abcd"))
    assert run.run_id == "20260101-000000-abcd"
    assert (run.profile, run.events, run.checkpoint) == (Path("/r/20260101-000000-abcd/profile.toml"),
                                                        Path("/r/20260101-000000-abcd/events.jsonl"),
                                                        Path("/r/20260101-000000-abcd/ckpt.pt"))


def test_a_run_id_is_date_time_and_four_random_hex_digits() -> None:
    ids = {new_run_id() for _ in range(20)}
    assert all(re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{4}", i) for i in ids)
    assert len(ids) > 1


def test_create_makes_a_fresh_directory_under_the_runs_home_by_default() -> None:
    run = create(None)
    assert run.path.parent == runs_home() and run.path.is_dir()


def test_create_makes_a_given_directory_with_its_parents(tmp_path: Path) -> None:
    run = create(tmp_path / "a" / "b")
    assert run.path == tmp_path / "a" / "b" and run.path.is_dir()


def test_create_takes_an_existing_empty_directory(tmp_path: Path) -> None:
    assert create(tmp_path).path == tmp_path


@pytest.mark.parametrize("existing", ["events.jsonl", "ckpt.pt"])
def test_create_refuses_a_directory_that_holds_a_run(tmp_path: Path, existing: str) -> None:
    (tmp_path / existing).write_text("")
    with pytest.raises(UserError, match="already holds a run; resume it with --resume"):
        create(tmp_path)


def test_create_says_why_a_directory_cannot_be_made(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match=r"cannot create run directory .*file/run: Not a directory$"):
        create(tmp_path / "file" / "run")


def make_run(path: Path) -> RunDir:
    path.mkdir(parents=True)
    (path / "profile.toml").write_text("[run]\n")
    return RunDir(path)


def test_find_last_is_the_run_written_most_recently_in_the_runs_home() -> None:
    home = runs_home()
    for written, name in ((300.0, "20260101-000000-aaaa"), (100.0, "20260301-000000-cccc"), (200.0, "20260201-000000-bbbb")):
        run = make_run(home / name)
        os.utime(run.profile, (written, written))  # no events yet: the profile says when it was written
    (home / "20270101-000000-dddd").mkdir()  # no profile: not a run
    assert find("last").path == home / "20260101-000000-aaaa"  # resumed after the newer ones ran
    (home / "20260301-000000-cccc" / "events.jsonl").write_text("")  # written now: it is last again
    assert find("last").path == home / "20260301-000000-cccc"


def test_find_last_with_no_runs_says_so() -> None:
    with pytest.raises(UserError, match="no runs in"):
        find("last")


def test_find_takes_a_run_id_or_a_directory(tmp_path: Path) -> None:
    by_id = make_run(runs_home() / "20260101-000000-aaaa")
    elsewhere = make_run(tmp_path / "mine")
    assert find("20260101-000000-aaaa") == by_id and find(str(elsewhere.path)) == elsewhere


def test_find_names_what_it_looked_for() -> None:
    with pytest.raises(UserError, match="--resume nope: no such run"):
        find("nope")


def test_an_event_is_one_line_of_json() -> None:
    assert encode({"event": "step", "step": 3, "loss": 0.5}) == '{"event": "step", "step": 3, "loss": 0.5}'


def test_an_event_with_nan_is_refused_not_written_as_invalid_json() -> None:
    with pytest.raises(ValueError):
        encode({"event": "step", "loss": float("nan")})


def test_the_event_log_appends_lines_readable_at_once(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "start"}\n')
    log = EventLog(path)
    log.write('{"event": "step"}')
    assert path.read_text() == '{"event": "start"}\n{"event": "step"}\n'  # flushed, before close
    log.sync()
    log.close()


def test_an_event_log_that_cannot_be_opened_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(GputuiError, match=r"cannot write .*missing/events\.jsonl: No such file or directory"):
        EventLog(tmp_path / "missing" / "events.jsonl")


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs Linux's /dev/full (every write fails with ENOSPC)")
def test_a_full_disk_while_writing_events_says_to_free_space_and_resume() -> None:
    log = EventLog(Path("/dev/full"))
    with pytest.raises(GputuiError, match=r"cannot write /dev/full: No space left on device; free space and --resume"):
        log.write('{"event": "step"}')


def test_read_events_skips_a_torn_line_and_keeps_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_text('{"event": "start"}\n{"event": "st\n{"event": "done"}\n{"event": "x')
    assert read_events(path) == [{"event": "start"}, {"event": "done"}]


def test_read_events_of_a_run_without_events_is_empty(tmp_path: Path) -> None:
    assert read_events(tmp_path / "events.jsonl") == []


def test_a_ranks_error_event_carries_the_message_and_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(time, "time", lambda: 1234.56789)
    assert error_event(UserError("profile.toml: bad key")) == {
        "event": "error", "time": 1234.568, "message": "profile.toml: bad key", "exit_code": 2}
    assert error_event(GputuiError("nccl failed"))["exit_code"] == 1


def test_a_cluster_rank_prints_each_event_as_one_tagged_line(capsys: pytest.CaptureFixture[str]) -> None:
    emit_line({"event": "step", "step": 3})
    out = capsys.readouterr().out
    assert out == EVENT_TAG + '{"event": "step", "step": 3}\n'
    assert json.loads(out[len(EVENT_TAG):]) == {"event": "step", "step": 3}
