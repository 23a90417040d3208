"""Keys t, r and a: the training run the dashboard shows.

A run is followed from its events.jsonl, whoever started it. `t` starts `gputui run --json`
as a child of its own (gputui.dashboard.child: its own session, no pipe to the dashboard, so
it can outlive it), or attaches to a live run of the same profile instead of starting a
second one; `a` attaches to any live run on this machine (its run.pid's process is alive);
`r` resumes the run on screen (else the last one). Stopping is one SIGTERM either way: the
run checkpoints and exits. Who holds the run, and which of these keys may act now, is the run
session's (gputui.dashboard.session); the handlers here ask it, then draw and start workers.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from textual.message import Message

from gputui.runs import store as runs
from gputui.dashboard.child import TrainingChild
from gputui.runs.follow import Follower
from gputui.dashboard.session import Refused
from gputui.dashboard.training import TrainingState, event_line
from gputui.model.errors import GputuiError
from gputui.model.text import clean_tree
from gputui.model.paths import runs_home
from gputui.runs.store import EVENTS, read_events
from gputui.ui.base import DashboardBase, while_shown
from gputui.ui.messages import StopRunsFirst, TrainingExited, TrainingLine, TrainingUpdate


class RunGone(Message):
    """A run the dashboard attached to has ended (its process is gone and its events are read)."""

    def __init__(self, generation: int) -> None:
        super().__init__()
        self.generation = generation


def earlier_events(run_dir: str) -> list[dict[str, Any]]:
    """A resumed run's events before its latest start (its events.jsonl holds them all)."""
    events = clean_tree(read_events(Path(run_dir) / EVENTS))
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return events[: starts[-1]] if starts else events


LINES_PER_BATCH = 20  # events-log lines posted for one batch; past it one "… N more events" line


def post_events(events: Iterable[Any], post: Callable[[Message], Any],
                generation: int, state: TrainingState = TrainingState(status="starting"),
                earlier: bool = True) -> TrainingState:
    """Fold the events (in the worker) and post the new state and, for the events worth one, a log line.

    An item is an event, an (event, history) pair (a followed file: history is what it held
    before the dashboard came, but its last event; it is folded, not posted nor logged event by
    event), or a batch: a list of those (one read of a run's events file). A batch is folded
    whole and posts ONE TrainingUpdate (then its log lines, in order, at most LINES_PER_BATCH),
    so a run writing 1,000 events/s wakes the app a few times a second, not 1,000 times. A
    resumed run first takes in its earlier events (`earlier`; not needed when the whole file is
    followed), so its curves go on from where they were."""
    for item in events:
        batch = [one if isinstance(one, tuple) else (one, False) for one in (item if isinstance(item, list) else [item])]
        todo: list[Any] = []
        for event, _history in batch:
            if (earlier and event.get("event") == "start" and event.get("run_dir")
                    and (event.get("resumed_from_step") is not None or event.get("resumed") is True)):
                state = replace(TrainingState(), attached=state.attached).replay(earlier_events(event["run_dir"]))
                todo = []  # what came before the resume is in what was replayed
            todo.append(event)
        state = state.fold_all(todo)
        drawn = False
        lines: list[tuple[str, str]] = []
        for event, history in batch:
            if history:  # what a followed file held before: folded, not drawn event by event
                continue
            drawn = True
            line = event_line(event)
            if line:
                lines.append((line, {"interrupted": "warning", "error": "error"}.get(str(event.get("event")),
                                                                                      "information")))
        if not drawn:
            continue
        post(TrainingUpdate(state, generation))
        if len(lines) > LINES_PER_BATCH:
            more = len(lines) - (LINES_PER_BATCH - 1)
            kept = lines[: LINES_PER_BATCH - 1]
            worst = next((sev for sev in ("error", "warning") if any(s == sev for _, s in lines[len(kept):])),
                         "information")
            lines = kept + [(f"… {more} more events", worst)]
        for text, severity in lines:
            post(TrainingLine(text, severity, generation))
    return state


def with_run_dir(argv: Sequence[str], run_dir: Path, resume: bool) -> list[str]:
    """The child's command line naming its run directory: `--resume DIR` in place of
    `--resume last`, or `--run-dir DIR` for a new run."""
    out = list(argv)
    if resume:
        for i, arg in enumerate(out[:-1]):
            if arg == "--resume":
                out[i + 1] = str(run_dir)
                return out
        return out
    return out + ["--run-dir", str(run_dir)]


def live_run_of(profile: Path, home: Path | None = None) -> runs.RunDir | None:
    """The newest live run on this machine started from `profile` (run.pid names it)."""
    want = str(profile.expanduser().resolve())
    for run in runs.live_runs(runs_home() if home is None else home):
        known = runs.live_process(run)
        if known is not None and known.profile == want:
            return run
    return None


class TrainingActions(DashboardBase):
    """The keys ask the run session (gputui.dashboard.session) for a move; this draws and posts."""

    overlay_runs: Sequence[str] = ()  # run directories laid over the curves (the runs screen picks them)

    def say_refused(self, refusal: Refused) -> None:
        """A key the session refused: say why (some refusals have nothing to say)."""
        if refusal.reason:
            self.say(refusal.reason, refusal.severity, notify=True)

    # -- keys ----------------------------------------------------------------------------------
    def action_toggle_training(self) -> None:
        if self.session.busy:
            self.stop_run()
            return
        live = live_run_of(self.backend.profile)
        if live is not None:
            self.say(f"a run of {self.backend.profile.name} is already going ({live.run_id}): attached to it "
                     "(t stops it)", "warning", notify=True)
            self.attach(live)
            return
        self.start_training(resume=False)

    def action_resume(self) -> None:
        self.start_training(resume=True)

    def action_attach(self) -> None:
        from gputui.ui.runs_screen import AttachScreen

        def chosen(path: str | None) -> None:
            if path:
                self.attach(runs.RunDir(Path(path)))

        self.push_screen(AttachScreen(runs_home()), chosen)

    def action_output(self) -> None:
        """o: the program's last lines (a run of the user's own program on screen)."""
        from gputui.ui.output_screen import OutputScreen

        shown = self.training
        if shown.program is None or not shown.run_dir:
            self.say("no run of your own program on screen: o shows its output", "warning", notify=True)
            return
        self.push_screen(OutputScreen(shown.run_dir, shown.run_id))

    def action_runs(self) -> None:
        from gputui.ui.runs_screen import RunsScreen

        self.push_screen(RunsScreen(runs_home(), self.overlay_runs))

    def set_overlay(self, paths: Sequence[str]) -> None:
        """The runs screen's choice of runs to lay over the curves (run directories, in the order picked)."""
        self.overlay_runs = list(paths)
        self.show_training()

    def resume_run(self, run: runs.RunDir) -> None:
        """Resume `run` (the runs screen's r)."""
        self.start_training(resume=True, run=run)

    def stop_run(self) -> None:
        """SIGTERM to the run shown (started here or attached to): it checkpoints and exits."""
        try:
            self.session.stop()
        except Refused as refusal:
            self.say_refused(refusal)
            return
        self.say("stopping the run: it checkpoints and exits (r resumes it)")
        self.show_training()

    @while_shown
    def on_stop_runs_first(self, message: StopRunsFirst) -> None:
        self.say(message.text, "warning", notify=True)
        for run in message.runs:
            if self.session.busy and self.training.run_dir and Path(self.training.run_dir) == run.path:
                self.stop_run()  # the run on screen: stopped as s stops it (one SIGTERM, shown as stopping)
                continue
            known = runs.live_process(run)
            if known is not None:
                try:
                    os.kill(known.pid, signal.SIGTERM)  # the run's own stop: it checkpoints and exits
                except OSError as exc:
                    self.say(f"cannot stop run {run.run_id} (pid {known.pid}): {exc.strerror or exc}", "error")

    # -- following a run -----------------------------------------------------------------------
    def attach(self, run: runs.RunDir) -> None:
        """Follow `run` (live or not): its whole events file, then what it writes."""
        try:
            follower = self.session.attach(run)
        except Refused as refusal:
            self.say_refused(refusal)
            return
        self.run_facts = None
        self.say(f"attached to run {run.run_id} ({run.path})")
        self.show_training()
        generation = self.generation
        self.run_worker(lambda: self._follow(follower, generation), name="training-follow", group="training",
                        thread=True, exit_on_error=False)

    def _follow(self, follower: Follower, generation: int) -> None:
        """Worker: fold the followed run's events; say when it is gone."""
        post_events(self._watched(follower.batches(), generation), self.post_message, generation,
                    TrainingState(status="starting", attached=True), earlier=False)
        if not follower.stopped:
            self.post_message(RunGone(generation))

    @while_shown
    def on_run_gone(self, message: RunGone) -> None:
        if self.session.gone(message.generation):
            self.show_training()

    # -- a run started here ----------------------------------------------------------------------
    def _resume_target(self) -> runs.RunDir:
        """The run on screen if it has a directory, else the last run (UserError when there is none)."""
        shown = self.training.run_dir
        if shown and (Path(shown) / runs.PROFILE).is_file():
            return runs.RunDir(Path(shown))
        return runs.find("last")

    def start_training(self, resume: bool, run: runs.RunDir | None = None) -> None:
        try:
            self.session.check_start()
            if resume and run is None:
                run = self._resume_target()
        except Refused as refusal:
            self.say_refused(refusal)
            return
        except GputuiError as exc:
            self.say(str(exc), "warning", notify=True)
            return
        if run is None:
            run = runs.RunDir(runs_home() / runs.new_run_id())
        if resume and runs.live_process(run) is not None:
            self.say(f"run {run.run_id} is going already: attached to it", "warning", notify=True)
            self.attach(run)
            return
        argv = with_run_dir(self.backend.training_argv(resume), run.path, resume)
        child = TrainingChild(argv, on_progress=self.backend.child_progress, clock=self.backend.stop_clock,
                              run_dir=run.path, profile=None if resume else self.backend.profile)
        generation = self.session.start(child, resume)
        self.run_facts = None
        self.say(("resuming run: " if resume else "starting a run: ") + "gputui " + " ".join(argv[3:]))
        self.show_training()
        if self.feed is not None:
            self.feed.training(True)
        self.run_worker(lambda: self._read_child(child, generation), name="training", group="training", thread=True,
                        exit_on_error=False)

    def _read_child(self, child: TrainingChild, generation: int) -> None:
        """Worker: start the child, post its progress, then its exit code and last error line."""
        try:
            child.start()
        except OSError as exc:
            self.post_message(TrainingExited(127, f"cannot start gputui run: {exc}", generation))
            return
        if child.stop_requested:
            child.stop()
        post_events(self._watched(child.batches(), generation), self.post_message, generation)
        if child.detached:
            return  # the dashboard let it go on (quit: keep it running)
        code = child.wait()
        self.post_message(TrainingExited(code, child.last_error(), generation))

    def _watched(self, events: Iterable[Any], generation: int) -> Iterator[Any]:
        """The run's events, folded on the way into the facts the alerts watch (stall, NaN loss)."""
        from gputui.monitor.alerts import RunFacts
        from gputui.dashboard.alerting import fold_run

        facts = RunFacts()
        for item in events:
            batch = item if isinstance(item, list) else [item]  # a batch: the events of one read
            facts = fold_run(facts, [one[0] if isinstance(one, tuple) else one for one in batch])
            if generation == self.generation:
                self.run_facts = facts
            yield item

    @while_shown
    def on_training_update(self, message: TrainingUpdate) -> None:
        if self.session.update(message.generation, message.state):
            self.show_training()

    @while_shown
    def on_training_line(self, message: TrainingLine) -> None:
        if message.generation == self.generation:
            self.say(message.text, message.severity, notify=message.severity == "error")

    @while_shown
    def on_training_exited(self, message: TrainingExited) -> None:
        notes = self.session.exited(message.generation, message.code, message.error)
        if notes is None:
            return
        for text, severity in notes:
            self.say(text, severity, notify=True)
        if self.run_facts is not None:
            from gputui.dashboard.alerting import run_ended

            self.run_facts = run_ended(self.run_facts)
        if self.feed is not None:
            self.feed.training(False)
        self.show_training()

    def on_unmount(self) -> None:
        """However the app ends (q, or a `gputui serve` tab closed: no question asked), nothing
        follows a run any more, so no worker outlives the app; a run started here that was neither
        stopped nor kept by an answer goes on by itself (its own session), as if kept."""
        if self.session.asks_at_quit:
            self.session.detach()
        self.session.leave()  # stop following (a run started here and kept goes on by itself)
