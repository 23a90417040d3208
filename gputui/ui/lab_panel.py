"""The hosts panel's lab view: one line per host when the GPUs do not fit (gputui.ui.hosts_panel
switches to it), and the filter question (/). One host's screen (Enter) and the users screen (U)
are gputui.ui.users_screen.

A lab line, left to right: the state mark, the name, a strip of one cell per GPU, the free GPUs,
the mean utilisation, the account holding the most GPU memory. In the strip a cell's height is
its GPU's utilisation (▁ idle to █ full) and its colour the memory in use (muted below a third,
primary to two thirds, warning above); a free GPU (the profile's [free] rule) is a ○, a GPU
with neither figure known a ?. An unreachable host says why instead, on its one line, cut
with … . Names and accounts come from remote hosts: cleaned, drawn as segments, never markup.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from gputui.model import units
from gputui.model.text import clean
from gputui.monitor.lab import GpuCell, HostLine, LabFilter, filter_lines, sort_lines
from gputui.views.lab import cell_char  # the glyph `gputui monitor` draws too

MAX_LAB_NAME = 22
# The view's orders, in the order `s` goes through them: the round's (the profile's hosts), then
# gputui.monitor.lab's keys.
SORT_CYCLE = ("listed", "util", "free", "memory", "name")
SORT_NAMES = {"listed": "as listed", "util": "utilisation", "free": "free GPUs", "memory": "GPU memory",
              "name": "name"}
Line = list[tuple[str, Style | None]]


def next_sort(key: str) -> str:
    return SORT_CYCLE[(SORT_CYCLE.index(key) + 1) % len(SORT_CYCLE)] if key in SORT_CYCLE else SORT_CYCLE[0]


def lab_rows(lines: Sequence[HostLine], sort: str, wanted: LabFilter) -> list[HostLine]:
    """The lines the view shows: filtered, then in `sort`'s order ("listed": the round's)."""
    kept = filter_lines(lines, wanted) if str(wanted) else list(lines)
    return kept if sort == "listed" else sort_lines(kept, sort)


def lab_layout(rows: Iterable[HostLine]) -> tuple[int, int]:
    """(name width, strip width): the longest name (at most MAX_LAB_NAME), the most GPUs."""
    name_w = cells_w = 0
    for row in rows:
        name_w = max(name_w, len(row.name))
        cells_w = max(cells_w, row.gpus)
    return min(MAX_LAB_NAME, max(4, name_w)), cells_w


def cell_mark(cell: GpuCell) -> tuple[str, str]:
    """One GPU's character and the component class that colours it."""
    glyph = cell_char(cell)
    if cell.free:
        return glyph, "hosts--free"
    mem = cell.mem_pct
    tone = "hosts--dim" if mem is None or mem < 100 / 3 else ("hosts--mem" if mem < 200 / 3 else "hosts--full")
    return glyph, tone


def cut(text: str, width: int) -> str:
    return text if len(text) <= width else (text[: max(0, width - 1)] + "…" if width > 0 else "")


def lab_line(row: HostLine, width: int, name_w: int, cells_w: int, style: Callable[[str], Style]) -> Line:
    """A host's line of the lab view, at most `width` cells."""
    good = row.reachable
    mark = ("● ", style("hosts--ok")) if row.state.value == "ok" else (("● ", style("hosts--warn")) if good else
                                                                       ("✖ ", style("hosts--bad")))
    name = clean(row.name)
    line: Line = [mark, (cut(name, name_w).ljust(name_w), style("hosts--name"))]
    used = 2 + name_w
    if not good:
        reason = row.state.value + (f": {clean(row.message)}" if row.message else "")
        line.append((" " + cut(reason, max(0, width - used - 1)), style("hosts--bad")))
        return line
    line.append((" ", None))
    for cell in row.cells:
        glyph, tone = cell_mark(cell)
        line.append((glyph, style(tone)))
    line.append((" " * (cells_w - len(row.cells)), None))
    used += 1 + cells_w
    free = f" {row.free:>2} free"
    line.append((free, style("hosts--free" if row.free else "hosts--dim")))
    used += len(free)
    util = f" {units.pct(row.util_pct):>4}"
    if used + len(util) <= width:
        line.append((util, None))
        used += len(util)
    if row.top_user is not None and width - used >= 6:
        holder = f"{clean(row.top_user)} {units.mib(row.top_user_mib)}"
        line.append((" " + cut(holder, width - used - 1), style("hosts--dim")))
    return line


def filter_text(wanted: LabFilter, shown: int, total: int, sort: str) -> Text:
    """The panel's subtitle in the lab view: its order, the filter (the user's words: Text) and
    how many hosts it keeps."""
    text = f"sort: {SORT_NAMES.get(sort, sort)}"
    if str(wanted):
        text += f" · filter: {clean(str(wanted), 40)} ({shown:,} of {total:,})"
    return Text(text)


class LabFilterScreen(ModalScreen[str | None]):
    """The `/` question: what to keep. Enter applies (empty clears), Esc leaves it as it was."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, current: str) -> None:
        super().__init__()
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="lab-filter", classes="dialog"):
            yield Label("Filter the hosts: words of a name, user:NAME, free, down (all must hold); "
                        "Enter applies, empty clears, Esc cancels", classes="title", markup=False)
            yield Input(value=self.current, id="lab-filter-input")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value.strip())

    def action_cancel(self) -> None:
        self.dismiss(None)
