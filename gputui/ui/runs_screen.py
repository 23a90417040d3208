"""The runs screen (key R): past runs as `gputui runs` lists them; see one in detail (Enter), pick
runs to lay over the curves, resume one, or delete one (asks first). And the attach dialog (key a): the live runs
on this machine, whoever started them.

The lists are read in thread workers (a run's events, /proc, the cost ledger); the screens
only draw them. Everything read from run directories is data: shown as Text, never markup.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Label, OptionList, Static
from textual.widgets.option_list import Option

from gputui.runs import history
from gputui.runs import store as runs
from gputui.model.errors import GputuiError
from gputui.model.text import clean
from gputui.ui.bindings import Key
from gputui.ui.screens import ChoiceScreen
from gputui.ui.tables import KeyedTable
from gputui.model.units import plural

# Keys of the runs screen, shown in its footer.
RUNS_KEYS: tuple[Key, ...] = (
    Key("space", "toggle_overlay", "Overlay", "Lay the selected run over the curves (again: take it off).", "Space"),
    Key("enter", "details", "Details", "The selected run in detail: its command, code, latest metrics, "
        "checkpoints and last output lines (as `gputui runs show`).", "Enter"),
    Key("r", "resume", "Resume", "Resume the selected run from its last checkpoint."),
    Key("x", "delete", "Delete", "Delete the selected run's directory (asks first).", "x"),
    Key("escape", "close", "Back", "Back to the dashboard (R too).", "Esc"),
)


def runs_bindings() -> list[BindingType]:
    keys: list[BindingType] = [Binding(k.key, k.action, k.label, key_display=k.display) for k in RUNS_KEYS]
    return keys + [Binding("R", "close", "Back", show=False), Binding("delete", "delete", "Delete", show=False)]


# history.COLUMNS in the screen's order: what tells runs apart first (a narrow screen scrolls to the rest).
SCREEN_ORDER = tuple(history.COLUMNS.index(name) for name in (
    "id", "state", "epochs", "best acc", "final acc", "time", "cost", "model", "device", "strategy", "started", "note"))


class RunsLoaded(Message):
    def __init__(self, listed: list[history.RunSummary] | None, error: str | None = None) -> None:
        super().__init__()
        self.listed = listed
        self.error = error


class RunsScreen(Screen[None]):
    """Every run under `home`, newest first. The app gives it `overlay` (the run directories laid
    over the curves) and reads it back when it changes (`app.set_overlay`)."""

    BINDINGS = runs_bindings()

    def __init__(self, home: Path, overlay: Sequence[str] = ()) -> None:
        super().__init__()
        self.home = home
        self.overlay = list(overlay)
        self.listed: list[history.RunSummary] = []
        self.loads = 0  # lists drawn (tests wait on it)

    def compose(self) -> ComposeResult:
        with Vertical(id="runs"):
            yield Static(Text(f"Runs in {self.home}"), id="runs-title")  # what each key does: the footer
            yield KeyedTable(id="runs-table", cursor_type="row", zebra_stripes=True)
            yield Static(id="runs-result")
        yield Footer()

    def on_mount(self) -> None:
        table = self.query_one(KeyedTable)
        table.add_columns("overlay", *(history.COLUMNS[i] for i in SCREEN_ORDER))
        table.focus()
        self.reload()

    def reload(self) -> None:
        self.run_worker(self._load, name="runs-list", group="runs-list", thread=True, exclusive=True,
                        exit_on_error=False)

    def _load(self) -> None:
        try:
            listed = history.list_runs(self.home)
        except (GputuiError, OSError) as exc:
            self.post_message(RunsLoaded(None, f"cannot list the runs: {exc}"))
            return
        self.post_message(RunsLoaded(listed))

    def on_runs_loaded(self, message: RunsLoaded) -> None:
        if message.listed is None:
            self.say(message.error or "")
            return
        self.listed = list(reversed(message.listed))  # newest first
        table = self.query_one(KeyedTable)
        selected = table.selected_key
        table.clear()
        for s in self.listed:
            mark = "●" if s.path in self.overlay else ""
            cells = history.cells(s)
            table.add_row(Text(mark), *(Text(clean(cells[i])) for i in SCREEN_ORDER), key=s.path)
        if selected is not None and any(s.path == selected for s in self.listed):
            table.move_cursor(row=table.get_row_index(selected))
        if not self.listed:
            self.say(f"no runs in {self.home} yet; t starts one")
        self.loads += 1

    def say(self, text: str) -> None:
        self.query_one("#runs-result", Static).update(Text(clean(text)))

    def selected(self) -> history.RunSummary | None:
        key = self.query_one(KeyedTable).selected_key
        return next((s for s in self.listed if s.path == key), None)

    def action_toggle_overlay(self) -> None:
        s = self.selected()
        if s is None:
            return
        if s.path in self.overlay:
            self.overlay.remove(s.path)
            self.say(f"run {s.run_id} taken off the curves")
        else:
            self.overlay.append(s.path)
            self.say(f"run {s.run_id} laid over the curves")
        table = self.query_one(KeyedTable)
        table.update_cell(s.path, table.ordered_columns[0].key, Text("●" if s.path in self.overlay else ""))
        setter = getattr(self.app, "set_overlay", None)
        if setter is not None:
            setter(list(self.overlay))

    def action_details(self) -> None:
        s = self.selected()
        if s is not None:
            self.app.push_screen(RunDetailScreen(s.path))

    def on_data_table_row_selected(self, event: Any) -> None:  # Enter on the table (its own key)
        event.stop()
        self.action_details()

    def action_resume(self) -> None:
        s = self.selected()
        if s is None:
            return
        if s.state == "running":
            self.say(f"run {s.run_id} is running: a attaches to it")
            return
        self.dismiss(None)
        resume: Any = getattr(self.app, "resume_run", None)
        if resume is not None:
            resume(runs.RunDir(Path(s.path)))

    def action_delete(self) -> None:
        s = self.selected()
        if s is None:
            return
        if s.state == "running":
            self.say(f"run {s.run_id} is running: stop it first")
            return

        def chosen(choice: str | None) -> None:
            if choice == "delete":
                self.run_worker(lambda: self._delete(s), name="runs-delete", group="runs-list", thread=True,
                                exit_on_error=False)

        self.app.push_screen(ChoiceScreen(f"Delete run {s.run_id}? Its directory {s.path} goes, with its "
                                          "checkpoint and events.", [("delete", "Delete", "error"),
                                                                     ("cancel", "Cancel", "primary")]), chosen)

    def _delete(self, s: history.RunSummary) -> None:
        try:
            history.delete_run(runs.RunDir(Path(s.path)))
        except GputuiError as exc:
            self.post_message(RunDeleted(s, str(exc)))
            return
        self.post_message(RunDeleted(s, None))

    def on_run_deleted(self, message: RunDeleted) -> None:
        s = message.summary
        if message.error:
            self.say(message.error)
            return
        self.say(f"run {s.run_id} deleted ({s.path})")
        if s.path in self.overlay:
            self.overlay.remove(s.path)
            setter = getattr(self.app, "set_overlay", None)
            if setter is not None:
                setter(list(self.overlay))
        self.reload()

    def action_close(self) -> None:
        self.dismiss(None)


class DetailRead(Message):
    def __init__(self, lines: list[str], error: str | None) -> None:
        super().__init__()
        self.lines = lines
        self.error = error


class RunDetailScreen(ModalScreen[None]):
    """One run in detail (Enter on the runs screen): gputui.runs.detail's lines, read in a worker
    (the ends of the run's files only), drawn as plain Text."""

    BINDINGS = [Binding("escape,enter,q", "close", "Close")]
    DEFAULT_CSS = """
    RunDetailScreen { align: center middle; background: $background 60%; }
    RunDetailScreen > #run-detail { width: 96%; max-width: 140; height: auto; max-height: 90%; }
    """

    def __init__(self, run_dir: str) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.lines: list[str] | None = None  # what was drawn (the tests read it)

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="run-detail", classes="dialog"):
            yield Label(Text(clean(f"run {Path(self.run_dir).name}   (Esc or Enter closes)")), classes="title")
            yield Static(Text("reading ...", "dim"), id="run-detail-text")

    def on_mount(self) -> None:
        self.query_one("#run-detail").focus()
        self.run_worker(self._work, name="run-detail", group="run-detail", thread=True, exit_on_error=False)

    def _work(self) -> None:
        from gputui.runs import detail

        try:
            lines = detail.text_lines(detail.detail(self.run_dir))
        except (GputuiError, OSError) as exc:
            self.post_message(DetailRead([], str(exc)))
            return
        self.post_message(DetailRead(lines, None))

    def on_detail_read(self, message: DetailRead) -> None:
        self.lines = message.lines
        text = Text("\n".join(message.lines[1:])) if message.lines else Text(clean(message.error or ""), "red")
        if message.lines:
            self.query_one(".title", Label).update(Text(clean(message.lines[0]) + "   (Esc or Enter closes)"))
        self.query_one("#run-detail-text", Static).update(text)

    def action_close(self) -> None:
        self.dismiss(None)


class RunDeleted(Message):
    def __init__(self, summary: history.RunSummary, error: str | None) -> None:
        super().__init__()
        self.summary = summary
        self.error = error


# -- attach: the live runs ---------------------------------------------------------------------------

class LiveRuns(Message):
    def __init__(self, found: list[tuple[str, str]]) -> None:
        super().__init__()
        self.found = found  # (run directory, line)


def live_lines(home: Path) -> list[tuple[str, str]]:
    """(run directory, a line saying what it is) for each live run under `home`, newest first."""
    out = []
    for run in runs.live_runs(home):
        known = runs.live_process(run)
        if known is None:
            continue
        s = history.summarize(run, writing=True)
        age = "" if s.last_event is None else f", last event {max(0, int(time.time() - s.last_event))} s ago"
        profile = f", profile {Path(known.profile).name}" if known.profile else ""
        what = " · ".join(x for x in (s.model, s.device, s.strategy) if x) or "starting"
        # the epoch it is in, counted as the training panel and `gputui run` count it (from 1)
        epoch = s.epochs_done + 1 if s.epochs is None else min(s.epochs_done + 1, s.epochs)
        out.append((str(run.path), f"{run.run_id}  {what}  epoch {epoch}/{s.epochs or '?'}  "
                                   f"pid {known.pid}{profile}{age}"))
    return out


class AttachScreen(ModalScreen[str | None]):
    """The live runs on this machine; Enter attaches to one (dismisses with its directory)."""

    BINDINGS = [Binding("escape,a", "cancel", "Cancel")]

    def __init__(self, home: Path) -> None:
        super().__init__()
        self.home = home
        self.found: list[tuple[str, str]] | None = None

    def compose(self) -> ComposeResult:
        with Vertical(id="attach", classes="dialog"):
            yield Label("Attach to a run on this machine (Enter), Esc to cancel", classes="title")
            yield OptionList(id="attach-list")
            yield Static(Text("looking for runs ..."), id="attach-note", classes="dim")

    def on_mount(self) -> None:
        self.run_worker(lambda: self.post_message(LiveRuns(live_lines(self.home))), name="runs-live",
                        group="runs-live", thread=True, exclusive=True, exit_on_error=False)

    def on_live_runs(self, message: LiveRuns) -> None:
        self.found = message.found
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options([Option(Text(clean(line)), id=path) for path, line in message.found])
        note = (f"{plural(len(message.found), 'run')} going" if message.found
                else f"no run is going on this machine (under {self.home}); t starts one")
        self.query_one("#attach-note", Static).update(Text(clean(note)))
        options.display = bool(message.found)
        if message.found:
            options.highlighted = 0
            options.focus()

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)

    def action_cancel(self) -> None:
        self.dismiss(None)
