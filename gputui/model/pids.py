"""Which process a pid is: whether it still runs, and when it started (to tell it from a later
process that reuses its number). One home for both, used by the run store, the launcher's sweep
and the cloud watcher. Linux's /proc where it exists; `os.kill(pid, 0)` otherwise."""

from __future__ import annotations

import os


def _stat_fields(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (which may hold spaces and ')')."""
    with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
        stat = fh.read()
    return stat[stat.rindex(")") + 2:].split()


def process_start(pid: int) -> str | None:
    """The process's start time as /proc gives it (clock ticks since boot), to tell it from a
    later process that reuses its pid; None where that cannot be read (no /proc, gone)."""
    try:
        return _stat_fields(pid)[19]
    except (OSError, ValueError, IndexError):
        return None


def process_alive(pid: int) -> bool:
    """Whether the process exists and has not ended (a zombie, finished but not yet reaped by its
    parent, has). Another account's process exists; a number no pid can be does not."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # gone, or a number no pid can be
        return False
    except PermissionError:
        pass  # another user's: it exists
    try:
        return _stat_fields(pid)[0] != "Z"
    except (OSError, ValueError, IndexError):
        return True  # no /proc to ask: os.kill said it exists
