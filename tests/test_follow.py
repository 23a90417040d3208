"""Following a run's events.jsonl (gputui.runs.follow) and the run.pid that says which
process a run is (gputui.runs.store): no Textual, no torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from gputui.runs import store as runs
from gputui.runs.follow import Follower
from tests.proc_support import wait_until


def line(n: int) -> bytes:
    return (json.dumps({"event": "step", "step": n, "loss": 1.0 / n}) + "\n").encode()


def test_a_line_written_in_pieces_is_read_once_whole(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + line(2)[:7])  # the run is half-way through writing its second event
    follower = Follower(path, alive=lambda: True)
    assert [e["step"] for e, _ in follower.read()] == [1]
    with open(path, "ab") as fh:
        fh.write(line(2)[7:] + line(3))
    assert [e["step"] for e, _ in follower.read()] == [2, 3]
    assert follower.read() == [] and follower.dropped == 0


def test_history_is_what_the_file_held_when_following_began(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(line(1) + line(2))
    follower = Follower(path, alive=lambda: True)
    with open(path, "ab") as fh:
        fh.write(line(3))
    # the last event it held is not history: a view shows the state it leads to
    assert [(e["step"], history) for e, history in follower.read()] == [(1, True), (2, False), (3, False)]


def test_reads_are_bounded_and_a_huge_line_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"".join(line(n) for n in range(1, 201)))
    follower = Follower(path, alive=lambda: True, max_read=1000, max_line=5000)
    first = follower.read()
    assert 0 < len(first) < 200  # one slice per poll, not the whole file
    rest = []
    while follower.offset < path.stat().st_size:
        rest += follower.read()
    assert [e["step"] for e, _ in first + rest] == list(range(1, 201))
    with open(path, "ab") as fh:  # not an event of ours: 20 kB on one line, then a good one
        fh.write(b"x" * 20000 + b"\n" + line(201) + b"[1, 2]\n" + b'{"torn": \n')
    got = []
    while follower.offset < path.stat().st_size:
        got += follower.read()
    assert [e["step"] for e, _ in got] == [201] and follower.dropped == 3


def test_events_end_when_the_run_has_ended_and_the_file_is_read(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    alive = threading.Event()
    alive.set()
    follower = Follower(path, alive=alive.is_set, interval_s=0.01)
    seen: list[int] = []

    def follow() -> None:
        seen.extend(e["step"] for e, _ in follower.events())

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    path.write_bytes(line(1))
    wait_until(lambda: seen == [1], 10, "the first event")
    with open(path, "ab") as fh:
        fh.write(line(2))
    alive.clear()  # the run ended right after its last write: that write is still read
    thread.join(10)
    assert not thread.is_alive() and seen == [1, 2]


def test_stop_ends_the_following_at_once(tmp_path: Path) -> None:
    follower = Follower(tmp_path / "never.jsonl", alive=lambda: True, interval_s=30)
    thread = threading.Thread(target=lambda: list(follower.events()), daemon=True)
    thread.start()
    follower.stop()
    thread.join(5)
    assert not thread.is_alive()


def test_run_pid_names_a_live_process_not_a_later_one_with_its_pid(tmp_path: Path) -> None:
    run = runs.RunDir(tmp_path / "r1")
    run.path.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        runs.write_pid(run, proc.pid, tmp_path / "p.toml")
        known = runs.live_process(run)
        assert known is not None and known.pid == proc.pid and known.profile == str(tmp_path / "p.toml")
        assert runs.live_runs(tmp_path) == [run]
        runs.write_pid(run, proc.pid)  # the run itself, later: the profile the dashboard noted stays
        assert runs.read_pid(run).profile == str(tmp_path / "p.toml")
        # the same pid, but another start time: a process that came later, not the run
        run.pidfile.write_text(f"{proc.pid}\n1\n\n")
        assert runs.live_process(run) is None
    finally:
        proc.kill()
        proc.wait()
    runs.write_pid(run, proc.pid)
    assert runs.live_process(run) is None and runs.live_runs(tmp_path) == []  # it ended
    runs.clear_pid(run, os.getpid())  # another pid's file is left alone
    assert run.pidfile.exists()
    runs.clear_pid(run, proc.pid)
    assert not run.pidfile.exists()


def test_gputui_runs_calls_a_run_with_a_live_pid_running(tmp_path: Path) -> None:
    """A run between two writes (a DDP launcher or a cluster master may hold no event log open)
    is running while its run.pid's process lives, and stopped once it is gone without a last word."""
    from gputui.runs import history

    run = runs.RunDir(tmp_path / "r1")
    run.path.mkdir()
    run.profile.write_text("[run]\nepochs = 2\n", encoding="utf-8")
    run.events.write_text(json.dumps({"event": "start", "run_id": "r1", "epochs": 2}) + "\n", encoding="utf-8")
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        runs.write_pid(run, proc.pid)
        assert [s.state for s in history.list_runs(tmp_path, tmp_path / "no-ledger.sqlite3")] == ["running"]
    finally:
        proc.kill()
        proc.wait()
    assert [s.state for s in history.list_runs(tmp_path, tmp_path / "no-ledger.sqlite3")] == ["stopped"]
