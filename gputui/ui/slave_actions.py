"""Keys u, d, D, p, ? and q: slaves up and down in workers, the profile, help, and quitting."""

from __future__ import annotations

from pathlib import Path

from gputui.dashboard.setup import list_profiles, resolve_profile
from gputui.dashboard.cost import money
from gputui.errors import GputuiError
from gputui.ui.base import DashboardBase
from gputui.ui.messages import CloudNote, SlavesChanged
from gputui.ui.screens import ChoiceScreen, HelpScreen, ProfileScreen
from gputui.ui.status import StatusBar



class SlaveActions(DashboardBase):
    def _no_cloud(self) -> bool:
        if self.cloud_disabled:
            self.say(self.cloud_disabled, "warning", notify=True)
            return True
        return False

    def action_launch_slave(self) -> None:
        if self._no_cloud():
            return
        self.say("u: launching one more spot slave ...")
        self.run_worker(self._launch_one, name="slave-launch", group="slaves", thread=True, exit_on_error=False)

    def _launch_one(self) -> None:
        from gputui.dashboard.slaves import BudgetRefusal

        try:
            slaves = self.get_slaves()
            if slaves is None:
                return
            slaves.launch_one()
        except BudgetRefusal as exc:
            self.post_message(CloudNote(str(exc), "warning", notify=True))
        except GputuiError as exc:
            self.post_message(CloudNote(f"launch failed: {exc}", "error", notify=True))
        self.post_message(SlavesChanged())

    def action_terminate_selected(self) -> None:
        from gputui.ui.cost_panel import SlavesTable

        if self._no_cloud():
            return
        selected = self.panel(SlavesTable).selected
        if selected is None:
            self.say("no slave selected (click a row in the cost panel, or move there with Tab and the arrows)",
                     "warning", notify=True)
            return
        self.say(f"d: terminating {selected} ...")
        self.run_worker(lambda: self._terminate([selected]), name="slave-terminate", group="slaves", thread=True,
                        exit_on_error=False)

    def _terminate(self, ids: list[str] | None) -> None:
        """Worker: terminate `ids` (None: all of the cluster's slaves, once launches in flight are done)."""
        try:
            slaves = self.get_slaves()
            if slaves is not None:
                count = slaves.terminate_all() if ids is None else slaves.terminate(ids)
                self.post_message(CloudNote(f"{count} slave(s) terminated"))
        except GputuiError as exc:
            self.post_message(CloudNote(f"terminate failed: {exc}", "error", notify=True))
        self.post_message(SlavesChanged())

    def live_slaves_text(self) -> str:
        live = self.cost_frame.live if self.cost_frame is not None else ()
        rate = sum(s.usd_per_hour or 0.0 for s in live)
        return f"{len(live)} slave(s) running ({money(rate, 2)}/h)"

    def action_terminate_all(self) -> None:
        if self._no_cloud():
            return

        def chosen(choice: str | None) -> None:
            if choice == "terminate":
                self.say("D: terminating every slave ...")
                self.run_worker(lambda: self._terminate(None), name="slave-terminate-all", group="slaves",
                                thread=True, exit_on_error=False)

        self.push_screen(ChoiceScreen(f"Terminate all slaves of cluster {self.cost_frame.cluster if self.cost_frame else ''}? "
                                      f"{self.live_slaves_text()}",
                                      [("terminate", "Terminate all", "error"), ("cancel", "Cancel", "primary")]), chosen)

    def action_choose_profile(self) -> None:
        def chosen(path: Path | None) -> None:
            if path is None or path == self.backend.profile:
                return
            try:
                path = resolve_profile(path)
            except GputuiError as exc:
                self.say(f"profile not changed: {exc}", "error", notify=True)
                return
            self.backend = self.backend.with_profile(path)
            self.feed_stale = not self.backend.options.demo
            self.slaves_stale = True
            self.panel(StatusBar).profile = path.name
            self.say(f"profile {path.name}: the next run (t) trains with it" + ("" if self.backend.options.demo
                                                                                else "; hosts and cloud follow it"))
            self.show_training()
            if self.cloud_disabled is not None:
                self.cloud_disabled = None
                self.poll_cloud()

        self.push_screen(ProfileScreen(list_profiles(self.backend.profile), self.backend.profile), chosen)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        if self.quitting:
            return
        live = self.cost_frame.live if self.cost_frame is not None and not self.cloud_disabled else ()
        if not live:
            self.finish(None)
            return

        def chosen(choice: str | None) -> None:
            if choice == "terminate":
                self.say("terminating the slaves before quitting ...")
                self.quitting = True
                self.run_worker(self._terminate_then_finish, name="quit-terminate", group="slaves", thread=True,
                                exit_on_error=False)
            elif choice == "keep":
                self.finish(f"gputui: left running by your choice: {self.live_slaves_text()}; "
                            "stop them with `gputui cloud down --all`")

        self.push_screen(ChoiceScreen(f"{self.live_slaves_text()}. Terminate them before quitting?",
                                      [("terminate", "Terminate them", "error"), ("keep", "Keep them", "default"),
                                       ("cancel", "Cancel", "primary")]), chosen)

    def _terminate_then_finish(self) -> None:
        self._terminate(None)
        self.call_from_thread(self.finish, None)

    def _stop_run_then_exit(self, message: str | None) -> None:
        """Worker: SIGTERM the run, wait for its checkpoint (SIGKILL after the grace time), exit."""
        if self.child is not None:
            self.child.shutdown()
        self.call_from_thread(self.exit, None, 0, message)

    def finish(self, message: str | None) -> None:
        """Stop the run (checkpoint) if one is going, then exit."""
        self.quitting = True
        self.exit_message = message
        if self.child is not None and self.child.running:
            self.say("stopping the run (checkpoint) before quitting ...")
            self.run_worker(lambda: self._stop_run_then_exit(message), name="quit-training", group="training-stop",
                            thread=True, exit_on_error=False)
            return
        self.exit(None, 0, message)
