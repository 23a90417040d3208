"""The threads behind SshSource's rounds: small pools of named daemon workers for the steps
that block (connecting, opening a channel, sending a request), and one reader thread that
waits on every host's open poll channel at once, so a host whose answer is slow or never
comes holds no thread while the others are read.

The reader watches paramiko channels through their `fileno()` (a pipe paramiko sets while the
channel has data or is closed) with a selector, and runs each channel's callback in its own
thread when it is readable, and timers at their deadlines. Callbacks must not block. A watched
channel is closed by the reader only (`forget`): closing it elsewhere would close the file
descriptor the selector still holds.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
import selectors
import threading
import time
from typing import Any, Callable

__all__ = ["CONNECT_WORKERS_CAP", "POLL_WORKERS_CAP", "Pool", "Reader", "free_cpus", "pool_sizes", "reader", "spawn"]

log = logging.getLogger(__name__)

# The pools' sizes. Poll workers only open channels and send a request line (the reader does the
# waiting), so a few per free CPU keep the CPUs busy; more would only queue on the GIL. Connect
# workers mostly wait (TCP, the banner, a dead host's whole connect_timeout), so there are more,
# capped so that 256 hosts starting at once do not start 256 threads.
POLL_WORKERS_CAP = 16
CONNECT_WORKERS_CAP = 32


def free_cpus() -> float:
    """CPUs not already busy: the CPU count less the 1-minute load average, at least 1."""
    total = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # not on this platform
        load = 0.0
    return max(1.0, min(float(total), total - load))


def pool_sizes(hosts: int) -> tuple[int, int]:
    """(poll workers, connect workers) for `hosts` hosts on this machine now."""
    poll = max(2, min(POLL_WORKERS_CAP, int(2 * free_cpus())))
    return max(1, min(hosts, poll)), max(1, min(hosts, CONNECT_WORKERS_CAP))


def spawn(job: Callable[[], None], name: str = "gputui-ssh-job") -> None:
    """Run `job` in a new daemon thread (for a host polled on its own, outside any pool)."""
    threading.Thread(target=job, name=name, daemon=True).start()


class Pool:
    """At most `size` named daemon threads taking jobs from one queue; started as jobs come
    while none is idle. Daemon threads: a job stuck in a connect never holds up the exit."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # workers waiting for a job
        self._queued = 0  # jobs no worker has taken yet
        self.running = 0  # jobs running now
        self.peak = 0  # the most jobs that ran at once

    def submit(self, job: Callable[[], None]) -> None:
        with self._lock:
            self._queued += 1
            if self._queued > self._idle and len(self._threads) < self.size:
                thread = threading.Thread(target=self._work, args=(self._jobs,), name=f"{self.name}-{len(self._threads)}",
                                          daemon=True)
                self._threads.append(thread)
                self._idle += 1
                thread.start()
            self._jobs.put(job)

    def _work(self, jobs: "queue.SimpleQueue[Callable[[], None] | None]") -> None:
        while True:
            job = jobs.get()
            if job is None:
                return
            with self._lock:
                current = jobs is self._jobs  # not a worker of before close()
                if current:
                    self._queued -= 1
                    self._idle -= 1
                self.running += 1
                self.peak = max(self.peak, self.running)
            try:
                job()
            except Exception:  # noqa: BLE001 - a job reports its own failures; this is a bug's last stop
                log.exception("%s: a job failed", self.name)
            finally:
                with self._lock:
                    self.running -= 1
                    if current and jobs is self._jobs:
                        self._idle += 1

    @property
    def threads(self) -> int:
        return len(self._threads)

    def close(self) -> None:
        """Let the workers end once the jobs queued before this are done."""
        with self._lock:
            jobs, self._jobs = self._jobs, queue.SimpleQueue()
            for _ in self._threads:
                jobs.put(None)
            self._threads, self._idle, self._queued = [], 0, 0  # a later job starts a new worker


class Reader:
    """One daemon thread reading every watched channel (see the module's docstring)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._orders: queue.SimpleQueue[tuple[str, Any, Any]] = queue.SimpleQueue()
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._watched: dict[int, tuple[Any, Callable[[], None], int]] = {}  # id(channel) -> (channel, callback, fd)
        self._thread = threading.Thread(target=self._run, name="gputui-ssh-reader", daemon=True)
        self._thread.start()

    def watch(self, channel: Any, on_readable: Callable[[], None]) -> None:
        """Call `on_readable` (in the reader thread) whenever `channel` has data or is closed."""
        self._order("watch", channel, on_readable)

    def forget(self, channel: Any) -> None:
        """Stop watching `channel` and close it (in the reader thread)."""
        self._order("forget", channel, None)

    def at(self, deadline: float, callback: Callable[[], None]) -> None:
        """Call `callback` (in the reader thread) once time.monotonic() passes `deadline`."""
        self._order("at", deadline, callback)

    @property
    def watching(self) -> int:
        return len(self._watched)

    def _order(self, what: str, a: Any, b: Any) -> None:
        self._orders.put((what, a, b))
        try:
            os.write(self._wake_w, b"!")
        except BlockingIOError:  # the pipe is full: the reader is already due to wake
            pass

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the reader must outlive any bug in a callback
                log.exception("gputui-ssh-reader")

    def _turn(self) -> None:
        timeout = None
        if self._timers:
            timeout = max(0.0, self._timers[0][0] - time.monotonic())
        events = self._selector.select(timeout)
        self._take_orders()  # before the events: a request is always expected before its answer arrives
        for key, _ in events:
            if key.data is None:
                continue
            watched = self._watched.get(key.data)
            if watched is not None:
                self._call(watched[1])
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, callback = heapq.heappop(self._timers)
            self._call(callback)

    def _take_orders(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass
        while True:
            try:
                what, a, b = self._orders.get_nowait()
            except queue.Empty:
                return
            if what == "at":
                heapq.heappush(self._timers, (a, next(self._seq), b))
            elif what == "watch":
                if id(a) not in self._watched:
                    fd = a.fileno()
                    self._watched[id(a)] = (a, b, fd)
                    self._selector.register(fd, selectors.EVENT_READ, id(a))
            elif what == "forget":
                watched = self._watched.pop(id(a), None)
                if watched is not None:
                    self._selector.unregister(watched[2])
                try:
                    a.close()
                except Exception:  # noqa: BLE001 - closing a channel of a dead transport
                    pass

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # noqa: BLE001
            log.exception("gputui-ssh-reader: a callback failed")


_reader: Reader | None = None
_reader_lock = threading.Lock()


def reader() -> Reader:
    """The process's one reader (started on first use)."""
    global _reader
    with _reader_lock:
        if _reader is None:
            _reader = Reader()
        return _reader
