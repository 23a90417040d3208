"""Events: a scrolling log of what happened, newest last."""

from __future__ import annotations

from rich.text import Text
from textual.widgets import RichLog

from gputui.model.text import clean

MAX_LINE = 2000  # characters of one event (remote text); a longer one ends in an ellipsis
SEVERITY_CLASS = {"information": "events--info", "warning": "events--warn", "error": "events--bad",
                  "alert": "events--alert", "cleared": "events--cleared"}  # alerts: highlighted


class EventsLog(RichLog):
    COMPONENT_CLASSES = {"events--info", "events--warn", "events--bad", "events--time", "events--alert", "events--cleared"}

    def __init__(self, **kwargs: object) -> None:
        super().__init__(wrap=True, max_lines=1000, markup=False, **kwargs)  # type: ignore[arg-type]
        self.lines_written: list[str] = []  # plain text of every line, for tests and the tmux check

    def add(self, stamp: str, text: str, severity: str = "information") -> None:
        """One line: `text` may hold what a host, a slave or the cloud said, so it is shown as
        plain text (never markup) without control characters."""
        text = clean(text, MAX_LINE)
        line = Text(f"{stamp} ", self.get_component_rich_style("events--time", partial=True))
        line.append(text, self.get_component_rich_style(SEVERITY_CLASS[severity], partial=True))
        self.lines_written.append(text)
        del self.lines_written[:-1000]
        self.write(line)
