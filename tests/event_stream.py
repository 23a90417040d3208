"""Reading a child's output line by line with a deadline on every wait.

A thread reads the pipe into a queue, so a wait ends at its deadline even when the child
prints nothing at all (a blocking readline() would not), and the failure says what was
awaited and what came instead.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from typing import IO, Any, Callable

_EOF = object()


class LineStream:
    """The lines of one text pipe, as they come."""

    def __init__(self, pipe: IO[str], companion: "LineStream | None" = None) -> None:
        self.lines: list[str] = []  # every line taken so far
        self.arrived: list[str] = []  # every line the pipe gave so far (taken or not)
        self.companion = companion  # e.g. the child's stderr, shown when a wait fails
        self._queue: "queue.Queue[object]" = queue.Queue()
        self.closed = False
        threading.Thread(target=self._pump, args=(pipe,), name="line-stream", daemon=True).start()

    def _pump(self, pipe: IO[str]) -> None:
        try:
            for line in pipe:
                self.arrived.append(line.rstrip("\n"))
                self._queue.put(line.rstrip("\n"))
        except (OSError, ValueError):
            pass
        self._queue.put(_EOF)

    def next(self, deadline: float) -> str | None:
        """The next line, None at end of stream; AssertionError past the deadline."""
        if self.closed:
            return None
        try:
            item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TimeoutError from None
        if item is _EOF:
            self.closed = True
            return None
        assert isinstance(item, str)
        self.lines.append(item)
        return item

    def _context(self) -> str:
        return f"; alongside: {self.companion.arrived[-10:]}" if self.companion is not None else ""

    def wait_for(self, check: Callable[[str], bool], timeout: float, what: str) -> str:
        """The first line (from here on) that passes `check`; fails after `timeout` s or at end of stream."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.next(deadline)
            except TimeoutError:
                raise AssertionError(f"no {what} within {timeout:g} s; lines so far: {self.lines[-20:]}"
                                     + self._context()) from None
            if line is None:
                raise AssertionError(f"the stream ended before {what}; lines: {self.lines[-20:]}" + self._context())
            if check(line):
                return line

    def rest(self, timeout: float) -> list[str]:
        """Every line up to the end of the stream; fails if it does not end within `timeout` s."""
        deadline = time.monotonic() + timeout
        out = []
        while True:
            try:
                line = self.next(deadline)
            except TimeoutError:
                raise AssertionError(f"the stream did not end within {timeout:g} s; last lines: {self.lines[-20:]}"
                                     + self._context()) from None
            if line is None:
                return out
            out.append(line)


class EventStream(LineStream):
    """A `--json` event stream: one JSON object per line."""

    def wait_event(self, kind: str, timeout: float, where: Callable[[dict[str, Any]], bool] = lambda e: True) -> dict[str, Any]:
        line = self.wait_for(lambda text: _is_event(text, kind, where), timeout, f"{kind!r} event")
        return dict(json.loads(line))

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.lines]


def _is_event(text: str, kind: str, where: Callable[[dict[str, Any]], bool]) -> bool:
    try:
        event = json.loads(text)
    except json.JSONDecodeError:
        raise AssertionError(f"not a JSON line: {text!r}") from None
    return bool(event.get("event") == kind and where(event))


def stop(proc: "subprocess.Popen[Any]") -> None:
    """Kill a child a test left running (cleanup; the test has failed already or is done)."""
    if proc.poll() is None:
        proc.kill()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
