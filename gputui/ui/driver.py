"""The terminal driver of the dashboard: Textual's Linux driver, whose input thread sleeps until
a key, a mouse event or the end of input instead of waking ten times a second.

Textual's input thread waits for input in `select(0.1)`, so an idle dashboard wakes it ten
times a second to find nothing (about 1% of a core on a machine that charges each wake-up for
the memory it touches again). Here it waits without a timeout, except while the key parser
holds a pending escape sequence (a lone Esc is a key only once its timeout passes): then it
waits until that timeout. The end of input (`exit_event.set()`, from Textual's own
`disable_input`) wakes it through a pipe. Where Textual's parser does not say when its timeout
is due (a later Textual), the thread waits 0.1 s at a time, as Textual's does.
"""

from __future__ import annotations

import os
import selectors
import threading
import time
from codecs import getincrementaldecoder
from typing import Any

from textual.drivers.linux_driver import LinuxDriver

TEXTUAL_WAIT_S = 0.1  # Textual's own wait between two looks at the end of input


_UNSAID = object()


class _WakingEvent(threading.Event):
    """An Event that, once set, also writes a byte to a pipe the input thread watches."""

    def __init__(self) -> None:
        super().__init__()
        self.read_fd, self.write_fd = os.pipe()
        self._fd_lock = threading.Lock()  # a set() racing close() never writes to a closed (or reused) number
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)

    def set(self) -> None:
        super().set()
        with self._fd_lock:
            if self.write_fd >= 0:
                try:
                    os.write(self.write_fd, b"\0")
                except OSError:  # the pipe is full: the thread wakes anyway
                    pass

    def drain(self) -> None:
        try:
            while os.read(self.read_fd, 512):
                pass
        except OSError:  # empty (BlockingIOError)
            pass

    def close(self) -> None:
        with self._fd_lock:
            fds, self.read_fd, self.write_fd = (self.read_fd, self.write_fd), -1, -1  # a later set() writes nowhere
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def wait_s(parser: Any, now: float) -> float | None:
    """How long the input thread may sleep: until the parser's pending timeout (Textual's parser
    keeps when it is due on the monotonic clock), or for ever when none is pending."""
    due = getattr(parser, "_timeout_time", _UNSAID)
    if due is None:
        return None
    if isinstance(due, (int, float)) and not isinstance(due, bool):
        return max(0.0, due - now)
    return TEXTUAL_WAIT_S  # a parser that does not say: Textual's own pace


class QuietLinuxDriver(LinuxDriver):
    """LinuxDriver with an input thread that sleeps while nothing comes (see the module)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._waking = self.exit_event = _WakingEvent()

    def run_input_thread(self) -> None:
        from textual._xterm_parser import XTermParser

        parser = XTermParser(self._debug)
        decode = getincrementaldecoder("utf-8")(errors="replace").decode  # a stray byte is a "\ufffd" key, not a crash
        wake = self._waking.read_fd
        selector = selectors.SelectSelector()  # as Textual's: any descriptor
        selector.register(self.fileno, selectors.EVENT_READ)
        selector.register(wake, selectors.EVENT_READ)

        def dispatch(ready: list[tuple[selectors.SelectorKey, int]], final: bool = False) -> bool:
            """Feed what came to the parser and send its messages; False at the end of input."""
            more = True
            for key, _mask in ready:
                if key.fd == wake:
                    self._waking.drain()
                    continue
                data = os.read(self.fileno, 4096)
                if not data:
                    more = False  # stdin closed (a pipe): nothing more will come
                    continue
                text = decode(data, final=final)  # "" while a character's bytes are still coming
                if text:
                    for message in parser.feed(text):
                        self.process_message(message)
            for message in parser.tick():
                self.process_message(message)
            return more

        try:
            while not self.exit_event.is_set():
                if not dispatch(selector.select(wait_s(parser, time.monotonic()))):
                    self.exit_event.wait()  # the thread lasts until input ends, reading nothing more
                    break
            selector.unregister(self.fileno)
            dispatch([(key, mask) for key, mask in selector.select(0) if key.fd == wake], final=True)
        finally:
            selector.close()
            try:
                for _ in parser.feed(""):
                    pass
            except Exception:  # noqa: BLE001 - Textual ignores its parser's end-of-file errors the same way
                pass

    def close(self) -> None:
        super().close()
        self._waking.close()
