"""The SSH reader thread (gputui.sources.sshloop.Reader) against paramiko's own channel input
buffer (BufferedPipe), without a server: when a callback runs, that a forgotten channel is
closed and never called again, that no callback spins, and that watching holds no descriptor.
(Against real sshd, with channels closed mid-stream: tests/test_ssh_scale.py.)"""

from __future__ import annotations

import os
import threading
from typing import Any

from paramiko.buffered_pipe import BufferedPipe

from gputui.sources.sshloop import Reader
from tests.proc_support import wait_until


class FakeChannel:
    """What the reader uses of a paramiko Channel: its input buffer, recv and close."""

    def __init__(self) -> None:
        self.in_buffer = BufferedPipe()
        self.closed_by: str | None = None

    def recv(self, n: int) -> bytes:
        return self.in_buffer.read(n, timeout=0.0) if len(self.in_buffer) or self.in_buffer._closed else b""

    def close(self) -> None:
        self.closed_by = threading.current_thread().name


class Calls:
    def __init__(self, channel: FakeChannel, drain: bool = True, fail: bool = False) -> None:
        self.channel, self.drain, self.fail = channel, drain, fail
        self.data: list[bytes] = []
        self.count = 0

    def __call__(self) -> None:
        self.count += 1
        if self.fail:
            raise RuntimeError("a bug in a callback")
        if self.drain:
            self.data.append(self.channel.recv(4))  # 4 bytes a call: a longer answer takes several


def test_a_channel_is_called_while_it_has_data_and_then_not() -> None:
    reader, channel = Reader(), FakeChannel()
    channel.in_buffer.feed(b"before")  # data already there when it is watched
    calls = Calls(channel)
    reader.watch(channel, calls)
    wait_until(lambda: b"".join(calls.data) == b"before", 30, "the data fed before the watch",
               detail=lambda: calls.data)
    assert calls.count == 2  # 4 bytes, then 2: called again only while data is left
    channel.in_buffer.feed(b"more")
    wait_until(lambda: b"".join(calls.data) == b"beforemore", 30, "the data fed later", detail=lambda: calls.data)
    channel.in_buffer.close()  # the channel's end is news too
    wait_until(lambda: calls.data[-1:] == [b""], 30, "the end of the channel", detail=lambda: calls.data)


def test_a_forgotten_channel_is_closed_by_the_reader_and_never_called_again() -> None:
    reader, channel = Reader(), FakeChannel()
    calls = Calls(channel)
    reader.watch(channel, calls)
    channel.in_buffer.feed(b"ab")
    wait_until(lambda: calls.count == 1, 30, "the first call")
    reader.forget(channel)
    wait_until(lambda: channel.closed_by is not None, 30, "the reader to close the channel")
    assert channel.closed_by == "gputui-ssh-reader" and reader.watching == 0
    channel.in_buffer.feed(b"late data from paramiko's transport thread")
    ran = threading.Event()
    reader.at(0.0, ran.set)  # a later turn of the reader
    assert ran.wait(30), "the reader's timer never ran"
    assert calls.count == 1


def test_a_failing_callback_is_not_called_again_until_more_data_comes() -> None:
    reader, channel = Reader(), FakeChannel()
    turns: list[int] = []
    calls = Calls(channel, fail=True)

    def failing() -> None:
        reader.at(0.0, lambda: turns.append(calls.count))  # runs after this turn's callbacks
        calls()

    reader.watch(channel, failing)
    channel.in_buffer.feed(b"data it never reads")
    wait_until(lambda: turns, 30, "the turn after the failing call")
    assert turns[0] == 1 and calls.count == 1  # a spin would have called it again at once
    channel.in_buffer.feed(b"more")
    wait_until(lambda: calls.count == 2, 30, "a call for the new data")


def test_timers_run_in_deadline_order() -> None:
    reader = Reader()
    order: list[str] = []
    done = threading.Event()

    def schedule() -> None:  # in the reader thread: all three are set before its next turn
        reader.at(0.2, lambda: order.append("second"))  # deadlines long past: due at once, run in deadline order
        reader.at(0.1, lambda: order.append("first"))
        reader.at(0.3, done.set)

    reader.at(0.0, schedule)
    assert done.wait(30), "the last timer never ran"
    assert order == ["first", "second"]


def test_watching_many_channels_opens_no_descriptor() -> None:
    """Channel.fileno() would open a pipe (two descriptors) per channel: 512 for 256 hosts."""
    reader = Reader()
    before = len(os.listdir("/proc/self/fd"))
    channels: list[Any] = [FakeChannel() for _ in range(64)]
    for channel in channels:
        reader.watch(channel, Calls(channel))
    assert reader.watching == 64
    assert len(os.listdir("/proc/self/fd")) == before
    for channel in channels:
        reader.forget(channel)
    wait_until(lambda: all(c.closed_by for c in channels), 30, "every channel closed")
