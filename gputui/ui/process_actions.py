"""Key P: the process table, and the signals it sends. The signal goes in a worker
(gputui.monitor.polling.kill: os.kill locally, `kill` over SSH remotely); its one line, a refusal
too, goes to the events log, never a traceback."""

from __future__ import annotations

from gputui.monitor.processes import ProcessRow
from gputui.ui.base import DashboardBase, while_shown
from gputui.ui.messages import EventLine, ProcessSignalled
from gputui.ui.processes_panel import ProcessScreen, describe


class ProcessActions(DashboardBase):
    def process_screen(self) -> ProcessScreen | None:
        """The process table, if open (under a dialog too)."""
        return next((s for s in self.screen_stack if isinstance(s, ProcessScreen)), None)

    def action_processes(self) -> None:
        from gputui.ui.hosts_panel import HostsView

        self.processes_open = True
        if self.feed is not None:
            self.feed.want_process_sm(True)  # the next poll asks NVML for each process's SM %

        def closed(_result: None) -> None:
            self.processes_open = False
            if self.feed is not None:
                self.feed.want_process_sm(False)

        self.push_screen(ProcessScreen(self.panel(HostsView).frame), closed)

    def signal_process(self, row: ProcessRow, name: str) -> None:
        """Send SIG`name` to `row`'s process, in a worker; the outcome is a line in the events."""
        self.say(f"sending SIG{name} to {describe(row)} ...")
        self.run_worker(lambda: self._signal(row, name), name="process-signal", group="processes", thread=True,
                        exit_on_error=False)

    def _signal(self, row: ProcessRow, name: str) -> None:
        from gputui.monitor.polling import kill

        feed = self.feed
        try:
            if feed is None:
                line, ok = "kill refused: no telemetry source yet", False
            else:
                result = kill(feed.source, row.host, row.pid, name, row.process)
                line, ok = result.line, result.ok
        except Exception as exc:  # noqa: BLE001 - whatever a source raises is a line, not a traceback
            line, ok = f"kill failed: pid {row.pid} on {row.host}: {exc or type(exc).__name__}", False
        self.post_message(ProcessSignalled(line, ok))

    @while_shown
    def on_process_signalled(self, message: ProcessSignalled) -> None:
        self.say(message.line, "information" if message.ok else "warning")
        screen = self.process_screen()
        if screen is not None:
            screen.result = message.line

    @while_shown
    def on_event_line(self, message: EventLine) -> None:
        self.say(message.text, message.severity, message.notify)
