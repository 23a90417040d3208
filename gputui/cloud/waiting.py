"""Polling with backoff: look at once, then wait a little longer each time (never fixed sleeps)."""

from __future__ import annotations

import time
from typing import Callable, Iterator, TypeVar

from gputui.model.errors import GputuiError

T = TypeVar("T")


def backoff(initial_s: float = 0.2, factor: float = 1.6, cap_s: float = 5.0) -> Iterator[float]:
    """Delays initial_s, initial_s*factor, ... up to cap_s."""
    delay = initial_s
    while True:
        yield delay
        delay = min(cap_s, delay * factor)


def wait_until(
    fetch: Callable[[], T],
    done: Callable[[T], bool],
    what: str,
    timeout_s: float = 600.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    delays: Iterator[float] | None = None,
    hopeless: Callable[[T], bool] | None = None,
    error: Callable[[T], BaseException] | None = None,
) -> T:
    """Call `fetch` until `done(result)`; the first look is immediate, the last one at the deadline.

    `hopeless(result)` ends the wait at once (waiting cannot help, e.g. a refused key).
    Past `timeout_s`, or when hopeless, `error(result)` is raised; by default a GputuiError
    saying what was waited for. `sleep` may raise to end the wait early (a stop request).
    """
    deadline = clock() + timeout_s
    for delay in delays or backoff():
        result = fetch()
        if done(result):
            return result
        left = deadline - clock()
        if left <= 0 or (hopeless is not None and hopeless(result)):
            if error is not None:
                raise error(result)
            if left <= 0:
                raise GputuiError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            raise GputuiError(f"gave up waiting for {what}")
        sleep(min(delay, left))
    raise AssertionError("unreachable")  # pragma: no cover
