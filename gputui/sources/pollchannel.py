"""One host's long-lived poll channel: a small `sh` loop on the host (see
gputui.sources.nvsmi.remote_loop_command) that answers one request line at a time.

A request is sent from a pool worker; its answer is read by the reader thread (see
gputui.sources.sshloop) as it comes, bounded in bytes, line length and time like any command's
output: past a bound the channel is closed, never read on. Each request ends in exactly one
of three callbacks: `on_answer` (the report), `on_error` (too much output, or no answer in
time; the connection is kept) or `on_broken` (the channel failed before answering). A channel
that says anything between requests, or more than it was asked, is closed and opened again for
the next request.
"""

from __future__ import annotations

import itertools
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from gputui.sources.nvsmi import end_marker, poll_request, remote_loop_command
from gputui.sources.sshloop import reader

__all__ = ["Budget", "CommandTimeout", "OutputTooLarge", "PollChannel"]


class CommandTimeout(Exception):
    """The remote command gave no complete answer in time."""


class OutputTooLarge(Exception):
    """The remote command said more than a poll reads (in all, or in one line)."""

    def __init__(self, limit: int, what: str = "output") -> None:
        super().__init__(f"{what} over {limit // 1024} KiB")


class Budget:
    """The bytes one command's output may still take, and the length of the line it is in."""

    def __init__(self, max_bytes: int, max_line: int) -> None:
        self.max_bytes, self.max_line = max_bytes, max_line
        self.taken = 0
        self.line = 0

    def take(self, data: bytes) -> None:
        self.taken += len(data)
        if self.taken > self.max_bytes:
            raise OutputTooLarge(self.max_bytes)
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            if self.line + nl - start > self.max_line:
                raise OutputTooLarge(self.max_line, "a line of output")
            self.line, start = 0, nl + 1
        self.line += len(data) - start
        if self.line > self.max_line:
            raise OutputTooLarge(self.max_line, "a line of output")

    def start_stream(self) -> None:
        self.line = 0  # stderr's lines are not stdout's


@dataclass(eq=False)
class _Request:
    """One request on the channel, and what its answer has said so far."""

    token: int
    fields: tuple[str, ...]
    channel: Any
    budget: Budget
    data: bytearray = field(default_factory=bytearray)
    scanned: int = 0


class PollChannel:
    """The poll channel of one connection (see the module's docstring)."""

    def __init__(self, on_answer: Callable[[tuple[str, ...], str], None], on_error: Callable[[Exception], None],
                 on_broken: Callable[[Exception], None]) -> None:
        self._on_answer, self._on_error, self._on_broken = on_answer, on_error, on_broken
        self._lock = threading.Lock()  # guards the channel and the request on it
        self._channel: Any = None
        self._pending: _Request | None = None
        self._tokens = itertools.count(1)
        self.opened = 0  # channels opened so far

    def ask(self, transport: Any, fields: tuple[str, ...], wait_s: float, timeout: float, max_bytes: int, max_line: int,
            known: tuple[int, ...] = ()) -> None:
        """Send one request (opening the channel first if needed), in a pool worker; its answer
        comes to one of the callbacks, within `timeout` seconds. Raises what opening or sending
        raised (the request is then over, and the channel closed)."""
        request: _Request | None = None
        try:
            with self._lock:
                channel = self._channel
            if channel is None:
                channel = self._open(transport, timeout)
            request = _Request(next(self._tokens), fields, channel, Budget(max_bytes, max_line))
            with self._lock:
                if self._channel is not channel:
                    raise EOFError("the poll channel was closed")
                self._pending = request
            timed = request
            reader().at(time.monotonic() + timeout, lambda: self._error(timed, CommandTimeout()))
            channel.sendall(poll_request(request.token, fields, wait_s, known))
        except BaseException:
            self._take(request, keep_channel=False)
            self.close()
            raise

    def close(self) -> bool:
        """Close the channel; whether a request was in flight (it gets no callback)."""
        with self._lock:
            channel, self._channel = self._channel, None
            request, self._pending = self._pending, None
        if channel is not None:
            reader().forget(channel)
        return request is not None

    def _open(self, transport: Any, timeout: float) -> Any:
        if transport is None or not transport.is_active():
            raise EOFError("not connected")
        channel = transport.open_session(timeout=timeout)
        try:
            channel.set_combine_stderr(True)
            channel.exec_command(remote_loop_command())
            channel.settimeout(0.0)  # the reader reads what is there, never waits
        except BaseException:
            channel.close()
            raise
        with self._lock:
            self._channel = channel
        self.opened += 1
        reader().watch(channel, lambda: self._readable(channel))
        return channel

    def _take(self, request: _Request | None, keep_channel: bool) -> bool:
        """Whether `request` was still the one in flight (then it is no longer); without
        `keep_channel` its channel is closed too."""
        with self._lock:
            if request is None or self._pending is not request:
                return False
            self._pending = None
            drop = not keep_channel and self._channel is request.channel
            if drop:
                self._channel = None
        if drop:
            reader().forget(request.channel)
        request.data = bytearray()  # its deadline's timer holds the request a while yet
        return True

    def _readable(self, channel: Any) -> None:
        """The reader thread: the channel has data, or has closed."""
        with self._lock:
            request = self._pending if self._pending is not None and self._pending.channel is channel else None
        try:
            data = channel.recv(65536)
        except socket.timeout:
            return  # nothing after all
        except Exception:  # noqa: BLE001 - a channel of a closed transport
            data = b""
        if request is None:  # said something, or ended, between requests: not trusted any more
            with self._lock:
                if self._channel is channel:
                    self._channel = None
            reader().forget(channel)
            return
        if not data:
            if self._take(request, keep_channel=False):
                self._on_broken(EOFError("the poll channel closed"))
            return
        try:
            request.budget.take(data)
        except OutputTooLarge as exc:
            self._error(request, exc)
            return
        request.data += data
        end = end_marker(request.token)
        at = request.data.find(end, max(0, request.scanned - len(end) + 1))
        request.scanned = len(request.data)
        if at < 0:
            return
        text = request.data[: at + 1].decode("utf-8", errors="replace")
        more = len(request.data) > at + len(end)  # said more than it was asked: a new channel next time
        if self._take(request, keep_channel=not more):
            self._on_answer(request.fields, text)

    def _error(self, request: _Request, exc: Exception) -> None:
        if self._take(request, keep_channel=False):
            self._on_error(exc)
