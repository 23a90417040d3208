"""Keys t, r and a: the training run the dashboard shows.

A run is followed from its events.jsonl, whoever started it. `t` starts `gputui run --json`
as a child of its own (gputui.dashboard.child: its own session, no pipe to the dashboard, so
it can outlive it), or attaches to a live run of the same profile instead of starting a
second one; `a` attaches to any live run on this machine (its run.pid's process is alive);
`r` resumes the run on screen (else the last one). Stopping is one SIGTERM either way: the
run checkpoints and exits.
"""

from __future__ import annotations

import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from textual.message import Message

from gputui import runs
from gputui.dashboard.child import TrainingChild
from gputui.dashboard.follow import Follower
from gputui.dashboard.training import TrainingState, event_line
from gputui.errors import GputuiError
from gputui.model.text import clean_tree
from gputui.paths import runs_home
from gputui.runs import EVENTS, read_events
from gputui.ui.base import DashboardBase
from gputui.ui.messages import TrainingExited, TrainingLine, TrainingUpdate


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
            if (earlier and event.get("event") == "start" and event.get("resumed_from_step") is not None
                    and event.get("run_dir")):
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
    attached: runs.RunDir | None = None  # the run followed without being this dashboard's child
    follower: Follower | None = None  # its follower (stopped when the dashboard looks elsewhere or quits)
    attach_stop_requested = False
    overlay_runs: Sequence[str] = ()  # run directories laid over the curves (the runs screen picks them)

    # -- keys ----------------------------------------------------------------------------------
    def action_toggle_training(self) -> None:
        if self.training.active and (self.child is not None or self.attached is not None):
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
        if self.training.active and (self.child is not None or self.attached is not None):
            self.say("a run is already going: t stops it first", "warning", notify=True)
            return
        self.start_training(resume=True)

    def action_attach(self) -> None:
        from gputui.ui.runs_screen import AttachScreen

        def chosen(path: str | None) -> None:
            if path:
                self.attach(runs.RunDir(Path(path)))

        self.push_screen(AttachScreen(runs_home()), chosen)

    def action_runs(self) -> None:
        from gputui.ui.runs_screen import RunsScreen

        self.push_screen(RunsScreen(runs_home(), self.overlay_runs))

    def set_overlay(self, paths: Sequence[str]) -> None:
        """The runs screen's choice of runs to lay over the curves (run directories, in the order picked)."""
        self.overlay_runs = list(paths)
        self.show_training()

    def resume_run(self, run: runs.RunDir) -> None:
        """Resume `run` (the runs screen's r)."""
        if self.training.active and (self.child is not None or self.attached is not None):
            self.say("a run is already going: t stops it first", "warning", notify=True)
            return
        self.start_training(resume=True, run=run)

    def stop_run(self) -> None:
        """SIGTERM to the run shown (started here or attached to): it checkpoints and exits."""
        if self.training.status == "stopping":
            return
        if self.child is not None:
            self.child.stop_requested = True  # if the process is not started yet, the worker stops it
            self.child.stop()
        elif self.attached is not None:
            known = runs.live_process(self.attached)
            if known is None:
                self.say(f"run {self.attached.run_id} is not running any more", "warning", notify=True)
                return
            try:
                os.kill(known.pid, signal.SIGTERM)
            except OSError as exc:
                self.say(f"cannot stop run {self.attached.run_id} (pid {known.pid}): {exc.strerror or exc}",
                         "error", notify=True)
                return
            self.attach_stop_requested = True
        self.training = replace(self.training, status="stopping")
        self.say("stopping the run: it checkpoints and exits (r resumes it)")
        self.show_training()

    # -- following a run -----------------------------------------------------------------------
    def _look_away(self) -> None:
        """Stop following the run shown (it goes on, if it was attached to)."""
        if self.follower is not None:
            self.follower.stop()
        self.follower = None
        self.attached = None
        self.attach_stop_requested = False

    def attach(self, run: runs.RunDir) -> None:
        """Follow `run` (live or not): its whole events file, then what it writes."""
        if self.child is not None and self.child.running and not self.child.detached:
            self.say("the run started here is going: t stops it first (or quit and keep it running)", "warning",
                     notify=True)
            return
        if self.attached is not None and self.attached.path == run.path and self.training.active:
            return  # already following it
        self._look_away()
        self.generation += 1
        self.child = None
        self.attached = run
        self.training = TrainingState(status="starting", run_dir=str(run.path), run_id=run.run_id, attached=True)
        self.run_facts = None
        self.say(f"attached to run {run.run_id} ({run.path})")
        self.show_training()
        follower = Follower(run.events, alive=lambda: runs.live_process(run) is not None)
        self.follower = follower
        generation = self.generation
        self.run_worker(lambda: self._follow(follower, generation), name="training-follow", group="training",
                        thread=True, exit_on_error=False)

    def _follow(self, follower: Follower, generation: int) -> None:
        """Worker: fold the followed run's events; say when it is gone."""
        post_events(self._watched(follower.batches(), generation), self.post_message, generation,
                    TrainingState(status="starting", attached=True), earlier=False)
        if not follower.stopped:
            self.post_message(RunGone(generation))

    def on_run_gone(self, message: RunGone) -> None:
        if message.generation != self.generation:
            return
        self.training = self.training.gone()
        if self.training.status == "stopped" and not self.training.run_id:
            self.training = replace(self.training, reason="it wrote no events")
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
            if resume and run is None:
                run = self._resume_target()
        except GputuiError as exc:
            self.say(str(exc), "warning", notify=True)
            return
        if run is None:
            run = runs.RunDir(runs_home() / runs.new_run_id())
        if resume and runs.live_process(run) is not None:
            self.say(f"run {run.run_id} is going already: attached to it", "warning", notify=True)
            self.attach(run)
            return
        self._look_away()
        self.generation += 1
        argv = with_run_dir(self.backend.training_argv(resume), run.path, resume)
        child = TrainingChild(argv, on_progress=self.backend.child_progress, clock=self.backend.stop_clock,
                              run_dir=run.path, profile=None if resume else self.backend.profile)
        self.before_resume = self.training if resume else None
        self.child = child
        self.training = TrainingState(status="starting")
        self.run_facts = None
        self.say(("resuming run: " if resume else "starting a run: ") + "gputui " + " ".join(argv[3:]))
        self.show_training()
        if self.feed is not None:
            self.feed.training(True)
        generation = self.generation
        self.run_worker(lambda: self._read_child(child, generation), name="training", group="training", thread=True,
                        exit_on_error=False)

    before_resume: TrainingState | None = None

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
        from gputui.alerts import RunFacts
        from gputui.dashboard.alerting import fold_run

        facts = RunFacts()
        for item in events:
            batch = item if isinstance(item, list) else [item]  # a batch: the events of one read
            facts = fold_run(facts, [one[0] if isinstance(one, tuple) else one for one in batch])
            if generation == self.generation:
                self.run_facts = facts
            yield item

    def on_training_update(self, message: TrainingUpdate) -> None:
        if message.generation != self.generation:
            return
        state = message.state
        stopping = (self.child is not None and self.child.stop_requested) or (
            self.attached is not None and self.attach_stop_requested)
        if stopping and state.status == "running":
            state = replace(state, status="stopping")
        self.training = state
        self.show_training()

    def on_training_line(self, message: TrainingLine) -> None:
        if message.generation == self.generation:
            self.say(message.text, message.severity, notify=message.severity == "error")

    def on_training_exited(self, message: TrainingExited) -> None:
        if message.generation != self.generation:
            return
        stopped = self.child is not None and self.child.stop_requested
        said = self.training.status == "failed"  # its `error` event is in the log already
        if message.code == 0 and self.training.status == "starting" and message.error:
            # A resume of a run that is complete: the run said so and did nothing; show how it ended.
            run_dir = self.child.run_dir if self.child is not None else None
            ended = TrainingState().replay(clean_tree(read_events(run_dir / EVENTS))) if run_dir is not None else None
            self.training = ended if ended is not None and ended.ended else (self.before_resume or TrainingState())
            self.say(message.error, "warning", notify=True)
        else:
            self.training = self.training.exited(message.code, message.error if message.code else None, stopped)
        if self.run_facts is not None:
            from gputui.dashboard.alerting import run_ended

            self.run_facts = run_ended(self.run_facts)
        if self.training.status == "failed" and not said:
            self.say(f"run failed (exit {message.code}): {self.training.error}", "error", notify=True)
        if self.feed is not None:
            self.feed.training(False)
        self.show_training()

    def on_unmount(self) -> None:
        """However the app ends (q, or a `gputui serve` tab closed: no question asked), nothing
        follows a run any more, so no worker outlives the app; a run started here that was neither
        stopped nor kept by an answer goes on by itself (its own session), as if kept."""
        child = self.child
        if child is not None and child.running and not child.detached and not child.stop_requested:
            child.detach()
        self.leave_runs()

    def leave_runs(self) -> None:
        """At quit: stop following (a run started here and kept goes on by itself)."""
        self._look_away()
        if self.child is not None and self.child.detached and self.child.follower is not None:
            self.child.follower.stop()
