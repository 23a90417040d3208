"""The top line: profile, mode, what a stopping run waits for, how fresh the data is, the time.
Redrawn every second."""

from __future__ import annotations

import time
from typing import Callable

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from gputui.model.text import clean
from gputui.ui.draw import duration


class StatusBar(Widget):
    COMPONENT_CLASSES = {"status--name", "status--dim", "status--warn"}
    profile: reactive[str] = reactive("")
    mode: reactive[str] = reactive("")
    stopping: reactive[str] = reactive("")  # "stopping: waiting for the run to ..." while a run stops

    def __init__(self, clock: Callable[[], float], **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.clock = clock
        self.renders = 0  # how often it was drawn: the tests check that repaints go on
        self.waiting: dict[str, float] = {}  # what -> monotonic time since it has been waited for
        self.drawn_at = 0.0

    def tick(self) -> None:
        """Once a second: redraw unless something else just did (one repaint, not two)."""
        if time.monotonic() - self.drawn_at >= 0.9:
            self.refresh()

    def done_waiting(self, what: str) -> None:
        since = self.waiting.pop(what, None)
        if since is not None and time.monotonic() - since >= 3.0:
            self.refresh()  # the "no answer" note goes at once

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def render(self) -> Text:
        self.renders += 1
        self.drawn_at = time.monotonic()
        style = self._style
        text = Text("gputui", style("status--name"))
        text.append(f"  profile {clean(self.profile)}", style("status--dim"))
        if self.stopping:
            text.append(f"  {clean(self.stopping)}", style("status--warn"))
        if self.mode:
            text.append(f"  {self.mode}", style("status--dim"))
        now = time.monotonic()
        late = [f"{what}: no answer for {duration(now - since)}" for what, since in sorted(self.waiting.items())
                if now - since >= 3.0]
        right = Text("  ".join(late) + "  " if late else "", style("status--warn"))
        right.append(time.strftime("%H:%M:%S", time.localtime(self.clock())))
        width = max(1, self.size.width)
        text.truncate(max(0, width - right.cell_len - 1), overflow="ellipsis")
        text.append(" " * max(1, width - text.cell_len - right.cell_len))
        text.append_text(right)
        return text
