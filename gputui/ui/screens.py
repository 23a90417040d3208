"""The dashboard's modal screens: help (from the one list of keys), questions, profile choice."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table
from rich.text import Text
from textual import events
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Label, OptionList, Static
from textual.widgets.option_list import Option

from gputui.model.text import clean
from gputui.ui.bindings import KEYS, LAB_KEYS, PROCESS_KEYS, PROGRAM_KEYS, Key


def keys_table(keys: tuple[Key, ...] = KEYS) -> Table:
    table = Table(box=None, show_header=False, padding=(0, 2))
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for key in keys:
        table.add_row(key.display or key.key, key.help)
    return table


HELP_NOTES = ("Tab and Shift+Tab move between the panels (hosts, slaves, events); the arrows, PgUp/PgDn, "
              "Home/End scroll the one with the focus. Narrower than 100 columns the panels stack and the "
              "screen scrolls to the focused one.\n"
              "Mouse: click a panel to focus it, a slave row to select it, a footer key to press it; the wheel "
              "scrolls.\n"
              "Before you press them, the cost panel says what u launches (type, zone, $/h) and what d "
              "terminates (the selected slave, its spend); with [ui] confirm = true in the profile both ask first.")


class HelpScreen(ModalScreen[None]):
    """Every key, from the one list; scrolls (arrows, PgUp/PgDn, Home/End, the wheel) when the
    terminal is shorter than the list."""

    BINDINGS = [Binding("escape,question_mark,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help", classes="dialog"):
            yield Label("gputui dashboard: keys   (Esc, ? or q closes this help)", classes="title")
            yield Static(keys_table(), id="help-keys")
            if getattr(getattr(self.app, "training", None), "program", None) is not None:
                yield Label("With a run of your own program on screen:", classes="subtitle")
                yield Static(keys_table(PROGRAM_KEYS), id="help-program-keys")
            yield Label("In the process table (P):", classes="subtitle")
            yield Static(keys_table(PROCESS_KEYS), id="help-process-keys")
            yield Label("In the hosts panel's lab view (one line per host, when the GPUs do not fit):",
                        classes="subtitle")
            yield Static(keys_table(LAB_KEYS), id="help-lab-keys")
            yield Static(HELP_NOTES, classes="dim", markup=False)
            yield Static("Esc, ? or q closes this help.", classes="dim")

    def on_mount(self) -> None:
        self.query_one("#help").focus()

    def action_close(self) -> None:
        self.dismiss(None)


class ChoiceScreen(ModalScreen[str]):
    """A question with buttons; each answer also has a key (its label's first letter).
    Dismisses with the chosen id; Esc is "cancel"."""

    BINDINGS = [Binding("escape", "choose('cancel')", "Cancel")]

    def __init__(self, question: str, choices: list[tuple[str, str, str]]) -> None:
        super().__init__()
        self.question = question
        self.choices = choices  # (id, label, variant)
        self.keys = {label[0].lower(): choice_id for choice_id, label, _variant in choices}

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(Text(clean(self.question)), classes="question")  # names a cluster of the profile: data
            with Horizontal(classes="buttons"):
                for choice_id, label, variant in self.choices:
                    yield Button(f"[u]{label[0]}[/u]{label[1:]}", id=choice_id, variant=variant)  # type: ignore[arg-type]

    def on_mount(self) -> None:
        self.query(Button).last().focus()  # the last answer (cancel) is the default

    def on_key(self, event: events.Key) -> None:
        choice = self.keys.get(event.key)
        if choice is not None:
            event.stop()
            self.dismiss(choice)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id or "cancel")

    def action_choose(self, choice: str) -> None:
        self.dismiss(choice)


class ProfileScreen(ModalScreen[Path | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, profiles: list[Path], current: Path) -> None:
        super().__init__()
        self.profiles = profiles
        self.current = current

    def compose(self) -> ComposeResult:
        with Vertical(id="profiles", classes="dialog"):
            yield Label("Choose a profile (Enter), Esc to cancel", classes="title")
            yield OptionList(*[Option(Text(clean(f"{'● ' if p == self.current else '  '}{p.name}  ({p.parent})")), id=str(p))
                               for p in self.profiles])  # file names are data: never markup

    def on_mount(self) -> None:
        options = self.query_one(OptionList)
        options.focus()
        if self.current in self.profiles:
            options.highlighted = self.profiles.index(self.current)

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(Path(event.option.id) if event.option.id else None)

    def action_cancel(self) -> None:
        self.dismiss(None)
