"""A training run as the dashboard sees it: `gputui run --json` events folded into one
frozen state (progress, rates, ETA, best accuracy, the loss and accuracy curves).

A run of the user's own program (its `start` has `program`) has no epochs to count nor
accuracy of gputui's: its state is the program's latest reported metrics (`metrics`, name to
value), its latest step and epoch, its clock and its steps/s, and its metrics' curves
(`metric_curves`).

The numbers are the events' own: the loss is the latest (a step's, or an epoch's mean
`train_loss` when that came later), samples/s is the latest step event's recent rate (the
trainer measures it over its own training clock), and the ETA is the remaining steps at that
rate. Nothing is derived from when an event arrived, so a replay at any pace ends the same.
Once the run has ended there is no ETA: `ended` and `outcome` say how it ended.
"""

from __future__ import annotations

import copy
import signal
from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping, Sequence

from gputui.runs.curves import Curves, MetricCurves, metric_order
from gputui.model.events import finite, typed  # a cluster run relays events from slaves: their numbers are checked there
from gputui.model.telemetry import fmt
from gputui.model.units import duration, plural_of

MAX_POINTS = 4000  # per curve; past this the older half is thinned to every other point
ACTIVE = ("starting", "running", "stopping")
ENDED = ("done", "interrupted")  # a run that said so; a later `error` (e.g. from a teardown) does not undo it
MIN_RATE_SPAN_S = 0.2  # of training time between two progress points, to measure a rate over
FINAL = ("done", "interrupted", "stopped", "failed")  # a run that is over, one way or another
MAX_SHOWN_METRICS = 64  # latest values kept for the panel (a program's names beyond these are left out)


def one_line(text: str) -> str:
    """The first non-empty line of a message (a traceback's last line says more, but an
    `error` event's message is one line already; this guards against the odd one that is not)."""
    for line in str(text).splitlines():
        if line.strip():
            return line.strip()
    return ""


def _capped(points: tuple[tuple[float, float], ...], point: tuple[float, float]) -> tuple[tuple[float, float], ...]:
    out = points + (point,)
    if len(out) > MAX_POINTS:
        half = len(out) // 2
        out = out[:half:2] + out[half:]
    return out


@dataclass(frozen=True)
class TrainingState:
    """Where the dashboard's run stands. None = not known yet (shown as "n/a")."""

    status: str = "idle"  # idle, starting, running, stopping, done, interrupted, stopped, failed
    run_id: str | None = None
    run_dir: str | None = None
    model: str | None = None
    device: str | None = None
    strategy: str | None = None
    world_size: int | None = None
    epochs: int | None = None
    batch_size: int | None = None
    steps_per_epoch: int | None = None
    total_steps: int | None = None
    resumed_from_step: int | None = None
    # A step and an epoch are finite numbers as the events carry them (whole in what gputui writes;
    # one from a foreign file may not be), like the steps of the points below.
    epoch: float | None = None
    step: float | None = None
    loss: float | None = None
    samples_per_s: float | None = None
    elapsed_s: float | None = None
    test_acc: float | None = None
    best_acc: float | None = None
    loss_points: tuple[tuple[float, float], ...] = ()  # (step, loss)
    acc_points: tuple[tuple[float, float], ...] = ()  # (step, test accuracy %)
    error: str | None = None  # the last error line of a failed run
    exit_code: int | None = None
    reason: str | None = None  # why an interrupted run stopped (SIGTERM, ...)
    mark: tuple[float, float] | None = None  # the last progress point (step, training clock) the rate is measured from
    attached: bool = False  # followed from its events file, not started by this dashboard
    curves: Curves = Curves()  # the curves panel's data (gputui.runs.curves), folded from the same events
    # A run of the user's own program (issue 31): its command, the GPUs it holds, its latest metrics.
    program: str | None = None
    gpus: tuple[int, ...] = ()
    metrics: tuple[tuple[str, float], ...] = ()  # the latest value of each metric, loss-like names first
    step_rate: float | None = None  # steps/s of a program's run, from its metrics events' steps and clock
    metric_curves: MetricCurves = MetricCurves()

    @property
    def active(self) -> bool:
        return self.status in ACTIVE

    @property
    def ended(self) -> bool:
        """Over: done, interrupted, stopped or failed (no ETA any more)."""
        return self.status in FINAL

    @property
    def steps_per_s(self) -> float | None:
        if self.program is not None:
            return self.step_rate
        if self.samples_per_s and self.batch_size:
            return self.samples_per_s / self.batch_size
        return None

    @property
    def eta_s(self) -> float | None:
        """Seconds of training left at the current rate (evaluation not counted)."""
        rate = self.steps_per_s
        if not self.active or rate is None or self.total_steps is None or self.step is None:
            return None
        return max(0.0, (self.total_steps - self.step) / rate)

    @property
    def fraction(self) -> float | None:
        if not self.total_steps or self.step is None:
            return None
        return min(1.0, self.step / self.total_steps)

    def fold(self, event: Mapping[str, Any]) -> "TrainingState":
        """This state after one event of `gputui run --json` (unknown events change nothing)."""
        if event.get("event") == "metrics":
            return self._metrics((event,))
        state = self._fold(event)
        curves = self.curves.fold(event)
        if curves is not state.curves:
            state = copy.copy(state) if state is self else state
            object.__setattr__(state, "curves", curves)
        if event.get("event") == "start":
            metric_curves = state.metric_curves.fold_all((event,))
            if metric_curves is not state.metric_curves:
                state = copy.copy(state) if state is self else state
                object.__setattr__(state, "metric_curves", metric_curves)
        return state

    def fold_all(self, events: Sequence[Mapping[str, Any]]) -> "TrainingState":
        """This state after many events (one read of a run's events file), the same as folding
        them one by one, but a stretch of step events (most of a fast run's file) costs one copy
        of the state and of its points, not one per event."""
        state = self
        start = 0
        for i, event in enumerate(events):
            if event.get("event") == "step":
                continue
            if i > start:
                state = state._steps(events[start:i])
            start = i + 1
            if event.get("event") == "metrics" and i > 0 and events[i - 1].get("event") == "metrics":
                continue  # taken with the stretch of metrics events it belongs to
            if event.get("event") == "metrics":
                end = i + 1
                while end < len(events) and events[end].get("event") == "metrics":
                    end += 1
                state = state._metrics(events[i:end])
                continue
            state = state.fold(event)
        if start < len(events):
            state = state._steps(events[start:])
        return state

    def _metrics(self, events: Sequence[Mapping[str, Any]]) -> "TrainingState":
        """`fold` over a stretch of metrics events (a program's reports): one copy of the state."""
        values = dict(self.metrics)
        step, epoch, elapsed, rate, mark = self.step, self.epoch, self.elapsed_s, self.step_rate, self.mark
        for raw in events:
            event = typed(raw)
            if event.get("rank"):  # another rank's report (all_ranks): its curve, not the panel's numbers
                continue
            for name, value in event.get("values", {}).items():
                if name in values or len(values) < MAX_SHOWN_METRICS:
                    values[name] = value
            at, clock = event.get("step"), event.get("elapsed_s")
            if at is not None:
                rate, mark = _rate(mark, 1, rate, at, clock, None)
                step = at
            epoch = _or(event.get("epoch"), epoch)
            elapsed = _or(clock, elapsed)
        state = replace(self, metrics=tuple((name, values[name]) for name in metric_order(values)), step=step,
                        epoch=epoch, elapsed_s=elapsed, step_rate=rate, mark=mark)
        object.__setattr__(state, "metric_curves", self.metric_curves.fold_all(events))
        return state

    def _steps(self, events: Sequence[Mapping[str, Any]]) -> "TrainingState":
        """`fold` over step events only."""
        epoch, step, loss, rate, mark, elapsed = self.epoch, self.step, self.loss, self.samples_per_s, self.mark, self.elapsed_s
        points = list(self.loss_points)
        moved = False
        for event in events:
            at = finite(event.get("step"))
            if at is None:
                continue
            moved = True
            value, clock = finite(event.get("loss")), finite(event.get("elapsed_s"))
            if value is not None:
                points.append((at, value))
                if len(points) > MAX_POINTS:
                    half = len(points) // 2
                    points = points[:half:2] + points[half:]
                loss = value
            rate, mark = _rate(mark, self.batch_size, rate, at, clock, finite(event.get("samples_per_s")))
            epoch, step = finite(event.get("epoch")), at
            elapsed = _or(clock, elapsed)
        curves = self.curves.fold_all(events)
        if not moved:  # no step to take in; the curves may still have points (on the time axis)
            state = copy.copy(self) if curves is not self.curves else self
            object.__setattr__(state, "curves", curves)
            return state
        state = replace(self, epoch=epoch, step=step, loss=loss, samples_per_s=rate, mark=mark, elapsed_s=elapsed,
                        loss_points=tuple(points))
        object.__setattr__(state, "curves", curves)
        return state

    def _fold(self, event: Mapping[str, Any]) -> "TrainingState":
        event = typed(event)
        kind = event.get("event")
        if kind == "start" and event.get("program") is not None:
            same_run = event.get("resumed") is True and event.get("run_id") == self.run_id
            gpus = event.get("gpus")
            return replace(
                self if same_run else TrainingState(),
                status="running", run_id=event.get("run_id"), run_dir=event.get("run_dir"),
                program=str(event["program"]), device=event.get("device"), strategy=event.get("strategy"),
                world_size=event.get("world_size"),
                gpus=tuple(g for g in gpus if isinstance(g, int) and not isinstance(g, bool)) if isinstance(gpus, list) else (),
                error=None, exit_code=None, reason=None, mark=None, step_rate=None, attached=self.attached)
        if kind == "start":
            resumed = event.get("resumed_from_step")
            same_run = resumed is not None and event.get("run_id") == self.run_id
            return replace(
                self if same_run else TrainingState(),
                status="running", run_id=event.get("run_id"), run_dir=event.get("run_dir"),
                model=event.get("model"), device=event.get("device"), strategy=event.get("strategy"),
                world_size=event.get("world_size"), epochs=event.get("epochs"), batch_size=event.get("batch_size"),
                steps_per_epoch=event.get("steps_per_epoch"), total_steps=event.get("total_steps"),
                resumed_from_step=resumed, step=resumed or 0, error=None, exit_code=None, reason=None, mark=None,
                samples_per_s=None,
                attached=self.attached,
                epoch=self.epoch if same_run else 1,
            )
        if kind == "step":
            if event.get("step") is None:
                return self
            loss = event.get("loss")
            points = self.loss_points if loss is None or event.get("step") is None else _capped(self.loss_points, (event["step"], loss))
            rate, mark = _rate(self.mark, self.batch_size, self.samples_per_s, event["step"], event.get("elapsed_s"),
                               event.get("samples_per_s"))
            return replace(self, epoch=event.get("epoch"), step=event.get("step"), loss=_or(loss, self.loss),
                           samples_per_s=rate, mark=mark, elapsed_s=_or(event.get("elapsed_s"), self.elapsed_s),
                           loss_points=points)
        if kind in ("eval", "epoch"):
            acc = event.get("test_acc")
            best = self.best_acc if acc is None else max(acc, self.best_acc or acc)
            points = self.acc_points if acc is None or event.get("step") is None else _capped(self.acc_points, (event["step"], acc))
            train_loss = event.get("train_loss") if kind == "epoch" else None
            rate, mark = self.samples_per_s, self.mark
            if event.get("step") is not None:
                rate, mark = _rate(self.mark, self.batch_size, self.samples_per_s, event["step"], event.get("elapsed_s"),
                                   None)
            return replace(self, epoch=_or(event.get("epoch"), self.epoch), step=_or(event.get("step"), self.step),
                           test_acc=_or(acc, self.test_acc), best_acc=best, samples_per_s=rate, mark=mark,
                           loss=_or(train_loss, self.loss),  # the epoch's mean is later than its last step's
                           elapsed_s=_or(event.get("elapsed_s"), self.elapsed_s), acc_points=points)
        if kind == "interrupted":
            reason = event.get("reason")
            return replace(self, status="interrupted", step=_or(event.get("step"), self.step),
                           epoch=_or(event.get("epoch"), self.epoch), elapsed_s=_or(event.get("elapsed_s"), self.elapsed_s),
                           reason=str(reason) if reason else None)
        if kind == "done" and self.program is not None:
            return replace(self, status="done", step=_or(event.get("step"), self.step),
                           elapsed_s=_or(event.get("elapsed_s"), self.elapsed_s), exit_code=event.get("exit_code"))
        if kind == "done":
            acc = event.get("test_acc")
            return replace(self, status="done", step=_or(event.get("step"), self.step),
                           epoch=_or(event.get("epochs"), self.epochs, self.epoch),
                           best_acc=_or(event.get("best_acc"), self.best_acc), test_acc=_or(acc, self.test_acc),
                           elapsed_s=_or(event.get("elapsed_s"), self.elapsed_s))
        if kind == "error" and self.status not in ENDED:
            message = event.get("message")
            code = event.get("exit_code")
            return replace(self, status="failed", error=one_line(message or "") or "the run failed",
                           step=_or(event.get("step"), self.step), epoch=_or(event.get("epoch"), self.epoch),
                           exit_code=code if isinstance(code, int) else self.exit_code)
        return self

    def replay(self, events: Iterable[Mapping[str, Any]]) -> "TrainingState":
        """Fold many events (a run directory's events.jsonl)."""
        return self.fold_all(list(events))

    def exited(self, code: int, error: str | None, stop_requested: bool = False) -> "TrainingState":
        """The child process ended: a run that had not said done or interrupted failed.

        Stopped (SIGTERM) before the trainer caught signals, a run ends with -15 and no
        checkpoint: that is "stopped", not a failure.
        """
        if self.status in ENDED and code == 0:
            return replace(self, exit_code=code)
        if self.status == "failed" and self.error:  # the run's `error` event said why, better than stderr's last line
            return replace(self, exit_code=code)
        if stop_requested and code in (0, -signal.SIGTERM):
            return replace(self, status="interrupted" if code == 0 else "stopped", exit_code=code)
        return replace(self, status="failed", exit_code=code, error=one_line(error or "") or f"exited with code {code}")

    def gone(self) -> "TrainingState":
        """A followed run whose process ended without a last word (killed): stopped, resumable
        from its last checkpoint. A run that said how it ended keeps that."""
        if self.ended:
            return self
        return replace(self, status="stopped", reason=self.reason or "its process ended without a last event")


def _rate(mark: tuple[float, float] | None, batch_size: int | None, current: float | None, step: float,
          elapsed: float | None, said: float | None) -> tuple[float | None, tuple[float, float] | None]:
    """The recent samples/s at a progress point (step, training clock) and the new mark: the
    samples since the previous point (`mark`) over the training time since, from the events' own
    clock; the event's own rate (`said`) where there is no earlier point (the first step of a
    start). `current` is the rate shown so far."""
    if elapsed is None:
        return _or(said, current), mark
    if mark is not None and batch_size:
        steps, seconds = step - mark[0], elapsed - mark[1]
        if steps > 0 and seconds >= MIN_RATE_SPAN_S:
            return steps * batch_size / seconds, (step, elapsed)
        if steps >= 0 and seconds >= 0:  # too close to the last point to measure: keep both
            return _or(said, current), mark
    return _or(said, current), (step, elapsed)


def _or(*values: Any) -> Any:
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)


LOGGED = ("start", "epoch", "interrupted", "done", "error", "warning")  # the events with a line in the log


def event_line(event: Mapping[str, Any]) -> str | None:
    """A line for the events log, for the events worth one (not every step)."""
    kind = event.get("event")
    if kind not in LOGGED:
        return None
    event = typed(event)
    if kind == "warning":  # a program's garbage in GPUTUI_EVENTS, said once (the trainer's warnings are not logged)
        return f"run warning: {event.get('message')}" if event.get("reason") == "bad_report" else None
    if kind == "start" and event.get("program") is not None:
        how = "resumed" if event.get("resumed") is True else "started"
        gpus = event.get("gpus")
        held = f", GPU {','.join(str(g) for g in gpus)}" if isinstance(gpus, list) and gpus else ""
        return (f"run {event.get('run_id')} {how}: {event.get('program')} on {event.get('device')} "
                f"({event.get('strategy')}{held})")
    if kind == "done" and "test_acc" not in event and "exit_code" in event:  # a program's end
        return f"run done: the program exited 0 after {duration(event.get('elapsed_s'))}"
    if kind == "start":
        resumed = event.get("resumed_from_step")
        how = f"resumed at step {resumed}" if resumed is not None else "started"
        return (f"run {event.get('run_id')} {how}: {event.get('model')} on {event.get('device')} "
                f"({event.get('strategy')}), {plural_of(event.get('epochs'), 'epoch')}, {plural_of(event.get('total_steps'), 'step')}")
    if kind == "epoch":
        return (f"epoch {event.get('epoch')}: test acc {fmt(event.get('test_acc'), '%', 2)}, "
                f"test loss {fmt(event.get('test_loss'), '', 4)}; checkpoint saved")
    if kind == "interrupted":
        where = f" at step {event['step']}" if event.get("step") is not None else ""
        saved = f"; checkpoint {event['checkpoint']}" if event.get("checkpoint") else "; no checkpoint"
        return f"run interrupted ({event.get('reason') or 'stopped'}){where}{saved}"
    if kind == "done":
        return f"run done: test acc {fmt(event.get('test_acc'), '%', 2)}, best {fmt(event.get('best_acc'), '%', 2)}"
    if kind == "error":
        return f"run failed: {event.get('message')}"
    return None
