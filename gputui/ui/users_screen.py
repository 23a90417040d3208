"""The lab view's screens: who holds what (key U) and one host (Enter on its line).

Who holds what: every account across the fleet, from each round's lab
(gputui.monitor.lab.UserTotal): GPUs held now, their memory, GPU-hours today, hosts, processes.
Follows each round; Esc (or U) closes. Accounts are text from remote hosts: Text, never markup.

One host: its per-GPU lines, as the hosts panel draws them when they fit, and its compute
processes, most GPU memory first. `LabActions` is the app's part of the lab view: U, Enter on
a host line, the `/` question.
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Static

from gputui.dashboard.hosts import HostsFrame
from gputui.model import units
from gputui.model.text import clean
from gputui.monitor.lab import UserTotal
from gputui.monitor.processes import rows
from gputui.ui.base import DashboardBase
from gputui.ui.hosts_panel import HostsView
from gputui.ui.processes_panel import ProcessTable
from gputui.ui.tables import KeyedTable

USER_COLUMNS = ("account", "GPUs", "GPU memory", "GPU-hours today", "hosts", "processes")


def user_cells(total: UserTotal) -> tuple[Text, ...]:
    cells = (clean(total.user, 64), f"{total.gpus:,}", units.mib(total.memory_mib), f"{total.gpu_hours:,.2f}",
             f"{total.hosts:,}", f"{total.processes:,}")
    return tuple(Text(cell + " ", justify="left" if i == 0 else "right") for i, cell in enumerate(cells))


class UsersTable(KeyedTable):
    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for title in USER_COLUMNS:
            self.add_column(title + " ", key=title)

    def show(self, totals: tuple[UserTotal, ...]) -> None:
        selected = self.selected_key
        self.clear()
        for total in totals:
            self.add_row(*user_cells(total), key=total.user)
        keys = [t.user for t in totals]
        if selected in keys:
            self.move_cursor(row=keys.index(selected), animate=False)


class UsersScreen(Screen[None]):
    """The accounts of the fleet, most GPU memory first. `frame` is set after each hosts poll."""

    BINDINGS = [Binding("escape", "close", "Back", key_display="Esc"), Binding("U", "close", "Back", show=False)]
    frame: reactive[HostsFrame | None] = reactive(None, always_update=True)

    def __init__(self, frame: HostsFrame | None) -> None:
        super().__init__()
        self.set_reactive(UsersScreen.frame, frame)

    def compose(self) -> ComposeResult:
        with Vertical(id="users", classes="panel"):
            yield Static(id="users-summary")
            yield UsersTable(id="users-table", cell_padding=0)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#users").border_title = "Who holds what"
        self.query_one(UsersTable).focus()
        self._redraw()

    def watch_frame(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        lab = self.frame.lab if self.frame is not None else None
        users = lab.users if lab is not None else ()
        self.query_one(UsersTable).show(users)
        if lab is None:
            summary = "waiting for the first round of telemetry ..."
        else:
            summary = (f"{lab.totals.line()}; {units.plural(len(users), 'account')}, most GPU memory first "
                       "(GPU-hours from local midnight, while the dashboard polls)")
        self.query_one("#users-summary", Static).update(Text(clean(summary, 400)))

    def action_close(self) -> None:
        self.dismiss(None)


class HostScreen(Screen[None]):
    """One host of the lab (Enter on its line): its per-GPU lines, as the panel draws them when
    they fit, and its compute processes. Follows each round (`frame`); Esc goes back."""

    BINDINGS = [Binding("escape", "close", "Back", key_display="Esc")]
    frame: reactive[HostsFrame | None] = reactive(None, always_update=True)

    def __init__(self, name: str, frame: HostsFrame | None, held: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.host_name = name
        self.held = held
        self.set_reactive(HostScreen.frame, frame)

    def compose(self) -> ComposeResult:
        with Vertical(id="host-screen", classes="panel"):
            yield HostsView(only=self.host_name, id="host-gpus")
            yield Static(id="host-processes-summary")
            yield ProcessTable(id="host-process-table", cell_padding=0)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#host-screen").border_title = Text(f"Host {clean(self.host_name)}")
        view = self.query_one(HostsView)
        view.held = self.held
        view.focus()
        self._redraw()

    def watch_frame(self) -> None:
        self._redraw()

    def _redraw(self) -> None:
        if not self.is_mounted:
            return
        self.query_one(HostsView).frame = self.frame
        hosts = [h for h in self.frame.hosts if h.name == self.host_name] if self.frame is not None else []
        found = rows(hosts)
        found.sort(key=lambda r: (-(r.process.gpu_memory_mib or 0.0), r.gpu, r.process.pid))
        self.query_one(ProcessTable).show(found)
        if self.frame is not None and not hosts:
            summary = "this host is not in the last round (the profile changed?)"
        else:
            summary = f"{units.plural(len(found), 'compute process')} on this host, most GPU memory first (P: all hosts, signals)"
        self.query_one("#host-processes-summary", Static).update(Text(summary))

    def action_close(self) -> None:
        self.dismiss(None)


def follow_round(app: Any, frame: HostsFrame) -> None:
    """Hand a round to the lab's screens that are open (the host screen, the users screen)."""
    for screen in app.screen_stack[1:]:
        if isinstance(screen, (HostScreen, UsersScreen)):
            screen.frame = frame


class LabActions(DashboardBase):
    """U opens the users screen; the hosts panel's Enter opens a host; / asks for a filter."""

    def action_users(self) -> None:
        self.push_screen(UsersScreen(self.panel(HostsView).frame))

    def on_hosts_view_host_chosen(self, message: HostsView.HostChosen) -> None:
        view = self.panel(HostsView)
        self.push_screen(HostScreen(message.name, view.frame, view.held))

    def on_hosts_view_filter_asked(self, message: HostsView.FilterAsked) -> None:
        from gputui.ui.lab_panel import LabFilterScreen

        view = self.panel(HostsView)

        def chosen(text: str | None) -> None:
            if text is not None:
                view.set_filter(text)

        self.push_screen(LabFilterScreen(message.current), chosen)

