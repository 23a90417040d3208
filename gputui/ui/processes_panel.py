"""The process table (key P): every compute process of every host's GPUs, sorted and filtered
from the keyboard; T, I and K send SIGTERM, SIGINT or SIGKILL to the selected one after a
confirmation. The screen only draws the frozen frames the hosts poll gives it and asks the
app to signal: the app's worker does it (gputui.monitor.polling.kill).
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import DataTable, Footer, Input, Static

from gputui.dashboard.hosts import HostsFrame
from gputui.model import units
from gputui.model.text import clean
from gputui.monitor.processes import SIGNALS, ProcessRow, filter_rows, rows, sort_rows
from gputui.ui.bindings import process_bindings
from gputui.ui.tables import KeyedTable
from gputui.model.units import plural

COLUMNS = (("host", "host"), ("GPU", None), ("PID", "pid"), ("user", "user"), ("GPU mem", "memory"), ("SM", "sm"),
           ("CPU", "cpu"), ("RSS", "rss"), ("time", "time"), ("command", "command"))
SORT_NAMES = {"memory": "GPU memory", "sm": "SM %", "cpu": "CPU %", "pid": "PID", "user": "user", "rss": "RSS",
              "time": "time", "host": "host", "command": "command"}
COMMAND_W = 200  # characters of a command line kept (the table cuts it to the screen)


@dataclass(frozen=True)
class Filter:
    """What the `/` filter keeps: a user (exactly) and/or part of a command (any case)."""

    user: str | None = None
    command: str | None = None

    @classmethod
    def parse(cls, text: str) -> "Filter":
        """"user:alice train" -> user alice, command containing "train"."""
        user, words = None, []
        for word in text.split():
            if word.lower().startswith("user:") and len(word) > 5:
                user = word[5:]
            else:
                words.append(word)
        return cls(user, " ".join(words) or None)

    def __str__(self) -> str:
        parts = ([f"user:{self.user}"] if self.user else []) + ([self.command] if self.command else [])
        return " ".join(parts)


def row_key(row: ProcessRow) -> str:
    return f"{row.host}\x00{row.gpu}\x00{row.pid}"


def process_cells(row: ProcessRow) -> tuple[Text, ...]:
    """A process's row. Users and commands come from the hosts: Text, never markup."""
    p = row.process
    cells = (row.host, str(row.gpu), str(p.pid), p.user or "n/a", units.mib(p.gpu_memory_mib), units.pct(p.sm_pct),
             units.pct(p.cpu_pct), units.mib(p.rss_mib), units.duration(p.running_s, "clock"), p.name or "n/a")
    return tuple(Text(clean(cell, COMMAND_W) + " ") for cell in cells)


def describe(row: ProcessRow) -> str:
    p = row.process
    command = clean(p.name, 80) if p.name else "command n/a"
    return f"pid {p.pid} ({command}) of {clean(p.user) if p.user else 'an unknown user'} on {clean(row.host)} GPU {row.gpu}"


class ProcessTable(KeyedTable):
    """One row per process, keyed by host, GPU and PID; the cursor row is the selected process."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for title, _key in COLUMNS:
            self.add_column(title + " ", key=title)

    def show(self, found: list[ProcessRow]) -> None:
        """Redraw with `found` in order; the selected process stays selected while it is there."""
        selected = self.selected_key
        self.clear()
        for row in found:
            self.add_row(*process_cells(row), key=row_key(row))
        keys = [row_key(r) for r in found]
        if selected in keys:
            self.move_cursor(row=keys.index(selected), animate=False)



class ProcessScreen(Screen[None]):
    """The process table. `frame` is set by the app after each hosts poll."""

    BINDINGS = process_bindings()
    frame: reactive[HostsFrame | None] = reactive(None, always_update=True)
    sort_key: reactive[str] = reactive("memory")
    reverse: reactive[bool] = reactive(False)
    filter: reactive[Filter] = reactive(Filter)
    result: reactive[str] = reactive("")  # the last signal's outcome, as the events panel has it

    def __init__(self, frame: HostsFrame | None = None) -> None:
        super().__init__()
        self.set_reactive(ProcessScreen.frame, frame)
        self.shown: list[ProcessRow] = []

    def compose(self) -> ComposeResult:
        with Vertical(id="processes", classes="panel"):
            yield Static(id="processes-summary")
            yield ProcessTable(id="process-table", cell_padding=0)
            yield Input(placeholder="part of a command and/or user:NAME; Enter applies, empty clears, Esc leaves it",
                        id="process-filter")
            yield Static(id="processes-result")
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#processes").border_title = "Processes"
        self.query_one(Input).display = False
        self.query_one(ProcessTable).focus()
        self._redraw()

    def watch_frame(self) -> None:
        self._redraw()

    def watch_sort_key(self) -> None:
        self._redraw()

    def watch_reverse(self) -> None:
        self._redraw()

    def watch_filter(self) -> None:
        self._redraw()

    def watch_result(self) -> None:
        if self.is_mounted:
            self.query_one("#processes-result", Static).update(Text(clean(self.result)))

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        found = rows(self.frame.hosts) if self.frame is not None else []
        wanted = self.filter
        kept = filter_rows(found, wanted.user, wanted.command)
        self.shown = sort_rows(kept, self.sort_key, self.reverse)
        self.query_one(ProcessTable).show(self.shown)
        order = f"sorted by {SORT_NAMES[self.sort_key]}" + (" (reversed)" if self.reverse else "")
        if self.frame is None:
            summary = "waiting for the first round of telemetry ..."
        else:
            hosts = len(self.frame.hosts)
            summary = f"{len(self.shown)} of {plural(len(found), 'compute process')} on {plural(hosts, 'host')}, {order}"
            if wanted.user or wanted.command:
                summary += f"; filter: {wanted}"
        self.query_one("#processes-summary", Static).update(Text(clean(summary)))

    @property
    def selected(self) -> ProcessRow | None:
        key = self.query_one(ProcessTable).selected_key
        return next((r for r in self.shown if row_key(r) == key), None)

    # keys ----------------------------------------------------------------------------
    def action_sort(self, key: str) -> None:
        if key == self.sort_key:
            self.reverse = not self.reverse
        else:
            self.sort_key, self.reverse = key, False

    def action_reverse(self) -> None:
        self.reverse = not self.reverse

    def action_filter(self) -> None:
        box = self.query_one(Input)
        box.value = str(self.filter)
        box.display = True
        box.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.filter = Filter.parse(event.value)
        self._close_filter()

    def _close_filter(self) -> None:
        box = self.query_one(Input)
        box.display = False
        self.query_one(ProcessTable).focus()

    def on_data_table_header_selected(self, event: DataTable.HeaderSelected) -> None:
        sort = dict(COLUMNS).get(str(event.column_key.value))
        if sort is not None:
            self.action_sort(sort)

    def action_signal(self, name: str) -> None:
        from gputui.ui.screens import ChoiceScreen

        row = self.selected
        if row is None:
            self.result = "no process selected (move to one with the arrows)"
            return
        assert name in SIGNALS

        def chosen(choice: str | None) -> None:
            if choice == "send":
                self.app.signal_process(row, name)  # type: ignore[attr-defined]

        self.app.push_screen(ChoiceScreen(f"Send SIG{name} to {describe(row)}?",
                                          [("send", f"Send SIG{name}", "error"), ("cancel", "Cancel", "primary")]),
                             chosen)

    def action_close(self) -> None:
        box = self.query_one(Input)
        if box.display:
            self._close_filter()
            return
        self.dismiss(None)
