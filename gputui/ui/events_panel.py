"""Events: a scrolling log of what happened, newest last.

It keeps each event (time, text, severity) and wraps them to the panel's width when drawn,
so a resize (or a theme change) re-wraps every line, old ones too: a line is as wide as the
panel at 200 columns and folds at word boundaries at 80, the continuation lines indented under
the text. Event text may hold what a host, a slave or the cloud said: it is drawn as rich
Text, never markup, without control characters. Focus it (Tab, a click) to scroll with the
arrows, PgUp/PgDn, Home/End; it follows the newest line while scrolled to the end.
"""

from __future__ import annotations

from collections import deque

from rich.segment import Segment
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip

from gputui.model.text import clean
from gputui.ui.lines import LinesView

MAX_LINE = 2000  # characters of one event (remote text); a longer one ends in an ellipsis
MAX_EVENTS = 1000
SEVERITY_CLASS = {"information": "events--info", "warning": "events--warn", "error": "events--bad",
                  "alert": "events--alert", "cleared": "events--cleared"}  # alerts: highlighted


class EventsLog(LinesView, can_focus=True):
    COMPONENT_CLASSES = {"events--info", "events--warn", "events--bad", "events--time", "events--alert", "events--cleared"}

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.lines_written: list[str] = []  # plain text of every line, for tests and the tmux check
        self._events: deque[tuple[str, str, str]] = deque(maxlen=MAX_EVENTS)  # (stamp, text, severity)
        self._rows: list[Strip] = []  # the events wrapped to `_width`, oldest first
        self._counts: deque[int] = deque()  # how many rows each event took
        self._width = 0

    @property
    def lines(self) -> list[Strip]:
        """The rows as drawn at the current width (one event may take several)."""
        return list(self._rows)

    def add(self, stamp: str, text: str, severity: str = "information") -> None:
        """One event: `text` may hold what a host, a slave or the cloud said, so it is shown as
        plain text (never markup) without control characters."""
        text = clean(text, MAX_LINE)
        self.lines_written.append(text)
        del self.lines_written[:-MAX_EVENTS]
        if len(self._events) == MAX_EVENTS:
            del self._rows[: self._counts.popleft()]
        self._events.append((stamp, text, severity))
        if self._width:
            follow = self.scroll_y >= self.max_scroll_y
            rows = self._wrap(stamp, text, severity, self._width)
            self._rows += rows
            self._counts.append(len(rows))
            in_place = self._grow(Size(self._width, len(self._rows)))
            if follow:  # after the new layout, or now when there is none to wait for
                self.scroll_end(animate=False, immediate=in_place, x_axis=False)
            self.refresh()

    def _grow(self, size: Size) -> bool:
        """The new virtual size after a line. Setting `virtual_size` lays the whole screen out
        again, which a log taking a line a second can do without while it scrolls already (its
        scrollbar stays; only the thumb moves): then the scrollbars are updated in place, and
        this says True."""
        view = self.scrollable_content_region.height
        update = getattr(self, "_scroll_update", None)  # Textual's own step after a size change
        if callable(update) and size.width == self.virtual_size.width and min(size.height, self.virtual_size.height) > view:
            self.set_reactive(EventsLog.virtual_size, size)
            update(size)
            return True
        self.virtual_size = size
        return False

    def _wrap(self, stamp: str, text: str, severity: str, width: int) -> list[Strip]:
        style = self.get_component_rich_style(SEVERITY_CLASS.get(severity, "events--info"), partial=True)
        indent = len(stamp) + 1
        body = Text()
        body.append(text, style)  # a span (wrapping keeps it), not the base style
        folded = body.wrap(self.app.console, max(10, width - indent), overflow="fold") or [Text("")]
        rows = []
        for number, line in enumerate(folded):
            line.rstrip()
            # The time takes the line's colour: one run of text "12:00:01 epoch 3: ...", never two
            # runs that a reader of the SVG snapshot could join as "12:00:01epoch".
            segments = [Segment(f"{stamp} " if number == 0 else " " * indent, style)]
            segments += list(line.render(self.app.console, end=""))
            rows.append(Strip(segments).simplify())  # one segment per colour: one SVG text run
        return rows

    def _rewrap(self) -> None:
        width = self.scrollable_content_region.width
        if width <= 0:
            return
        follow = not self._rows or self.scroll_y >= self.max_scroll_y
        self._width = width
        self._rows, self._counts = [], deque()
        for stamp, text, severity in self._events:
            rows = self._wrap(stamp, text, severity, width)
            self._rows += rows
            self._counts.append(len(rows))
        self.virtual_size = Size(width, len(self._rows))
        if follow:
            self.scroll_end(animate=False, immediate=False, x_axis=False)
        self.refresh()

    def on_resize(self) -> None:
        if self.scrollable_content_region.width != self._width:
            self._rewrap()

    def on_mount(self) -> None:
        self._rewrap()
        self.app.theme_changed_signal.subscribe(self, lambda _theme: self.call_after_refresh(self._rewrap))

    def notify_style_update(self) -> None:
        super().notify_style_update()
        if self._width:
            self._rewrap()  # the theme changed: the colours of every line

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        width, base = self.width_style()
        if index >= len(self._rows):
            return Strip.blank(width, base)
        strip = self._rows[index].apply_style(base).extend_cell_length(width, base)
        return strip.crop(0, width).apply_offsets(0, index)
