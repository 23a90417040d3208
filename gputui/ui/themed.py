"""Widgets that draw with their component classes' styles, read once a theme.

Textual's `get_component_rich_style` walks the ancestors' styles each time (about 80 us at the
dashboard's depth); a widget drawn every second, line by line, reads each style once and reads
them again when the theme changes (L) or its styles are updated.
"""

from __future__ import annotations

from rich.style import Style
from textual.widget import Widget


class Themed(Widget):
    """`_style(name)`: a component class's style, cached until the theme or the styles change;
    `restyled()` runs once the new theme's variables are in place (default: a repaint)."""

    _styles: dict[str, Style] | None = None

    def _style(self, name: str) -> Style:
        styles = self._styles
        if styles is None:
            styles = self._styles = {}
        style = styles.get(name)
        if style is None:
            style = styles[name] = self.get_component_rich_style(name, partial=True)
        return style

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, _theme: object) -> None:
        self._styles = None
        self.call_after_refresh(self._after_theme)

    def _after_theme(self) -> None:
        self._styles = None
        self.restyled()

    def restyled(self) -> None:
        self.refresh()

    def notify_style_update(self) -> None:
        self._styles = None
        super().notify_style_update()
