"""A panel drawn line by line (`render_line`), with what every line needs read once a pass."""

from __future__ import annotations

from rich.style import Style
from textual.geometry import Region
from textual.scroll_view import ScrollView
from textual.strip import Strip


class LinesView(ScrollView):
    """A ScrollView whose lines read their width and base style through `width_style()`.

    Textual's `scrollable_content_region` looks the widget up in the compositor's map (the map
    is rebuilt when a layout changed) and `rich_style` walks the ancestors' styles (about 80 us
    each time at the dashboard's depth): read for every line, they were a third of a frame of
    the lab view. They are read once per compositor pass here; a line drawn outside a pass
    (a test calling render_line) reads them then."""

    _pass: tuple[int, Style] | None = None

    def render_lines(self, crop: Region) -> list[Strip]:
        self._pass = (self.scrollable_content_region.width, self.rich_style)
        try:
            return super().render_lines(crop)
        finally:
            self._pass = None

    def width_style(self) -> tuple[int, Style]:
        """The content width and base style of the pass being drawn (or of now)."""
        return self._pass or (self.scrollable_content_region.width, self.rich_style)
