"""The dashboard's state and the helpers every part of it uses (panels, the log, the cloud handle).

The key handlers (gputui.ui.training_actions, gputui.ui.slave_actions) and the app
(gputui.ui.app) build on this class.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from textual.app import App
from textual.timer import Timer

from gputui.dashboard.cost import CostFrame, LaunchPreview, launch_preview
from gputui.dashboard.hosts import HostFeed
from gputui.dashboard.session import RunSession
from gputui.dashboard.setup import Backend
from gputui.dashboard.training import TrainingState
from gputui.model.errors import GputuiError
from gputui.model.cloud import CloudEvent
from gputui.model.telemetry import HostState
from gputui.model.text import clean
from gputui.ui.cost_panel import CostPanel
from gputui.ui.events_panel import EventsLog
from gputui.ui.hosts_panel import HostsView
from gputui.ui.messages import CloudEventPosted, CloudNote, CostPolled
from gputui.ui.status import StatusBar
from gputui.ui.training_panel import TrainingPanel

if TYPE_CHECKING:  # the cloud layer loads in a worker, after the first frame
    from gputui.monitor.alerts import RunFacts
    from gputui.dashboard.alerting import DashboardAlerts
    from gputui.dashboard.child import TrainingChild
    from gputui.dashboard.slaves import SlaveControl
    from gputui.runs.store import RunDir


M = TypeVar("M")


def shown(app: App[Any]) -> bool:
    """Whether the dashboard's screen is there to draw on. Not once the app shuts down: Textual
    stops running first, then removes each screen's widgets while the screen is still on the
    stack (a report handled then found no StatusBar: NoMatches), then empties the stack."""
    return bool(app.screen_stack) and app.is_running


def while_shown(handler: Callable[[Any, M], None]) -> Callable[[Any, M], None]:
    """A handler of what a worker or the run's threads post, called only while the dashboard's
    screen is there (`shown`): a report posted as the app closes is dropped."""

    @functools.wraps(handler)
    def handle(app: Any, message: M) -> None:
        if shown(app):
            handler(app, message)

    return handle


PREVIEW_EVERY_S = 60.0  # how often the cloud poll prices the next `u` again
LIGHT_THEME, DARK_THEME = "textual-light", "textual-dark"


class DashboardBase(App[None]):
    # Size classes on the screen (gputui.ui's docstring: what each size shows); dashboard.tcss uses them.
    HORIZONTAL_BREAKPOINTS = [(0, "-narrow"), (100, "-medium"), (120, "-wide")]
    VERTICAL_BREAKPOINTS = [(0, "-short"), (30, "-mid"), (40, "-tall")]
    quitting = False

    def __init__(self, backend: Backend) -> None:
        super().__init__()
        self._preview: tuple[float, object, LaunchPreview | None] | None = None  # (when, for whom, what): the next `u`
        self._confirm: tuple[object, bool] | None = None  # (profile, [ui] confirm)
        self.exit_message: str | None = None
        self.backend = backend
        self.clock = backend.clock
        self.feed: HostFeed | None = None
        self.slaves: SlaveControl | None = None
        self._slaves_lock = threading.Lock()
        self.feed_stale = self.slaves_stale = False
        self.cloud_disabled: str | None = None
        self.cost_frame: CostFrame | None = None
        self.cost_note = ""
        self.session = RunSession()  # who holds the run and where it stands (gputui.dashboard.session)
        self.host_states: dict[str, HostState] = {}
        self.hosts_polls = self.cloud_polls = 0
        self._cloud_timer: Timer | None = None
        self._cloud_polling = False  # a cloud poll was started and its answer is not handled yet
        self._cloud_again = False  # the slaves changed while a cloud poll ran: the next one comes at once
        self.processes_open = False  # the process table is shown: the feed asks for per-process SM %
        # The profile's [alerts], built and used only by the hosts poll worker; None without the table.
        self.alerts: DashboardAlerts | None = None
        self.alerts_profile: Any = None  # the profile they were read from (a new profile reads them again)
        self.run_facts: RunFacts | None = None  # the run as the alerts see it (the training reader folds it)

    # The run, read from the session (the keys change it through the session's moves only).
    @property
    def training(self) -> TrainingState:
        return self.session.training

    @property
    def child(self) -> "TrainingChild | None":
        return self.session.child

    @property
    def attached(self) -> "RunDir | None":
        return self.session.attached

    @property
    def generation(self) -> int:
        return self.session.generation

    def panel(self, selector: Any) -> Any:
        """A widget of the main screen (the app's own query would search a dialog on top)."""
        return self.screen_stack[0].query_one(selector)

    def log_event(self, text: str, severity: str = "information") -> None:
        """A line in the events log, newest last."""
        self.panel(EventsLog).add(time.strftime("%H:%M:%S", time.localtime(self.clock())), text, severity)

    def say(self, text: str, severity: str = "information", notify: bool = False) -> None:
        self.log_event(text, severity)
        if notify:
            self.notify(clean(text), severity=severity, markup=False)  # type: ignore[arg-type]

    def get_slaves(self) -> "SlaveControl | None":
        """The slave control, built on first use (in a worker: it may load boto3)."""
        with self._slaves_lock:
            if self.slaves is None or self.slaves_stale:
                if self.slaves is not None:
                    self.slaves.close()
                self.slaves_stale = False
                self.slaves = self.backend.slaves(self._cloud_note, self._cloud_event)
            return self.slaves

    def _cloud_note(self, text: str) -> None:
        self.post_message(CloudNote(text))

    def _cloud_event(self, event: CloudEvent) -> None:
        self.post_message(CloudEventPosted(event))

    def start_poll(self, what: str, work: Callable[[], None]) -> None:
        """One poll in its worker; its message schedules the next, so polls never overlap.
        None once the app is closing (a timer can still fire after its screens are gone)."""
        if not shown(self) or getattr(self, "_exit", False):
            return
        self.panel(StatusBar).waiting.setdefault(what, time.monotonic())
        self.run_worker(work, name=f"{what}-poll", group=what, thread=True, exclusive=True, exit_on_error=False)

    def poll_cloud(self) -> None:
        self._cloud_polling = True
        self.start_poll("cloud", self._poll_cloud)

    def _poll_cloud(self) -> None:
        try:
            slaves = self.get_slaves()
            if slaves is None:
                self.post_message(CostPolled(None, disabled=f"no cloud: {self.backend.profile.name} has no [cloud] "
                                             "table (p: pick a profile with one, e.g. aws-spot.toml)"))
                return
            frame = slaves.poll()
            frame = replace(frame, next_launch=self._next_launch(slaves))
        except GputuiError as exc:
            self.post_message(CostPolled(None, error=f"cloud: {exc}"))
            return
        self.post_message(CostPolled(frame))

    def _next_launch(self, slaves: "SlaveControl") -> LaunchPreview | None:
        """In the cloud worker: what `u` would launch (priced again every PREVIEW_EVERY_S)."""
        now = time.monotonic()
        if self._preview is None or self._preview[1] is not slaves or now - self._preview[0] >= PREVIEW_EVERY_S:
            try:
                self._preview = (now, slaves, launch_preview(slaves.ctx))
            except GputuiError:
                self._preview = (now, slaves, None)
        return self._preview[2]

    def ui_confirm(self) -> bool:
        """The profile's [ui] confirm: u and d ask first (read again when the profile changes)."""
        from gputui.config.profile import load_profile

        profile = self.backend.profile
        if self._confirm is None or self._confirm[0] != profile:
            try:
                table = load_profile(profile).tables.get("ui") or {}
            except GputuiError:
                table = {}
            self._confirm = (profile, bool(table.get("confirm", False)))
            self.panel(CostPanel).confirm = self._confirm[1]
        return self._confirm[1]

    def launched_note(self, slaves: "SlaveControl", ids: list[str]) -> str:
        """In the launch worker: what `u` did, from the ledger ("u: launched i-0abc, g4dn.xlarge spot
        in us-east-1c at $0.2042/h")."""
        from gputui.model.units import per_hour

        ctx = slaves.ctx
        records = {r.instance_id: r for r in ctx.ledger.instances(ctx.provider.name, ctx.provider.region,
                                                                  cluster=ctx.cluster)}
        parts = []
        for instance_id in ids:
            r = records.get(instance_id)
            parts.append(instance_id if r is None else
                         f"{instance_id}, {r.instance_type} {r.lifecycle} in {r.zone} at {per_hour(r.hourly_price)}")
        return "u: launched " + ("; ".join(parts) if parts else "nothing")

    def action_toggle_theme(self) -> None:
        """L: the light theme for light terminals, and back."""
        self.theme = DARK_THEME if self.theme == LIGHT_THEME else LIGHT_THEME

    _program_shown = False  # a run of the user's own program is on screen (its keys show in the footer)

    def show_training(self) -> None:
        training = self.training
        self.panel(TrainingPanel).show(training, self.backend.profile.name)
        held = training.gpus if training.program is not None and training.active else ()
        hosts = self.panel(HostsView)
        if hosts.held != held:
            hosts.held = held
        program = training.program is not None
        if program != self._program_shown:
            self._program_shown = program
            self.refresh_bindings()
        self.show_cost()

    def show_cost(self) -> None:
        frame = None if self.cloud_disabled else self.cost_frame
        self.ui_confirm()  # the preview says whether u and d ask first
        self.panel(CostPanel).show(frame, self.training.eta_s, self.cost_note)

