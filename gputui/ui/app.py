"""The dashboard: live GPUs and hosts, the training run, cost and slaves, an events log.

Everything that blocks (NVML, SSH, the cloud, the training child) runs in named thread
workers that only post messages; polls never overlap: the next one is scheduled when the
previous one's message arrives. The widgets only draw the frozen frames they are given.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.containers import Grid
from textual.worker import Worker, WorkerState, get_current_worker

from gputui.dashboard.setup import Backend
from gputui.model.errors import GputuiError
from gputui.model.telemetry import HostState
from gputui.ui.base import while_shown
from gputui.ui.bindings import APP_LAB_ACTIONS, KEYS, PROGRAM_KEYS, bindings
from gputui.ui.cost_panel import CostPanel
from gputui.ui.curve_actions import CurveActions
from gputui.ui.events_panel import EventsLog
from gputui.ui.hosts_panel import HostsView
from gputui.ui.messages import (CloudEventPosted, CloudNote, CostPolled, EventLine, HostsPolled, RunStopping,
                                SlavesChanged)
from gputui.ui.process_actions import ProcessActions
from gputui.ui.slave_actions import SlaveActions
from gputui.ui.status import DashboardFooter, StatusBar
from gputui.ui.sweep_actions import SweepActions
from gputui.ui.training_actions import TrainingActions
from gputui.ui.training_panel import TrainingPanel
from gputui.ui.users_screen import LabActions, follow_round

ACTIONS = {key.action for key in KEYS} | APP_LAB_ACTIONS
PROGRAM_ACTIONS = {key.action for key in PROGRAM_KEYS}  # shown while a run of the user's own program is
FIRST_FRAME_ENV = "GPUTUI_FIRST_FRAME_FILE"  # benchmarks: the app writes time.time() here after its first frame


class DashboardApp(ProcessActions, TrainingActions, SlaveActions, CurveActions, SweepActions, LabActions):
    CSS_PATH = "dashboard.tcss"
    BINDINGS = bindings()
    TITLE = "gputui"
    ENABLE_COMMAND_PALETTE = False  # every action has its key, listed in the footer and on `?`

    # layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        yield StatusBar(self.clock, id="status")
        with Grid(id="panels"):
            yield HostsView(id="hosts", classes="panel")
            yield TrainingPanel(id="training", classes="panel")
            yield CostPanel(id="cost", classes="panel")
            yield EventsLog(id="events", classes="panel")
        yield DashboardFooter()

    def __init__(self, backend: Backend) -> None:
        super().__init__(backend)
        # A stopping run says what it waits for (its own `stopping` events, its processes left); the
        # app waits for it, at quit too: the run releases what it holds before the app exits.
        backend.child_progress = self._child_progress

    def get_driver_class(self) -> Any:
        """Textual's choice (a browser's driver under textual-serve, a test's headless one), but
        on a Linux terminal the driver whose input thread sleeps while no key comes."""
        chosen = super().get_driver_class()
        if (chosen.__module__, chosen.__name__) == ("textual.drivers.linux_driver", "LinuxDriver"):
            from gputui.ui.driver import QuietLinuxDriver

            return QuietLinuxDriver
        return chosen

    def _child_progress(self, child: Any, text: str, log: bool) -> None:
        """From the child's threads: post, never touch the widgets."""
        self.post_message(RunStopping(child, text, log))

    @while_shown
    def on_run_stopping(self, message: RunStopping) -> None:
        if message.child is not self.child:
            return
        if message.log:
            self.say(message.text, "warning")
        else:
            self.panel(StatusBar).stopping = message.text

    def on_mount(self) -> None:
        for panel, title in (("#hosts", "Hosts & GPUs"), ("#training", "Training"), ("#cost", "Cost & slaves"),
                             ("#events", "Events")):
            self.panel(panel).border_title = title
        status = self.panel(StatusBar)
        status.profile = self.backend.profile.name
        status.mode = "demo: simulated hosts, GPUs and cloud, real training" if self.backend.options.demo else ""
        self.show_training()
        self.log_event(f"dashboard on profile {self.backend.profile.name}" + (" (demo)" if self.backend.options.demo else ""))
        self.set_interval(1.0, status.tick, name="status-tick")
        self.poll_hosts()
        self.poll_cloud()
        if os.environ.get(FIRST_FRAME_ENV):
            self.call_after_refresh(self._first_frame)

    def on_unmount(self) -> None:
        """Close the telemetry feed at exit: its energy meter writes what it measured since its last flush."""
        feed, self.feed = self.feed, None
        if feed is not None:
            feed.close()
        alerts, self.alerts = self.alerts, None
        if alerts is not None:
            alerts.close()  # delivers what is queued (bounded)

    def _first_frame(self) -> None:
        Path(os.environ[FIRST_FRAME_ENV]).write_text(f"{time.time():.6f}\n", encoding="ascii")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """The dashboard's keys act on the main screen only, not under a dialog."""
        if action in ACTIONS and len(self.screen_stack) > 1:
            return False
        if action in PROGRAM_ACTIONS:  # hidden (footer, keys) unless a program's run is on the main screen
            return len(self.screen_stack) == 1 and self.training.program is not None
        return True

    # telemetry ---------------------------------------------------------------------
    def poll_hosts(self) -> None:
        self.start_poll("hosts", self._poll_hosts)

    def _poll_hosts(self) -> None:
        try:
            if self.feed is None or self.feed_stale:
                if self.feed is not None:
                    self.feed.close()
                self.feed_stale = False
                self.feed = self.backend.host_feed(lambda: self.cost_frame.slaves if self.cost_frame else ())
                self.feed.training(self.training.active)
                self.feed.want_process_sm(self.processes_open)
            frame = self.feed.poll()
        except GputuiError as exc:
            self.post_message(HostsPolled(None, f"telemetry: {exc}"))
            return
        alerts = self._alerts_round(frame.hosts)
        if not get_current_worker().is_cancelled:
            self.post_message(HostsPolled(frame, alerts=alerts))

    def _alerts_round(self, hosts: Any) -> list[Any]:
        """In the poll worker: the profile's [alerts] on this round (read again after a profile change)."""
        profile = self.backend.profile
        try:
            if self.alerts_profile != profile:
                from gputui.dashboard.alerting import load_alerts

                if self.alerts is not None:
                    self.alerts.close()
                self.alerts, self.alerts_profile = None, profile
                self.alerts = load_alerts(profile, self._alert_report)
            if self.alerts is None:
                return []
            cost = None if self.cloud_disabled else self.cost_frame
            return self.alerts.round(hosts, self.clock(), self.run_facts, cost)
        except GputuiError as exc:
            self.post_message(EventLine(f"alerts: {exc}", "error"))
            return []

    def _alert_report(self, line: str) -> None:
        """From the notifier's thread: a command or webhook that failed."""
        self.post_message(EventLine(line, "warning"))

    @while_shown
    def on_hosts_polled(self, message: HostsPolled) -> None:
        self.hosts_polls += 1
        self.panel(StatusBar).done_waiting("hosts")
        self.panel(StatusBar).refresh()  # the clock goes on with the same repaint as the hosts
        view = self.panel(HostsView)
        view.error = message.error
        if message.frame is not None:
            view.frame = message.frame
            for host in message.frame.hosts:
                before = self.host_states.get(host.name)
                if host.state != before and (before is not None or host.state is not HostState.OK):
                    reason = f": {host.message}" if host.message and host.state is not HostState.OK else ""
                    self.log_event(f"host {host.name} {host.state.value}{reason}",
                                   "information" if host.state.worked else "warning")
                self.host_states[host.name] = host.state
            screen = self.process_screen()
            if screen is not None:
                screen.frame = message.frame
            if len(self.screen_stack) > 1:
                follow_round(self, message.frame)  # the host and users screens (lab view)
        elif message.error:
            self.log_event(message.error, "error")
        for alert in message.alerts:
            self.log_event(f"ALERT {alert.state}: {alert.message}", "cleared" if alert.state == "cleared" else "alert")
        spent = message.frame.duration_s if message.frame is not None else 0.0
        self.set_timer(max(0.05, self.backend.options.host_interval_s - spent), self.poll_hosts, name="hosts-next")

    # cloud -------------------------------------------------------------------------
    @while_shown
    def on_cost_polled(self, message: CostPolled) -> None:
        self.cloud_polls += 1
        self._cloud_polling = False
        self.panel(StatusBar).done_waiting("cloud")
        self.cloud_disabled = message.disabled
        if message.frame is not None:
            self.cost_frame = message.frame
            self.cost_note = "" if message.frame.budget.level == "ok" else (
                "budget nearly spent" if message.frame.budget.level == "warn" else "budget reached: slaves stop")
        elif message.error:
            if message.error != self.cost_note:  # a lasting failure is logged once
                self.log_event(message.error, "error")
            self.cost_note = message.error
        else:
            self.cost_note = message.disabled or ""
        self.show_cost()
        if message.disabled is None:
            slaves = len(self.cost_frame.slaves) if self.cost_frame is not None else 1  # unknown: the provider's pace
            pace = self.backend.options.cloud_pace(slaves)
            if self._cloud_again:  # a launch or stop ended while this poll ran: it may not show it
                self._cloud_again, pace = False, 0.05
            self._cloud_timer = self.set_timer(pace, self.poll_cloud, name="cloud-next")

    @while_shown
    def on_cloud_note(self, message: CloudNote) -> None:
        self.say(message.text, message.severity, message.notify)

    @while_shown
    def on_cloud_event_posted(self, message: CloudEventPosted) -> None:
        kind = message.event.kind
        severity = "warning" if kind in ("interrupted", "vanished", "orphan", "budget_warning") else (
            "error" if kind in ("budget_stop", "error") else "information")
        self.log_event(message.event.message, severity)

    @while_shown
    def on_slaves_changed(self, _message: SlavesChanged) -> None:
        """Poll now rather than at the next tick (unless a poll runs: the next one follows it at once)."""
        if self.cloud_disabled is not None:
            return
        if self._cloud_polling:
            self._cloud_again = True
            return
        if self._cloud_timer is not None:
            self._cloud_timer.stop()
        self.poll_cloud()

    @while_shown
    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        """A worker that failed unexpectedly: say so, never exit."""
        if event.state is WorkerState.ERROR:
            error: Any = event.worker.error
            self.say(f"{event.worker.name} failed: {error}", "error", notify=True)
            if event.worker.name == "hosts-poll":
                self.set_timer(self.backend.options.host_interval_s, self.poll_hosts)
            elif event.worker.name == "cloud-poll":
                self._cloud_polling = False
                self._cloud_timer = self.set_timer(self.backend.options.cloud_interval, self.poll_cloud)


def create_app(backend: Backend) -> DashboardApp:
    """The app factory: `gputui` and the tests build the dashboard here."""
    return DashboardApp(backend)
