"""Where a cluster run's events go: the run's events.jsonl, the view, and a line on stderr.

Several threads write (the run, the stop reporter), so writes are serialised. A write that
fails (a closed stdout, a full disk) never raises into the run: that would unwind it past
the release of its slaves. The first failure is kept, the run is asked to stop, and the
failure is raised again once the teardown is over (`raise_failure`).
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from gputui.runs import store as runs
from gputui.model import events
from gputui.views.progress import JsonView, View
from gputui.model.text import clean


def stderr_line(message: str) -> None:
    try:
        print(clean(message, 2000), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr is gone too: nothing left to tell
        pass


class Output:
    """The run's event output; `on_failure` is called once when it stops working."""

    def __init__(self, log: runs.EventLog, view: View, say: Callable[[str], None] | None = None,
                 on_failure: Callable[[str], None] = lambda why: None) -> None:
        self.log, self.view = log, view
        self.say = say or ((lambda m: None) if isinstance(view, JsonView) else stderr_line)
        self.on_failure = on_failure
        self.failure: BaseException | None = None
        self._lock = threading.Lock()

    def emit(self, name: str, /, **fields: Any) -> dict[str, Any]:
        """A master-side event (checked against gputui.model.events) and its line on stderr."""
        event = events.make(name, **fields)
        self.write(event)
        if name == "stopping":
            self.say(str(fields.get("message")))
        else:
            text = fields.get("message") or ", ".join(f"{k} {v}" for k, v in fields.items() if not isinstance(v, (list, dict)))
            self.say(f"cluster: {name}: {text}")
        return event

    def write(self, event: dict[str, Any]) -> None:
        """An event as it is (a relayed one, already cleaned) to the log and the view."""
        with self._lock:
            try:
                self.log.write(runs.encode(event))
                if self.failure is None:
                    self.view.show(event)
            except Exception as exc:  # noqa: BLE001 - a view may fail in any way (BrokenPipeError, mostly)
                if self.failure is None:
                    self.failure = exc
                    self.on_failure("output")

    def program(self, line: str, end: str) -> None:
        """A line of the program's (rank 0's node) to a view that shows them (a terminal's), as
        `gputui run -- PROGRAM` shows it on one machine; `end` "\r" for a progress bar's redraw."""
        self._to_view("output", line, "stdout", end)

    def tick(self) -> None:
        """The view's tick: the lines it holds printed, its clock moved on."""
        self._to_view("tick")

    def _to_view(self, what: str, *args: Any) -> None:
        call = getattr(self.view, what, None)
        if call is None:
            return
        with self._lock:
            if self.failure is not None:
                return
            try:
                call(*args)
            except Exception as exc:  # noqa: BLE001 - as in write
                self.failure = exc
                self.on_failure("output")

    def raise_failure(self) -> None:
        if self.failure is not None:
            raise self.failure
