"""Bounded waits for the tests: a child process whose output is read by threads, and polling.

`Child` starts a process with both pipes read by daemon threads into a queue (stdout) and
a list (stderr), so no wait depends on the child saying something: every wait ends at
its deadline, and fails with what it waited for, the events seen so far and the tail of
stderr. (`for line in proc.stdout` checks a deadline only when a line arrives, and a
child that writes much to an unread stderr blocks for ever.)
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import threading
import time
from typing import IO, Any, Callable, Sequence

_EOF = object()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, every: float = 0.05,
               detail: Callable[[], Any] | None = None) -> Any:
    """Poll `predicate` until it is true (returned); AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if time.monotonic() > deadline:
            extra = f"; {detail()}" if detail is not None else ""
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}{extra}")
        time.sleep(every)


class Child:
    """A subprocess whose stdout lines are JSON events (`gputui ... --json`), read with deadlines.

    Use as a context manager: on leaving, a child still running is killed and reaped.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, name: str | None = None,
                 json_lines: bool = True, **popen: Any) -> None:
        self.name = name or " ".join(argv[:4])
        self.json_lines = json_lines
        popen.setdefault("stdin", subprocess.DEVNULL)  # not the test runner's: a program reads gputui's
        self.proc = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     **popen)
        self.lines: list[str] = []  # every stdout line taken so far
        self.events: list[dict[str, Any]] = []  # the same lines as JSON (json_lines)
        self._stderr: list[str] = []
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._eof = False
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self._threads = [
            threading.Thread(target=self._pump, args=(self.proc.stdout, self._queue.put), daemon=True,
                             name=f"stdout of {self.name}"),
            threading.Thread(target=self._pump, args=(self.proc.stderr, self._stderr.append), daemon=True,
                             name=f"stderr of {self.name}"),
        ]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream: IO[str], put: Callable[[Any], None]) -> None:
        try:
            for line in stream:
                put(line)
        except (OSError, ValueError):  # closed under us
            pass
        finally:
            put(_EOF)

    # -- what was seen -------------------------------------------------------------------
    @property
    def stderr(self) -> str:
        return "".join(x for x in self._stderr if isinstance(x, str))

    def kinds(self) -> list[Any]:
        return [e.get("event") for e in self.events]

    def _seen(self) -> str:
        shown = self.kinds() if self.json_lines else [line.rstrip("\n") for line in self.lines[-20:]]
        tail = self.stderr.strip().splitlines()[-15:]
        code = self.proc.poll()
        state = "still running" if code is None else f"exited {code}"
        return f"{self.name} {state}; seen {shown}; stderr tail: " + "\n".join(tail)

    def _take(self, line: str) -> None:
        self.lines.append(line)
        if self.json_lines:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                raise AssertionError(f"{self.name} wrote a line that is not JSON: {line!r}; {self._seen()}") from None
            self.events.append(event)

    def _next(self, deadline: float, what: str) -> str | None:
        """The next stdout line, None at end of output; AssertionError at the deadline."""
        if self._eof:
            return None
        try:
            item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"timed out waiting for {what}; {self._seen()}") from None
        if item is _EOF:
            self._eof = True
            return None
        assert isinstance(item, str)
        self._take(item)
        return item

    # -- waits ---------------------------------------------------------------------------
    def wait_for(self, predicate: Callable[[dict[str, Any]], Any], timeout: float, what: str) -> dict[str, Any]:
        """Read events until one satisfies `predicate`; return it. Fails at `timeout` s or at the end of output."""
        assert self.json_lines, "wait_for reads JSON events; use wait_for_line"
        deadline = time.monotonic() + timeout
        while True:
            line = self._next(deadline, what)
            if line is None:
                raise AssertionError(f"output ended before {what}; {self._seen()}")
            if predicate(self.events[-1]):
                return self.events[-1]

    def wait_for_line(self, predicate: Callable[[str], Any], timeout: float, what: str) -> str:
        """Read raw lines until one satisfies `predicate` (json_lines=False)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self._next(deadline, what)
            if line is None:
                raise AssertionError(f"output ended before {what}; {self._seen()}")
            if predicate(line):
                return line

    def rest(self, timeout: float, what: str = "the end of its output") -> list[str]:
        """Read stdout to its end; the lines this call read (without newlines). Fails at `timeout` s."""
        deadline = time.monotonic() + timeout
        taken = len(self.lines)
        while self._next(deadline, what) is not None:
            pass
        return [line.rstrip("\n") for line in self.lines[taken:]]

    def stderr_rest(self, timeout: float) -> list[str]:
        """Wait for stderr to end; all its lines (without newlines). Fails at `timeout` s."""
        self._threads[1].join(timeout)
        if self._threads[1].is_alive():
            raise AssertionError(f"timed out after {timeout:g} s waiting for the end of stderr; {self._seen()}")
        return [line.rstrip("\n") for line in self._stderr if isinstance(line, str)]

    def finish(self, timeout: float, what: str = "the end of the run") -> int:
        """Read the rest of the output and wait for the exit; the exit code. Fails at `timeout` s."""
        deadline = time.monotonic() + timeout
        while self._next(deadline, what) is not None:
            pass
        try:
            code = self.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            raise AssertionError(f"timed out waiting for {self.name} to exit after its output ended; {self._seen()}") from None
        for thread in self._threads:  # stderr is complete once its reader is done
            thread.join(max(0.1, deadline - time.monotonic()))
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:  # pragma: no cover - a process that SIGKILL does not end
            pass

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.kill()
        for thread in self._threads:
            thread.join(5)


class Terminal:
    """A pseudo-terminal for a command to write on (`slave`), and what it wrote there (`screen`),
    read as it comes by a daemon thread."""

    def __init__(self) -> None:
        import pty

        self.master, self.slave = pty.openpty()
        self.screen = bytearray()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:  # EIO: the terminal's last writer has closed it
                return
            if not data:
                return
            self.screen.extend(data)

    def close(self, bound: float = 30) -> bytes:
        """Close this side's slave, wait (bounded) for the writers' side to close, and return the screen."""
        os.close(self.slave)
        self.reader.join(bound)
        assert not self.reader.is_alive(), "the terminal was not closed after the command ended"
        os.close(self.master)
        return bytes(self.screen)


def terminal_env(env: dict[str, str]) -> dict[str, str]:
    """`env` as a terminal's: TERM and COLUMNS set, no forced colours (Rich then asks the terminal)."""
    out = {k: v for k, v in env.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
    out.update(TERM="xterm", COLUMNS="100")
    return out
