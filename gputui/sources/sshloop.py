"""The threads behind SshSource's rounds: small pools of named daemon workers for the steps
that block (connecting, opening a channel, sending a request), and one reader thread that
waits on every host's open poll channel at once, so a host whose answer is slow or never
comes holds no thread while the others are read.

The reader learns that a channel has data (or has closed) from a small signal it puts on the
channel's input buffer (paramiko's BufferedPipe.set_event, which paramiko's transport thread
sets as data comes and a read that empties the buffer clears), and runs each channel's callback
in its own thread, and timers at their deadlines. Callbacks must not block.

It does not use `Channel.fileno()`: that pipe is written by paramiko's transport thread with no
lock against `Channel.close()` (paramiko issues #1700 and #2271), so closing a channel while its
host still streams output (a poll cut off by the output caps) could make the transport thread
write to a closed descriptor, which ends the whole connection ("Bad file descriptor"), or to a
descriptor the process has since opened for something else. The signal holds no descriptor.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import queue
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


class _Signal:
    """What a watched channel's input buffer sets and clears in place of a threading.Event
    (in paramiko's transport thread, or in the thread reading the channel)."""

    __slots__ = ("_reader", "_key")

    def __init__(self, reader: "Reader", key: int) -> None:
        self._reader, self._key = reader, key

    def set(self) -> None:
        self._reader._mark(self._key, True)

    def clear(self) -> None:
        self._reader._mark(self._key, False)


class Reader:
    """One daemon thread reading every watched channel (see the module's docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()  # guards everything below; never held while calling paramiko
        self._keys = itertools.count()
        self._watched: dict[int, tuple[Any, Callable[[], None]]] = {}  # key -> (channel, callback)
        self._key_of: dict[int, int] = {}  # id(channel) -> key, for the watched channels (held above)
        self._ready: set[int] = set()  # watched keys whose channel has data or has closed
        self._closing: list[Any] = []  # forgotten channels, closed by the reader thread
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name="gputui-ssh-reader", daemon=True)
        self._thread.start()

    def watch(self, channel: Any, on_readable: Callable[[], None]) -> None:
        """Call `on_readable` (in the reader thread) whenever `channel` has data or is closed."""
        with self._cond:
            if id(channel) in self._key_of:
                return
            key = self._key_of[id(channel)] = next(self._keys)
            self._watched[key] = (channel, on_readable)
        channel.in_buffer.set_event(_Signal(self, key))  # set at once if data came already

    def forget(self, channel: Any) -> None:
        """Stop watching `channel` and close it (in the reader thread)."""
        with self._cond:
            key = self._key_of.pop(id(channel), None)
            if key is not None:
                del self._watched[key]
                self._ready.discard(key)
            self._closing.append(channel)
            self._cond.notify()

    def at(self, deadline: float, callback: Callable[[], None]) -> None:
        """Call `callback` (in the reader thread) once time.monotonic() passes `deadline`."""
        with self._cond:
            heapq.heappush(self._timers, (deadline, next(self._seq), callback))
            self._cond.notify()

    @property
    def watching(self) -> int:
        with self._cond:
            return len(self._watched)

    def _mark(self, key: int, ready: bool) -> None:
        with self._cond:
            if not ready:
                self._ready.discard(key)
            elif key in self._watched and key not in self._ready:  # a forgotten channel's late data is nobody's
                self._ready.add(key)
                self._cond.notify()

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the reader must outlive any bug in a callback
                log.exception("gputui-ssh-reader")

    def _turn(self) -> None:
        with self._cond:
            while not self._ready and not self._closing and not self._due():
                self._cond.wait(max(0.0, self._timers[0][0] - time.monotonic()) if self._timers else None)
            closing, self._closing = self._closing, []
            calls = [(key, self._watched[key][1]) for key in sorted(self._ready)]
            due = []
            while self._due():
                due.append(heapq.heappop(self._timers)[2])
        for channel in closing:
            try:
                channel.close()
            except Exception:  # noqa: BLE001 - closing a channel of a dead transport
                pass
        for key, callback in calls:  # a channel that still has data after its callback is called again next turn
            if self._still(key) and not self._call(callback):
                self._mark(key, False)  # not again until more comes (the request's deadline ends it), never a spin
        for callback in due:
            self._call(callback)

    def _due(self) -> bool:
        return bool(self._timers) and self._timers[0][0] <= time.monotonic()

    def _still(self, key: int) -> bool:
        """Whether the channel of `key` is still watched (an earlier callback of this turn may have forgotten it)."""
        with self._cond:
            return key in self._watched

    @staticmethod
    def _call(callback: Callable[[], None]) -> bool:
        try:
            callback()
        except Exception:  # noqa: BLE001
            log.exception("gputui-ssh-reader: a callback failed")
            return False
        return True


_reader: Reader | None = None
_reader_lock = threading.Lock()


def reader() -> Reader:
    """The process's one reader (started on first use)."""
    global _reader
    with _reader_lock:
        if _reader is None:
            _reader = Reader()
        return _reader
