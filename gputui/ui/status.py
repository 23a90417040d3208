"""The top line (profile, mode, what a stopping run waits for, how fresh the data is, the time;
redrawn every second) and the footer (every key, with ? and q pinned to its right end so they
show at any width).

Parts of the top line are separated by " · ", and each part starts with its separator, so
two parts never run together ("gputui · profile local.toml"), whatever reads the text. When
the line is too narrow, the mode goes first, then the profile; the time stays.
"""

from __future__ import annotations

import time
from typing import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import HorizontalGroup
from textual.reactive import reactive
from textual.widgets import Footer
from textual.widgets._footer import FooterKey

from gputui.model.text import clean
from gputui.model.units import duration
from gputui.ui.themed import Themed

PINNED = ("help", "quit")  # footer keys that always show, at the right end
SEP = " · "


class StatusBar(Themed):  # its styles read once a theme: the line is drawn every second
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

    def render(self) -> Text:
        self.renders += 1
        self.drawn_at = time.monotonic()
        style = self._style
        now = time.monotonic()
        late = [f"{what}: no answer for {duration(now - since)}" for what, since in sorted(self.waiting.items())
                if now - since >= 3.0]
        right = Text(SEP.join(late) + SEP if late else "", style("status--warn"))
        right.append(time.strftime("%H:%M:%S", time.localtime(self.clock())), style("status--dim"))
        width = max(1, self.size.width)
        room = max(0, width - right.cell_len - 1)
        parts = [(f"{SEP}profile {clean(self.profile)}", "status--dim")]
        if self.stopping:
            parts.append((f"{SEP}{clean(self.stopping)}", "status--warn"))
        if self.mode:
            parts.append((f"{SEP}{self.mode}", "status--dim"))
        text = Text("gputui", style("status--name"))
        for number, (part, name) in enumerate(parts):
            # the stopping note (a run waiting) may be cut; the mode falls back to its short form
            # ("demo") when the whole note does not fit, so a demo always says it is one
            if part.startswith(SEP + self.mode) and self.mode and text.cell_len + len(part) > room:
                part = SEP + self.mode.split(":")[0]
            if text.cell_len + len(part) <= room or name == "status--warn" or number == 0:
                text.append(part, style(name))
        text.truncate(room, overflow="ellipsis")
        # the gap and the clock in the profile's style: one run of text with it, words kept apart
        text.append(" " * max(1, width - text.cell_len - right.cell_len), style("status--dim"))
        text.append_text(right)
        return text


class DashboardFooter(Footer):
    """Textual's footer with the keys in PINNED docked at its right end, so ? and q never leave
    the screen; of the others, those that fit whole show (in their order), none cut in half: at
    80 columns the last few are left to the help (?), which lists every key."""

    _widths: dict[str, int] = {}  # a key's width on screen, by action (labels do not change)

    def on_resize(self) -> None:
        self.compact = self.size.width < 120  # less room between keys: more of them show
        self.call_after_refresh(self._fit_keys)

    def compose(self) -> ComposeResult:
        pinned: list[FooterKey] = []
        for widget in super().compose():
            if isinstance(widget, FooterKey) and widget.action in PINNED:
                pinned.append(widget)
            else:
                yield widget
        if pinned:
            with HorizontalGroup(id="footer-pinned"):
                yield from sorted(pinned, key=lambda key: PINNED.index(key.action))
        self.call_after_refresh(self._fit_keys)  # a recompose (other bindings) lays the keys out anew

    def _fit_keys(self) -> None:
        """Show the keys that fit whole left of the pinned ones; hide the rest."""
        if not self.is_attached:
            return
        keys = [w for w in self.children if isinstance(w, FooterKey)]
        for key in keys:
            if key.display and key.outer_size.width:
                self._widths = {**self._widths, key.action: key.outer_size.width}
        found = self.query("#footer-pinned")
        pinned = found.first().outer_size.width if found else 0
        if any(key.action not in self._widths for key in keys) or (found and not pinned):
            for key in keys:  # not measured yet: show all, measure again
                if not key.display:
                    key.display = True
            self._fit_again()
            return
        self._tries = 0
        room = self.size.width - pinned
        used = 0
        for key in keys:
            used += self._widths[key.action]
            if key.display != (used <= room):  # no restyle (and no new frame) when nothing changes
                key.display = used <= room

    def _fit_again(self) -> None:
        """The keys (or the pinned ones) are not laid out yet: fit them after the next frame; on a
        busy machine, where frames can come before the layout, every 0.2 s after 20 frames (for a
        minute at most: a footer that is never laid out is not waited for forever)."""
        tries = getattr(self, "_tries", 0)
        if not self.size.width or tries >= 320:
            return
        self._tries = tries + 1
        if tries < 20:
            self.call_after_refresh(self._fit_keys)
        else:
            self.set_timer(0.2, self._fit_keys, name="footer-fit")
