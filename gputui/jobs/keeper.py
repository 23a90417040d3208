"""The keeper: the first process of a user's program run, between gputui and the program.

    python -m gputui.jobs.keeper --grace S -- PROGRAM [ARGS...]

gputui starts it in a session of its own with a parent-death signal (SIGTERM when gputui dies,
even by SIGKILL). It becomes a child subreaper, so every process the program forks and leaves
(daemons, data loaders, a shell's children) re-parents to it rather than to init, then starts
the program with the same output, environment and directory. On SIGTERM, SIGINT or SIGHUP it
sends SIGTERM to every descendant, waits up to S seconds for the program to save and exit,
then SIGKILLs whatever is left. When the program exits on its own, any process it left behind
gets the same SIGTERM, a short wait and SIGKILL. Its exit status is the program's (128+N for a
program ended by signal N; 127 when the program cannot be started, with one line on stderr).

So nothing of a program outlives its run, whichever way gputui ends: stopped, crashed or
SIGKILLed. Standard library and psutil only (no torch): it costs a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil

from gputui.model.supervisor import STOP_SIGNALS, become_subreaper, children_of

LEFTOVER_GRACE_S = 5.0  # a finished program's leftover processes get this long after SIGTERM
POLL_S = 0.05


def descendants() -> list[psutil.Process]:
    return children_of(psutil.Process(), recursive=True)


def signal_all(sig: int) -> None:
    for p in descendants():
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def reap() -> None:
    """Collect every exited child (orphans re-parented to us included)."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def end_all(grace_s: float) -> None:
    """SIGTERM to every descendant, up to `grace_s` for them to go, then SIGKILL; all reaped."""
    if not descendants():
        return
    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        reap()
        if not [p for p in descendants() if _alive(p)]:
            return
        time.sleep(POLL_S)
    signal_all(signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and descendants():
        reap()
        time.sleep(POLL_S)


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def status_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gputui.jobs.keeper")
    parser.add_argument("--grace", type=float, default=30.0)
    parser.add_argument("--parent", type=int, default=0, help="gputui's pid: if it is already gone, stop at once")
    parser.add_argument("--umask", type=lambda text: int(text, 8), default=None,
                        help="the user's umask, for the program (gputui itself runs with 077)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no program given after --")
    become_subreaper()
    stop: dict[str, Any] = {"deadline": None}

    def on_stop(signum: int, _frame: Any) -> None:
        if stop["deadline"] is None:
            stop["deadline"] = time.monotonic() + args.grace
            signal_all(signal.SIGTERM)

    for sig in STOP_SIGNALS:
        signal.signal(sig, on_stop)
    if stop["deadline"] is not None:  # stopped before the program started: it does not start
        return 128 + signal.SIGTERM
    if args.umask is not None:  # the program's files are made as the user would make them
        os.umask(args.umask)
    try:
        proc = subprocess.Popen(command)
    except OSError as exc:
        print(f"gputui: cannot start {command[0]}: {exc.strerror or exc}", file=sys.stderr)
        return 127
    if stop["deadline"] is not None:  # a stop that came while it started: it gets it too
        signal_all(signal.SIGTERM)
    if args.parent and os.getppid() != args.parent:  # gputui died before its death signal was armed
        on_stop(signal.SIGTERM, None)
    killed = False
    while proc.poll() is None:
        deadline = stop["deadline"]
        if deadline is not None and not killed and time.monotonic() >= deadline:
            signal_all(signal.SIGKILL)
            killed = True
        try:
            proc.wait(POLL_S)
        except subprocess.TimeoutExpired:
            pass
        reap_others(proc.pid)
    leftover = LEFTOVER_GRACE_S
    if stop["deadline"] is not None:
        leftover = max(0.0, min(leftover, stop["deadline"] - time.monotonic()))
    end_all(leftover)
    return status_of(proc.returncode)


def reap_others(program_pid: int) -> None:
    """Reap orphans that exited (never the program: Popen reaps it and keeps its status)."""
    for p in descendants():
        if p.pid == program_pid:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(p.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            pass


if __name__ == "__main__":
    raise SystemExit(main())
