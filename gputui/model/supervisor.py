"""One owner for the process tree a run starts, and one way to stop it.

torchrun starts every worker in its own session, so a process-group kill of torchrun never
reaches them: a SIGKILLed torchrun leaves its workers training on, parented to init. A
`Tree` therefore tracks every process under its root (re-reading the tree as it goes), and
on Linux this process becomes a child subreaper, so workers orphaned by a dying torchrun
come back to it instead of to init and stay in reach. One stop policy for all of them:
SIGTERM to every process of the tree, a grace longer than torchrun's own 30 s shutdown
timeout, then SIGKILL of every process still there.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, TypeVar

import psutil

TORCHRUN_SHUTDOWN_S = 30.0  # torchrun's own SIGTERM -> SIGKILL wait for its workers
GRACE_ENV = "GPUTUI_TEST_GRACE_S"  # a test hook only (docs/stopping.md): tests wait seconds, not 35 s


def hook_seconds(name: str, default: float) -> float:
    """`default`, or a positive number of seconds from the environment variable `name` (a test hook
    that makes a real wait short; anything else there leaves the default)."""
    text = os.environ.get(name, "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if 0 < value < float("inf") else default


GRACE_S = hook_seconds(GRACE_ENV, TORCHRUN_SHUTDOWN_S + 5.0)  # read once, at import
# A stopped torchrun with no worker left only waits for its peers, in its exit barrier (up to 300 s)
# or its rendezvous, inside a store call no signal interrupts: a peer that is gone (a lost node)
# would hold it for the whole grace. Alone this long, it gets SIGKILL (it has nothing to save).
LAUNCHER_ALONE_S = 2.0
# What asks a run to stop with a checkpoint: Ctrl-C, a kill, and a closed terminal (SIGHUP).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGINT, signal.SIGTERM)
_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper(on: bool = True) -> bool:
    """Linux: orphaned descendants re-parent to this process, not init. Whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0
    except OSError:
        return False


class Tree:
    """The processes of one child: the child, its descendants, and those seen under it
    before (a worker whose torchrun died is still ours). Stopped at most once."""

    def __init__(self, proc: "subprocess.Popen[Any]", marker: str | None = None, launcher: bool = False,
                 alone_s: float = LAUNCHER_ALONE_S) -> None:
        self.proc = proc
        # `launcher`: the root is torchrun. Stopped, it is killed once it has been alone (no worker
        # left under it) for `alone_s`, instead of at the end of the grace.
        self.launcher, self.alone_s = launcher, alone_s
        # Orphans re-parented to us (subreaper) are adopted when their command line names
        # `marker` (the run directory): nothing else this process started is touched.
        self.marker = marker if marker and become_subreaper() else None
        self._known: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self.stopping = False
        self.refresh()

    def refresh(self) -> list[psutil.Process]:
        """Every live process of the tree (also remembered for later)."""
        found: list[psutil.Process] = []
        roots = [root for root in (read_table(lambda: psutil.Process(self.proc.pid), None),) if root is not None]
        marker = self.marker
        here = read_table(psutil.Process, None) if marker else None
        if marker and here is not None:
            for child in children_of(here):
                try:
                    if child.pid != self.proc.pid and marker in " ".join(child.cmdline()):
                        roots.append(child)
                except (psutil.NoSuchProcess, psutil.AccessDenied, OSError, ValueError):
                    continue  # gone, not ours, or its table torn (the next refresh reads it again)
        for root in roots:
            found += [root, *children_of(root, recursive=True)]
        with self._lock:
            for p in found:
                self._known.setdefault(p.pid, p)
            alive = [p for p in self._known.values() if _alive(p)]
            self._known = {p.pid: p for p in alive}
        return alive

    def pids(self) -> list[int]:
        """The processes of the tree as last read (no new look at the process table)."""
        with self._lock:
            return list(self._known)

    def send(self, sig: int) -> None:
        """`sig` to every live process of the tree, and to the group the root leads (if it leads one)."""
        if self.proc.returncode is None:  # not reaped: its pid is still its own, not a reused one
            try:
                if os.getpgid(self.proc.pid) == self.proc.pid:
                    os.killpg(self.proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        for p in self.refresh():
            try:
                p.send_signal(sig)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass

    def stop(self, grace_s: float = GRACE_S, first: int = signal.SIGTERM) -> None:
        """SIGTERM (or `first`) to the whole tree, up to `grace_s` for it to end, then SIGKILL."""
        with self._lock:
            if self.stopping:
                return
            self.stopping = True
        self.send(first)
        deadline = time.monotonic() + grace_s
        alone_since: float | None = None
        while time.monotonic() < deadline:
            alive = self.refresh()
            if not alive:
                break
            if self.launcher and [p.pid for p in alive] == [self.proc.pid]:  # torchrun alone: no worker to wait for
                alone_since = alone_since if alone_since is not None else time.monotonic()
                if time.monotonic() - alone_since >= self.alone_s:
                    break
            else:
                alone_since = None
            time.sleep(0.05)
        self.kill()

    def kill(self) -> None:
        """SIGKILL every process of the tree now, and reap the root and adopted orphans."""
        members = self.refresh()
        self.send(signal.SIGKILL)
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL always ends it
            pass
        for p in members:
            try:
                p.wait(0.5)  # an orphan re-parented to us is our child now: reap it
            except (psutil.NoSuchProcess, psutil.TimeoutExpired, ChildProcessError):
                pass


T = TypeVar("T")


def read_table(read: Callable[[], T], gone: T) -> T:
    """One read of the process table through psutil, or `gone` when the process has gone. psutil
    parses /proc/PID/stat, and a read while that process is being torn down came back as NUL bytes
    (a ValueError in psutil's parser, seen once on a busy machine while a stopped DDP run's workers
    exited), cut short (IndexError, once more), or failed to open (OSError EBADF, once, reading this
    very process's stat from the stop thread): read again, three times at most, then `gone`. All
    three were seen in DDP runs, whose store's listening socket gputui then closed while torch
    still held its number and closed it again later, which could close (or swap) the descriptor
    psutil had just opened; that is fixed at its root (gputui.train.rdzv.serve_store), and the
    retry stays for a process really being torn down."""
    for attempt in range(3):
        try:
            return read()
        except psutil.NoSuchProcess:
            return gone
        except (ValueError, IndexError, OSError):
            if attempt == 2:
                return gone
            time.sleep(0.01)
    return gone


def children_of(p: psutil.Process, recursive: bool = False) -> list[psutil.Process]:
    """`p`'s children, or [] when `p` is gone (or its table cannot be read: `read_table`)."""
    return read_table(lambda: p.children(recursive=recursive), [])


def _alive(p: psutil.Process) -> bool:
    """Whether `p` still runs (not a zombie). A table that cannot be read counts as alive: the
    process stays known, and a stop signals it again, rather than forgetting one that runs."""
    return read_table(lambda: p.is_running() and p.status() != psutil.STATUS_ZOMBIE, True)


class stop_on_signals:
    """SIGTERM/SIGINT/SIGHUP ask the loop to checkpoint and stop; a second SIGINT stops at once."""

    def __init__(self, stop: Any) -> None:
        self.stop = stop
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop.set(signal.Signals(signum).name)

    def __enter__(self) -> "stop_on_signals":
        for sig in STOP_SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class StopFlag:
    """A run's stop request: set from a signal handler (or a sweep's stop), read by the run's loop,
    which checkpoints and stops; `reason` says what asked (SIGINT, pruned, ...)."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()
