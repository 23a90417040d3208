"""Keys u, d, D, p, ? and q: slaves up and down in workers, the profile, help, and quitting."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from textual.worker import get_current_worker

from gputui.model import units
from gputui.dashboard.setup import list_profiles, resolve_profile
from gputui.model.errors import GputuiError
from gputui.ui.base import DashboardBase
from gputui.ui.messages import CloudNote, SlavesChanged, StopRunsFirst
from gputui.ui.screens import ChoiceScreen, HelpScreen, ProfileScreen
from gputui.ui.status import StatusBar
from gputui.model.units import plural

# `d` on a slave a live run trains on stops the run first and waits this long for it to end (its
# stop grace, the checkpoint's pull, its slaves released) before the slave goes anyway
STOP_FIRST_S = 600.0


class SlaveActions(DashboardBase):
    def _no_cloud(self) -> bool:
        if self.cloud_disabled:
            self.say(self.cloud_disabled, "warning", notify=True)
            return True
        return False

    def action_launch_slave(self) -> None:
        from gputui.ui.cost_panel import launch_text

        if self._no_cloud():
            return
        if self.ui_confirm():  # [ui] confirm = true: ask first
            self.push_screen(ChoiceScreen(launch_text(self.cost_frame, verb="Launch") + "?",
                                          [("launch", "Launch", "warning"), ("cancel", "Cancel", "primary")]),
                             lambda choice: self._launch() if choice == "launch" else None)
            return
        self._launch()

    def _launch(self) -> None:
        self.say("u: launching one more spot slave ...")
        self.run_worker(self._launch_one, name="slave-launch", group="slaves", thread=True, exit_on_error=False)

    def _launch_one(self) -> None:
        from gputui.dashboard.slaves import BudgetRefusal

        try:
            slaves = self.get_slaves()
            if slaves is None:
                return
            ids = slaves.launch_one()
            self.post_message(CloudNote(self.launched_note(slaves, ids), notify=True))
        except BudgetRefusal as exc:
            self.post_message(CloudNote(str(exc), "warning", notify=True))
        except GputuiError as exc:
            self.post_message(CloudNote(f"launch failed: {exc}", "error", notify=True))
        self.post_message(SlavesChanged())

    def action_terminate_selected(self) -> None:
        from gputui.ui.cost_panel import SlavesTable, slave_text

        if self._no_cloud():
            return
        selected = self.panel(SlavesTable).selected
        if selected is None:
            self.say("no slave selected (click a row in the cost panel, or move there with Tab and the arrows)",
                     "warning", notify=True)
            return
        what = (slave_text(self.cost_frame, selected) if self.cost_frame is not None else None) or selected

        def terminate() -> None:
            self.say(f"d: terminating {what} ...")
            self.run_worker(lambda: self._terminate([selected], what), name="slave-terminate", group="slaves",
                            thread=True, exit_on_error=False)

        if self.ui_confirm():  # [ui] confirm = true: ask first
            self.push_screen(ChoiceScreen(f"Terminate {what}?", [("terminate", "Terminate", "error"),
                                                                ("cancel", "Cancel", "primary")]),
                             lambda choice: terminate() if choice == "terminate" else None)
            return
        terminate()

    def _terminate(self, ids: list[str] | None, what: str | None = None) -> None:
        """Worker: terminate `ids` (None: all of the cluster's slaves, once launches in flight are done)."""
        try:
            slaves = self.get_slaves()
            if slaves is not None:
                going = ids if ids is not None else [record.instance_id for record in slaves.guard.running()]
                if self._stop_runs_first(slaves, going, None if ids is None else what or ", ".join(ids)):
                    count = slaves.terminate_all() if ids is None else slaves.terminate(ids)
                    done = f"d: terminated {what}" if what and count else f"{plural(count, 'slave')} terminated"
                    self.post_message(CloudNote(done, notify=bool(what)))
        except GputuiError as exc:
            self.post_message(CloudNote(f"terminate failed: {exc}", "error", notify=True))
        self.post_message(SlavesChanged())

    def _stop_runs_first(self, slaves: Any, ids: list[str], what: str | None) -> bool:
        """Worker (d, D): the live runs training on these slaves (runs going on their cluster, by the
        ledger) stop first, each the way s stops it: it checkpoints, its nodes stop, its last
        checkpoint comes back and it releases its slaves. Waits for them to end (at most
        STOP_FIRST_S); False when the dashboard closed meanwhile (the slaves are left as they are).
        `what`: the slave `d` picked, None for every slave (D, quit's "terminate them")."""
        from gputui.model.paths import runs_home
        from gputui.runs import store as runs

        going = {run_id for instance_id in ids for run_id in slaves.ctx.ledger.runs_going_on(instance_id)}
        users = [run for run in runs.live_runs(runs_home()) if run.run_id in going] if going else []
        if not users:
            return True
        names = ", ".join(run.run_id for run in users)
        key, what, then = ("D", "every slave", "the slaves go") if what is None else ("d", what, "the slave goes")
        self.post_message(StopRunsFirst(tuple(users), f"{key}: {what} trains run {names}: the run stops first (it "
                                                      f"checkpoints and releases its slaves), then {then}"))
        deadline = time.monotonic() + STOP_FIRST_S
        worker = get_current_worker()
        while any(runs.live_process(run) is not None for run in users):
            if worker.is_cancelled:
                return False
            if time.monotonic() > deadline:
                self.post_message(CloudNote(f"{key}: run {names} had not ended {STOP_FIRST_S:.0f} s after its stop: "
                                            f"terminating {what} anyway", "warning", notify=True))
                break
            time.sleep(0.2)
        return True

    def live_slaves_text(self) -> str:
        live = self.cost_frame.live if self.cost_frame is not None else ()
        rate = sum(s.usd_per_hour or 0.0 for s in live)
        return f"{plural(len(live), 'slave')} running ({units.per_hour(rate)})"

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

        current = self.backend.profile

        def show(found: list[Path]) -> None:
            if not isinstance(self.screen, ProfileScreen):  # p pressed twice: one list
                self.push_screen(ProfileScreen(found, current), chosen)

        def listed() -> None:  # the current directory's TOML files are looked into: not on the UI thread
            found = list_profiles(current)
            self.call_from_thread(show, found)

        self.run_worker(listed, name="profiles-list", group="profiles", thread=True, exclusive=True,
                        exit_on_error=False)

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def action_quit(self) -> None:
        """q: with a run started here going, ask first: keep it running (headless), stop it with a
        checkpoint, or cancel; then, with slaves running, the slaves' question."""
        if self.quitting:
            return
        if self.session.asks_at_quit:
            run = self.training.run_id or "started here"
            where = f" (epoch {self.training.epoch}/{self.training.epochs or '?'})" if self.training.epoch else ""

            def run_chosen(choice: str | None) -> None:
                if choice in ("keep", "stop"):
                    self._quit_asking_slaves(keep_run=choice == "keep")

            self.push_screen(ChoiceScreen(f"The run {run} is going{where}. Quit and:",
                                          [("keep", "Keep it running", "success"),
                                           ("stop", "Stop it (checkpoint)", "error"),
                                           ("cancel", "Cancel", "primary")]), run_chosen)
            return
        self._quit_asking_slaves(keep_run=False)

    def _let_run_go(self, keep_run: bool) -> str | None:
        """At the last answer: let the run started here go on without the dashboard; what to say."""
        child = self.session.child
        if not keep_run or child is None or not self.session.detach():
            return None
        run = self.training.run_id or "started here"
        return (f"gputui: run {run} goes on without the dashboard (pid {child.pid}); `gputui` and a attach to it "
                f"again, `kill -TERM {child.pid}` stops it with a checkpoint")

    def _quit_asking_slaves(self, keep_run: bool) -> None:
        """The slaves' question (if any run), then quit, keeping the run started here if asked to."""
        live = self.cost_frame.live if self.cost_frame is not None and not self.cloud_disabled else ()
        if not live:
            self.finish(self._let_run_go(keep_run))
            return

        def chosen(choice: str | None) -> None:
            if choice == "terminate":
                self.say("terminating the slaves before quitting ...")
                self.quitting = True
                self.exit_message = self._let_run_go(keep_run)
                self.run_worker(self._terminate_then_finish, name="quit-terminate", group="slaves", thread=True,
                                exit_on_error=False)
            elif choice == "keep":
                said = self._let_run_go(keep_run)
                from gputui.cloud.leaks import down_command

                stop = down_command(self.slaves.ctx, self.slaves.ctx.cluster) if self.slaves is not None else "gputui cloud ls"
                kept = f"gputui: left running by your choice: {self.live_slaves_text()}; stop them with `{stop}`"
                self.finish(kept if said is None else f"{said}\n{kept}")

        self.push_screen(ChoiceScreen(f"{self.live_slaves_text()}. Terminate them before quitting?",
                                      [("terminate", "Terminate them", "error"), ("keep", "Keep them", "default"),
                                       ("cancel", "Cancel", "primary")]), chosen)

    def _terminate_then_finish(self) -> None:
        self._terminate(None)
        self.call_from_thread(self.finish, self.exit_message)

    def _stop_run_then_exit(self, message: str | None) -> None:
        """Worker: SIGTERM the run, wait for its checkpoint (SIGKILL after the grace time), exit."""
        if self.child is not None:
            self.child.shutdown()
        self.call_from_thread(self.exit, None, 0, message)

    def finish(self, message: str | None) -> None:
        """Stop the run started here (checkpoint) if one is going and was not kept running, then exit."""
        self.quitting = True
        self.exit_message = message
        self.session.leave()  # stop following: a run attached to, or kept running, goes on
        if self.session.stops_at_quit:
            self.say("stopping the run (checkpoint) before quitting ...")
            self.run_worker(lambda: self._stop_run_then_exit(message), name="quit-training", group="training-stop",
                            thread=True, exit_on_error=False)
            return
        self.exit(None, 0, message)
