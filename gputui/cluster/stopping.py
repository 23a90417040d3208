"""Stop requests of a cluster run: signals that never raise, and their reporting.

While a cluster run lives, SIGINT, SIGTERM and SIGHUP only count: the handler records the
signal and returns, so no signal can unwind the run past its teardown (releasing paid
slaves, killing processes, closing connections). The run looks at the requests between
its steps (`check`, and `sleep` in every wait of the bring-up), and a `Reporter` thread
says what the run is waiting for at each signal, at once, even while the run is blocked
in a call. The handler itself does nothing but append: it may interrupt any line of the
main thread, including one holding the lock of the event output.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A stop was requested while the run was being brought up (not a GputuiError: the
    bring-up's error handling must not take it for a slave's failure)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped ({reason})")
        self.reason = reason


class StopRequests:
    """The stop requests of one run: the signals received, in order."""

    def __init__(self) -> None:
        self.signals: list[str] = []  # appended by the handler (atomic), read by everyone

    @property
    def count(self) -> int:
        return len(self.signals)

    @property
    def reason(self) -> str | None:
        """The first request's signal name (or the reason given to `request`)."""
        return self.signals[0] if self.signals else None

    @property
    def requested(self) -> bool:
        return bool(self.signals)

    @property
    def urgent(self) -> bool:
        """A further request came: stop the nodes without their grace (the teardown still runs whole)."""
        return len(self.signals) >= 2

    def request(self, reason: str) -> None:
        self.signals.append(reason)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.signals.append(signal.Signals(signum).name)

    def check(self) -> None:
        """Raise Stopped if a stop was requested (called between the steps of the bring-up)."""
        if self.signals:
            raise Stopped(self.signals[0])

    def sleep(self, seconds: float) -> None:
        """time.sleep that ends early with Stopped when a stop is requested (the bring-up's waits)."""
        deadline = time.monotonic() + seconds
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(0.1, left))

    @contextmanager
    def installed(self) -> Iterator["StopRequests"]:
        """The signal handlers in place (from the main thread only: elsewhere requests come by `request`)."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = {sig: signal.signal(sig, self._on_signal) for sig in SIGNALS}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class Reporter:
    """A thread that calls `report(signal name, how many so far)` once for each stop request,
    within a tenth of a second, whatever the run's own thread is blocked in."""

    def __init__(self, stops: StopRequests, report: Callable[[str, int], None]) -> None:
        self.stops = stops
        self.report = report
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="gputui-stop-reporter", daemon=True)

    def __enter__(self) -> "Reporter":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        self._thread.join(5)

    def _watch(self) -> None:
        seen = 0
        while True:
            done = self._done.wait(0.1)
            while seen < self.stops.count:
                seen += 1
                self.report(self.stops.signals[seen - 1], seen)
            if done:
                return
