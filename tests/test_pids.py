"""gputui.model.pids, the one home of "does this pid still run, and is it the same process":
asked by the run store, the launcher's sweep and the cloud watcher. The /proc edge cases (names
with ')' or not ASCII, garbled stat) are in test_mutants_store.py through the store."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gputui.model.pids import process_alive, process_start

from .proc_support import wait_until


def test_this_process_runs_and_has_a_start_time() -> None:
    assert process_alive(os.getpid())
    start = process_start(os.getpid())
    assert start is not None and start.isdigit()


def test_no_process_has_a_number_past_pid_max_or_past_any_integer() -> None:
    past = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1
    for pid in (past, 2**64):
        assert not process_alive(pid) and process_start(pid) is None


def test_a_finished_child_not_yet_reaped_is_not_alive() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        # Wait for the zombie without reaping it: waitid with WNOWAIT leaves it a zombie.
        wait_until(lambda: os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT), 120,
                   "a child that runs `pass` to end")
        assert process_start(child.pid) is not None, "a zombie still has its /proc entry"
        assert not process_alive(child.pid)
    finally:
        child.wait(timeout=60)
    assert not process_alive(child.pid)
