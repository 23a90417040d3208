"""CPU hogs for benchmarks that measure beside a busy machine: `with busy_loops(2): ...` runs two
Python busy loops for the block's length (each killed at its end, however it ends)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from typing import Iterator

HOG = "while True:\n    pass\n"


def start_hogs(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", HOG], stdin=subprocess.DEVNULL) for _ in range(n)]


def stop_hogs(hogs: list[subprocess.Popen[bytes]]) -> None:
    for hog in hogs:
        if hog.poll() is None:
            hog.kill()
    for hog in hogs:
        try:
            hog.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process SIGKILL does not end
            pass


@contextlib.contextmanager
def busy_loops(n: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    hogs = start_hogs(n)
    try:
        yield hogs
    finally:
        stop_hogs(hogs)
