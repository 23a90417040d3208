"""The dashboard's terminal driver (gputui.ui.driver): its input thread sleeps until input
comes, still turns a lone Esc into a key once the parser's timeout passes, and ends when
Textual ends input. Driven through a pseudo-terminal, without an app."""

from __future__ import annotations

import asyncio
import os
import pty
import queue
import selectors
import signal
import sys
import threading
import tty
from typing import Any

import pytest

from gputui.ui.driver import TEXTUAL_WAIT_S, QuietLinuxDriver, wait_s

WAIT_S = 30.0  # any wait below: a bound that fails with a message, however slow the machine


class _Probe(QuietLinuxDriver):
    """The driver, keeping what its input thread sends instead of posting it to an app."""

    received: "queue.Queue[Any]"

    def process_message(self, message: Any) -> None:
        self.received.put(message)


class _Selects:
    """The timeout of each select the input thread starts, in order; waits are on the thread's own selects."""

    def __init__(self) -> None:
        self.timeouts: list[float | None] = []
        self._changed = threading.Condition()

    def record(self, timeout: float | None) -> None:
        with self._changed:
            self.timeouts.append(timeout)
            self._changed.notify_all()

    def count(self) -> int:
        with self._changed:
            return len(self.timeouts)

    def nth(self, n: int, what: str) -> float | None:
        """The timeout of the thread's n-th select (1-based), once it has started one."""
        with self._changed:
            assert self._changed.wait_for(lambda: len(self.timeouts) >= n, WAIT_S), \
                f"no select #{n} within {WAIT_S:g} s: {what}"
            return self.timeouts[n - 1]


def _key(driver: _Probe, what: str) -> str:
    try:
        return str(driver.received.get(timeout=WAIT_S).key)
    except queue.Empty:
        raise AssertionError(f"no key within {WAIT_S:g} s: {what}") from None


def test_the_input_thread_sleeps_until_a_key_and_ends_when_input_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    master, slave = pty.openpty()
    tty.setraw(slave)  # as the driver's application mode sets it: each key as it comes
    monkeypatch.setattr(sys, "__stdin__", os.fdopen(slave, "rb", buffering=0))
    selects = _Selects()
    select = selectors.SelectSelector.select

    def counted(self: Any, timeout: float | None = None) -> Any:
        selects.record(timeout)
        return select(self, timeout)

    monkeypatch.setattr(selectors.SelectSelector, "select", counted)
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTSTP, signal.SIGCONT)}  # the driver sets its own

    async def make() -> _Probe:
        return _Probe(None)  # type: ignore[arg-type]

    driver = asyncio.run(make())
    driver.received = queue.Queue()
    thread = threading.Thread(target=driver.run_input_thread, daemon=True)
    try:
        thread.start()
        assert selects.nth(1, "the thread's first select") is None, "with nothing pending it waits without a timeout"

        def typed(data: bytes, what: str) -> tuple[int, list[str]]:
            """Write `data`; the number of the select that was waiting for it, and the keys it made."""
            waiting = selects.count()
            os.write(master, data)
            return waiting, [_key(driver, what)]

        n, keys = typed(b"a", "a typed key")
        assert keys == ["a"] and selects.nth(n + 1, "the select after a key") is None  # asleep again
        n = selects.count()
        os.write(master, "é".encode()[:1])  # half a character: nothing yet, and the thread reads on, asleep
        assert selects.nth(n + 1, "the select after half a character") is None
        n, keys = typed("é".encode()[1:], "the rest of the character")
        assert keys == ["é"]
        n, keys = typed(b"\xffb", "a replaced byte")  # no UTF-8: replaced, and the keys after it still come
        keys.append(_key(driver, "the key after the replaced byte"))
        assert keys[-1] == "b" and thread.is_alive(), keys
        n, keys = typed(b"\x1b", "a lone Esc")  # a key only once the parser's timeout passes
        wait = selects.nth(n + 1, "the select after the Esc")
        assert keys == ["escape"] and wait is not None and 0 <= wait < 1.0, selects.timeouts  # until the timeout
        assert selects.nth(n + 2, "the select after the Esc's key") is None  # then asleep again
        driver.exit_event.set()  # what Textual's disable_input does, then it joins the thread
        thread.join(WAIT_S)
        assert not thread.is_alive(), "the input thread did not end when input ended"
    finally:
        driver.exit_event.set()
        thread.join(WAIT_S)
        driver.close()
        os.close(master)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


def test_the_thread_sleeps_until_the_parsers_timeout_or_at_textuals_pace_where_the_parser_does_not_say() -> None:
    class Parser:
        _timeout_time: float | None = None

    parser = Parser()
    assert wait_s(parser, 100.0) is None
    parser._timeout_time = 100.25
    assert wait_s(parser, 100.0) == 0.25 and wait_s(parser, 101.0) == 0.0
    assert wait_s(object(), 100.0) == TEXTUAL_WAIT_S  # a later Textual's parser without the attribute


def test_the_dashboard_takes_the_quiet_driver_only_where_textual_would_take_its_linux_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from textual.app import App
    from textual.drivers.headless_driver import HeadlessDriver
    from textual.drivers.linux_driver import LinuxDriver

    from gputui.ui.app import DashboardApp

    app = DashboardApp.__new__(DashboardApp)  # what get_driver_class reads: nothing of the app's own
    monkeypatch.setattr(App, "get_driver_class", lambda self: LinuxDriver)
    assert app.get_driver_class() is QuietLinuxDriver
    monkeypatch.setattr(App, "get_driver_class", lambda self: HeadlessDriver)  # a browser's (textual-serve) or a test's
    assert app.get_driver_class() is HeadlessDriver


def test_the_wake_event_writes_nowhere_once_closed_even_where_its_numbers_are_reused() -> None:
    from gputui.ui.driver import _WakingEvent

    event = _WakingEvent()
    event.close()
    pipes = [os.pipe() for _ in range(4)]  # the lowest free numbers: the closed ones among them
    try:
        event.set()  # as a late set() from another thread would
        assert event.is_set()
        for read_fd, _ in pipes:
            os.set_blocking(read_fd, False)
            with pytest.raises(BlockingIOError):
                os.read(read_fd, 1)  # nothing was written to another file
    finally:
        for pair in pipes:
            for fd in pair:
                os.close(fd)
