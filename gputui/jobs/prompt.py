"""Whether a run's program waits for what its user types: `input()` or a `breakpoint()` reading
the terminal that `gputui run` was given as stdin (gputui.jobs.program passes that stdin on).

The terminal view draws a status line under the program's output and redraws it every second,
which would erase what the user types (the terminal echoes it where the cursor is). While a
process of the program sits in a read of that terminal, the view puts its status line away and
shows the prompt as a terminal would (gputui.views.program).

Linux only: each process's `/proc/PID/syscall` names the system call it is blocked in (a read,
on file descriptor 0) and `/proc/PID/fd/0` the file that is; anywhere else, or where /proc does
not say, nothing is detected and the status line stays (typing works, unseen).
"""

from __future__ import annotations

import os
import platform
import sys
import time
from typing import Iterable

LOOK_S = 0.2  # how often the program's processes are looked at while its output is quiet
QUIET_S = 0.3  # output this recent: the program is not waiting for a line (no look)
READ_SYSCALL = {"x86_64": 0, "amd64": 0, "aarch64": 63, "arm64": 63}  # read(2)'s number


class PromptWatch:
    """Looks, at most every LOOK_S, whether one of the program's processes reads the terminal."""

    def __init__(self, tty: str, read_nr: int) -> None:
        self.tty, self.read_nr = tty, read_nr
        self.looked = 0.0
        self.waiting = False

    @classmethod
    def for_stdin(cls) -> "PromptWatch | None":
        """A watch of this process's stdin, when it is a terminal on Linux; else None."""
        read_nr = READ_SYSCALL.get(platform.machine().lower())
        if read_nr is None or not sys.platform.startswith("linux"):
            return None
        try:
            if not os.isatty(0):
                return None
            return cls(os.ttyname(0), read_nr)
        except OSError:
            return None

    def check(self, pids: Iterable[int], quiet_since: float, now: float | None = None) -> bool | None:
        """True or False when that changed since the last call, else None. `quiet_since`: when
        the program last wrote output (a program that prints is not waiting)."""
        now = time.monotonic() if now is None else now
        if now - quiet_since < QUIET_S:
            waiting = False
        elif now - self.looked < LOOK_S:
            return None
        else:
            self.looked = now
            waiting = any(reads_terminal(pid, self.tty, self.read_nr) for pid in pids)
        if waiting == self.waiting:
            return None
        self.waiting = waiting
        return waiting


def reads_terminal(pid: int, tty: str, read_nr: int) -> bool:
    """Whether process `pid` is blocked in read(2) of its fd 0, and that fd is the terminal `tty`."""
    try:
        with open(f"/proc/{pid}/syscall", "rb") as fh:
            words = fh.read(64).split()
        if len(words) < 2 or words[0] != str(read_nr).encode() or words[1] != b"0x0":
            return False
        return os.readlink(f"/proc/{pid}/fd/0") == tty
    except (OSError, ValueError):
        return False
