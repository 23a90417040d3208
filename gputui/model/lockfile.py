"""One process at a time: an advisory lock on a file (flock), which names its holder.

The lock is the kernel's, so it goes with its holder: a master or a guard that is SIGKILLed
leaves nothing to clean up, and the next one takes the lock at once. The holder writes its pid
into the file, so whoever is refused can say who holds it. Used by the cloud budget guard (one
per cluster) and the sweep master (one per study).
"""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator


@dataclass(frozen=True)
class Lock:
    """What `exclusive` got: the lock (`mine`), or the pid its holder wrote (None: not known yet)."""

    mine: bool
    holder: int | None = None


def _holder(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


@contextmanager
def exclusive(path: Path) -> Iterator[Lock]:
    """Hold the lock on `path` for the block, or learn that another process holds it.

    Never waits. The file (and its directory) are created private, and kept afterwards: removing
    a lock file would let a third process lock a new file while the second still holds the old one.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield Lock(False, _holder(fd))
            return
        try:
            os.fchmod(fd, 0o600)  # one an older gputui made with the umask's mode
        except OSError:
            pass
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode("ascii"), 0)
        try:
            yield Lock(True)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
