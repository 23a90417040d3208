"""Keys t and r: the training run is `gputui run --json` in a child process, read by a worker."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from textual.message import Message

from gputui.dashboard.child import TrainingChild
from gputui.dashboard.training import TrainingState, event_line
from gputui.model.text import clean_tree
from gputui.runs import EVENTS, read_events
from gputui.ui.base import DashboardBase
from gputui.ui.messages import TrainingExited, TrainingLine, TrainingUpdate



def earlier_events(run_dir: str) -> list[dict[str, Any]]:
    """A resumed run's events before its latest start (its events.jsonl holds them all)."""
    events = clean_tree(read_events(Path(run_dir) / EVENTS))
    starts = [i for i, e in enumerate(events) if e.get("event") == "start"]
    return events[: starts[-1]] if starts else events


def post_events(events: Iterable[dict[str, Any]], post: Callable[[Message], Any], generation: int,
                state: TrainingState = TrainingState(status="starting")) -> TrainingState:
    """Fold each event (in the worker) and post the new state and, for the events worth one, a log line.
    A resumed run first takes in its earlier events, so its curves go on from where they were."""
    for event in events:
        if event.get("event") == "start" and event.get("resumed_from_step") is not None and event.get("run_dir"):
            state = TrainingState().replay(earlier_events(event["run_dir"]))
        state = state.fold(event)
        post(TrainingUpdate(state, generation))
        line = event_line(event)
        if line:
            severity = {"interrupted": "warning", "error": "error"}.get(str(event.get("event")), "information")
            post(TrainingLine(line, severity, generation))
    return state


class TrainingActions(DashboardBase):
    def action_toggle_training(self) -> None:
        if self.child is not None and self.training.active:
            if self.training.status != "stopping":
                self.child.stop_requested = True  # if the process is not started yet, the worker stops it
                self.child.stop()
                self.training = replace(self.training, status="stopping")
                self.say("stopping the run: it checkpoints and exits (r resumes it)")
                self.show_training()
            return
        self.start_training(resume=False)

    def action_resume(self) -> None:
        if self.child is not None and self.training.active:
            self.say("a run is already going: t stops it first", "warning", notify=True)
            return
        self.start_training(resume=True)

    def start_training(self, resume: bool) -> None:
        self.generation += 1
        child = self.backend.training_child(resume)
        self.child = child
        self.training = TrainingState(status="starting")
        self.run_facts = None
        self.say(("resuming the last run: " if resume else "starting a run: ") + "gputui " + " ".join(child.argv[3:]))
        self.show_training()
        if self.feed is not None:
            self.feed.training(True)
        generation = self.generation
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
        post_events(self._watched(child.events(), generation), self.post_message, generation)
        code = child.wait()
        self.post_message(TrainingExited(code, child.last_error() if code else None, generation))

    def _watched(self, events: Iterable[dict[str, Any]], generation: int) -> Iterator[dict[str, Any]]:
        """The child's events, folded on the way into the facts the alerts watch (stall, NaN loss)."""
        from gputui.alerts import RunFacts
        from gputui.dashboard.alerting import fold_run

        facts = RunFacts()
        for event in events:
            facts = fold_run(facts, event)
            if generation == self.generation:
                self.run_facts = facts
            yield event

    def on_training_update(self, message: TrainingUpdate) -> None:
        if message.generation != self.generation:
            return
        state = message.state
        if self.child is not None and self.child.stop_requested and state.status == "running":
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
        self.training = self.training.exited(message.code, message.error, stopped)
        if self.run_facts is not None:
            from gputui.dashboard.alerting import run_ended

            self.run_facts = run_ended(self.run_facts)
        if self.training.status == "failed" and not said:
            self.say(f"run failed (exit {message.code}): {self.training.error}", "error", notify=True)
        if self.feed is not None:
            self.feed.training(False)
        self.show_training()
