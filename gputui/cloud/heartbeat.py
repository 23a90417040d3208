"""The training heartbeat a cloud slave's watchdog reads ([cloud] stalled_minutes).

The lease proves the master lives, not that training moves: a hung collective keeps the GPU
at 100% and the master renewing. So every rank of a cluster node and every sweep worker
calls `beat()` at each step event; it writes the time (Unix seconds, one line) to
`heartbeat` in gputui's data home, which on a slave is the node's GPUTUI_HOME
(<remote_dir>/home, where its spot watcher registers the run). The watchdog powers the slave
off when a run is registered and the newest heartbeat is older than stalled_minutes.

Cheap: at most one write a second per process (a temporary file renamed over the last, so
the watchdog never reads half a number), and a failed write never stops training.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Callable

NAME = "heartbeat"
EVERY_S = 1.0  # the most often one process writes


class Heartbeat:
    """Writes the time to `path` (default: data_home()/heartbeat, found at the first write)
    when `beat()` is called, at most once every `every_s` seconds."""

    def __init__(self, path: Path | None = None, every_s: float = EVERY_S,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.every_s = every_s
        self.clock = clock
        self.monotonic = monotonic
        self._last: float | None = None

    def beat(self) -> None:
        now = self.monotonic()
        if self._last is not None and now - self._last < self.every_s:
            return
        self._last = now
        try:
            self.write(int(self.clock()))
        except OSError:
            pass  # a full disk or a removed home: the watchdog's limit decides, training goes on

    def write(self, seconds: int) -> None:
        """Replace the heartbeat with `seconds`, whole or not at all."""
        if self.path is None:
            from gputui.model.paths import data_home

            self.path = data_home() / NAME
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{NAME}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, f"{seconds}\n".encode("ascii"))
        finally:
            os.close(fd)
        os.replace(tmp, self.path)


_PROCESS = Heartbeat()


def beat() -> None:
    """This process's heartbeat (the one-line hook of the node's ranks and the sweep workers)."""
    _PROCESS.beat()
