"""One supervisor owns a run's process tree: processes in sessions of their own (torchrun's
workers) and orphans of a dead parent are stopped too. (That nothing of a run outlives
`gputui run`, whichever way the command ends, is tests/test_stop_matrix.py.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from gputui.model.supervisor import Tree, become_subreaper

from .proc_support import wait_until

# A parent that starts a child in a session of its own (as torchrun does), says its pid, then
# waits for a signal (or, with "orphan", exits at once leaving the child behind).
SPAWN = r"""
import signal, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", sys.argv[1]], start_new_session=True)
print(child.pid, flush=True)
if sys.argv[2] == "orphan":
    sys.exit(0)
signal.pause()  # until a signal ends it
"""


@pytest.fixture(autouse=True)
def not_a_subreaper_afterwards() -> Iterator[None]:
    """A Tree made here turns pytest into a subreaper: undo it, so later tests' orphans go to init."""
    yield
    become_subreaper(False)


def gone(p: psutil.Process) -> bool:
    try:
        return not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def spawn(tmp_path: Path, mode: str) -> tuple["subprocess.Popen[bytes]", psutil.Process]:
    marker = str(tmp_path / f"run-{mode}")
    proc = subprocess.Popen([sys.executable, "-c", SPAWN, marker, mode], stdout=subprocess.PIPE,
                            start_new_session=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded by pytest-timeout; the child prints at once
    return proc, psutil.Process(int(line))


def test_a_process_in_its_own_session_is_stopped_with_its_parent(tmp_path: Path) -> None:
    proc, grandchild = spawn(tmp_path, "wait")
    tree = Tree(proc)
    assert grandchild.pid in [p.pid for p in tree.refresh()]
    tree.stop(grace_s=10)
    assert proc.poll() is not None
    wait_until(lambda: gone(grandchild), 10, "the grandchild in its own session to end")


def test_an_orphan_seen_before_is_stopped_after_its_parent_died(tmp_path: Path) -> None:
    proc, grandchild = spawn(tmp_path, "wait")
    tree = Tree(proc, marker=str(tmp_path / "run-wait"))
    tree.refresh()  # seen while its parent lives
    os.kill(proc.pid, signal.SIGKILL)  # the parent dies without stopping it (torchrun SIGKILLed)
    proc.wait(10)
    assert grandchild.is_running()
    tree.stop(grace_s=10)
    wait_until(lambda: gone(grandchild), 10, "the orphan to end")


def test_an_orphan_never_seen_is_adopted_by_its_run_marker(tmp_path: Path) -> None:
    # The subreaper: the orphan re-parents to this process, and its command line names the run.
    become_subreaper()  # as gputui does before it starts torchrun
    proc, grandchild = spawn(tmp_path, "orphan")
    proc.wait(10)
    tree = Tree(proc, marker=str(tmp_path / "run-orphan"))
    try:
        wait_until(lambda: grandchild.ppid() == os.getpid(), 10, "the orphan to re-parent to this process")
        assert grandchild.pid in [p.pid for p in tree.refresh()]
    finally:
        tree.stop(grace_s=10)
    wait_until(lambda: gone(grandchild), 10, "the adopted orphan to end")


def test_the_group_signal_goes_only_to_a_group_the_live_root_leads(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A reaped root's pid may be reused by another group's leader: it is never signalled as a group."""
    sent: list[int] = []
    monkeypatch.setattr(os, "killpg", lambda pgid, sig: sent.append(pgid))
    leader = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
    member = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    try:
        Tree(leader).send(signal.SIGCONT)
        Tree(member).send(signal.SIGCONT)  # in pytest's own group: no group signal
        assert sent == [leader.pid]
    finally:
        for proc in (leader, member):
            proc.kill()
            proc.wait(30)
    Tree(leader).send(signal.SIGKILL)  # reaped
    assert sent == [leader.pid]


@pytest.mark.parametrize("error", [ValueError("invalid literal for int() with base 10: b'\\x00\\x00'"),
                                   IndexError("list index out of range"), OSError(9, "Bad file descriptor")])
def test_a_torn_read_of_the_process_table_is_read_again(monkeypatch: pytest.MonkeyPatch, error: Exception) -> None:
    """psutil parses every /proc/PID/stat to find children; a read of a process being torn down once
    came back as NUL bytes (ValueError in psutil), and once cut short (IndexError): the tree reads
    again instead of failing a stop."""
    from gputui.model import supervisor

    calls = {"n": 0}
    real = psutil.Process.children

    def torn(self: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
        calls["n"] += 1
        if calls["n"] == 1:
            raise error
        return real(self, recursive=recursive)

    monkeypatch.setattr(psutil.Process, "children", torn)
    assert supervisor.children_of(psutil.Process()) == real(psutil.Process())
    assert calls["n"] == 2


def test_a_stop_reads_the_table_again_when_opening_this_process_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop thread of a DDP run once failed to open this very process's /proc stat (OSError
    EBADF, in `psutil.Process()`), and printed a traceback: a refresh reads again, and a process
    whose table cannot be read at all stays known (it is signalled again, not forgotten)."""
    from gputui.model import supervisor

    # A process that lives until the test closes its stdin (no clock: it ends on that event).
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        tree = Tree(proc, marker="(none)")
        real = psutil.Process.__init__
        fails = {"n": 0}

        def flaky(self: psutil.Process, pid: int | None = None) -> None:
            if fails["n"] < 2:
                fails["n"] += 1
                raise OSError(9, "Bad file descriptor")
            real(self, pid)

        monkeypatch.setattr(psutil.Process, "__init__", flaky)
        assert [p.pid for p in tree.refresh()] == [proc.pid]
        assert fails["n"] == 2
        monkeypatch.setattr(psutil.Process, "__init__", real)
        monkeypatch.setattr(psutil.Process, "status", lambda self: (_ for _ in ()).throw(OSError(9, "Bad file descriptor")))
        assert supervisor._alive(psutil.Process(proc.pid))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


# A launcher (as torchrun): starts a worker in a session of its own (with "alone", none), says its
# pid, notes and ignores SIGTERM, and waits (as torchrun in its exit barrier waits for peers that are
# gone) until SIGKILL; the worker ends on SIGTERM. Both block in pause(): no clock anywhere.
LAUNCHER = r"""
import signal, subprocess, sys
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[2], "a").write("term\n"))
if sys.argv[1] == "alone":
    print(0, flush=True)
else:
    worker = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
    print(worker.pid, flush=True)
while True:
    signal.pause()
"""


_STARTED: list["subprocess.Popen[bytes]"] = []


@pytest.fixture(autouse=True)
def no_launcher_left() -> Iterator[None]:
    """A launcher of a failed (or timed-out) test is killed with its group, worker included."""
    yield
    while _STARTED:
        proc = _STARTED.pop()
        if proc.poll() is None:
            for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
                try:
                    p.kill()  # the worker too: it runs in a session of its own
                except psutil.NoSuchProcess:
                    pass
            proc.wait(10)


def _launcher(tmp_path: Path, mode: str) -> "subprocess.Popen[bytes]":
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, mode, str(tmp_path / "terms")],
                            stdout=subprocess.PIPE, start_new_session=True)
    _STARTED.append(proc)
    assert proc.stdout is not None
    proc.stdout.readline()  # bounded by pytest-timeout; it prints at once
    return proc


def _stop_in_thread(tree: Tree, grace_s: float) -> "threading.Thread":
    import threading

    thread = threading.Thread(target=tree.stop, args=(grace_s,), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("when", ["on SIGTERM", "before the stop"])
def test_a_stopped_launcher_whose_workers_ended_is_killed_without_waiting_out_the_grace(tmp_path: Path, when: str) -> None:
    proc = _launcher(tmp_path, "worker")
    tree = Tree(proc, launcher=True)
    worker = next(p for p in tree.refresh() if p.pid != proc.pid)
    if when == "before the stop":  # a program's workers that saw the stop file and exited before SIGTERM
        worker.kill()
        wait_until(lambda: gone(worker), 60, "the worker to end before the stop")
    stopping = _stop_in_thread(tree, 3600.0)  # a grace no test waits out: only the launcher rule ends it
    wait_until(lambda: gone(worker), 60, "the worker to end")
    stopping.join(120)
    assert not stopping.is_alive(), "the stop waited for a launcher left alone (its peers are gone)"
    assert proc.returncode == -signal.SIGKILL and "term" in (tmp_path / "terms").read_text()  # asked first


def test_a_launcher_alone_is_killed_and_a_root_that_is_not_one_keeps_its_whole_grace(tmp_path: Path) -> None:
    # No worker under it at all (stopped in its rendezvous): nothing to wait for either.
    proc = _launcher(tmp_path, "alone")
    stopping = _stop_in_thread(Tree(proc, launcher=True), 3600.0)
    stopping.join(120)
    assert not stopping.is_alive() and proc.returncode == -signal.SIGKILL
    # A root that is not a launcher (a user's program, its helper ended) keeps its whole grace.
    proc = _launcher(tmp_path, "worker")
    tree = Tree(proc, alone_s=0.0)
    worker = next(p for p in tree.refresh() if p.pid != proc.pid)
    stopping = _stop_in_thread(tree, 3600.0)
    wait_until(lambda: gone(worker), 60, "the worker to end on SIGTERM")
    assert proc.poll() is None and stopping.is_alive()  # a cut-short stop would kill it within alone_s = 0
    tree.kill()
    stopping.join(120)
    assert proc.returncode == -signal.SIGKILL
