"""What `gputui monitor` watches besides GPUs: a training run's events file (`--run`) and
the `[cloud]` cluster's spend in the cost ledger. Both only read; neither starts, stops nor
changes anything.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

from gputui.monitor.alerts import CloudFacts, RunFacts
from gputui.model.errors import UserError
from gputui.model.events import ENDS
from gputui.model.outside import number
from gputui.model.text import clean

# The trainer's error event for a diverged run: reason "nan", "... the loss is not finite at step N ...".
_NON_FINITE_REASONS = ("nan", "non_finite", "non-finite", "diverged")
_NON_FINITE_WORDS = ("not finite", "non-finite", "is nan", "is inf")


def find_run(ref: str, home: Path | None = None) -> Path:
    """The events file of `--run REF`: an events file, or a run as gputui.runs.store.find resolves it
    (`last`, a run id, a run directory); a directory whose first events are yet to come."""
    from gputui.runs import store as runs

    path = Path(ref).expanduser()
    if path.is_file() and path.name.endswith(".jsonl"):
        return path
    try:
        return runs.find(ref, home, flag="--run").events
    except UserError:
        if ref != "last" and path.is_dir():
            return path / runs.EVENTS
        raise


class RunWatch:
    """Follows one run's events.jsonl: each `poll()` reads the lines added since the last."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self.facts = RunFacts()

    def poll(self) -> RunFacts:
        """Fold the events written since the last poll: the run store's one streamed reader
        (bounded lines, read a chunk at a time; a line still being written waits for the next poll)."""
        from gputui.runs.store import EventLines, parse_event

        lines = EventLines(self.path, start=self._offset)
        try:
            for line in lines:
                event = parse_event(line)  # bytes decoded with errors="replace"; hostile lines refused
                if event is not None:
                    self.facts = fold(self.facts, event)
        except OSError:
            return self.facts
        self._offset = lines.offset
        return self.facts


def fold(facts: RunFacts, event: dict[str, Any]) -> RunFacts:
    """The run's facts after one of its events (text from the file is cleaned)."""
    from dataclasses import replace

    kind = event.get("event")
    when = number(event.get("time"))
    if kind == "start":
        run_id = clean(str(event.get("run_id") or ""), 80) or None
        same = run_id == facts.run_id and event.get("resumed_from_step") is not None
        base = facts if same else RunFacts()
        return replace(base, run_id=run_id, active=True, started=when, last_step=None if not same else facts.last_step,
                       non_finite=None)
    if kind == "step":
        loss, bad = _step_loss(event)
        step = event.get("step")
        return replace(facts, last_step=when if when is not None else time.time(),
                       step=step if isinstance(step, int) else facts.step,
                       loss=_or(loss, facts.loss),
                       samples_per_s=_or(number(event.get("samples_per_s")), facts.samples_per_s),
                       non_finite=bad or facts.non_finite)
    if kind in ("eval", "epoch"):
        return replace(facts, test_acc=_or(number(event.get("test_acc")), facts.test_acc))
    if kind == "metrics":  # a program's report: progress as a step is (the stall alert), and its numbers
        step = event.get("step")
        return replace(facts, last_step=when if when is not None else time.time(),
                       step=step if isinstance(step, int) and not isinstance(step, bool) else facts.step,
                       metrics=_metrics(facts.metrics, event))
    if kind in ENDS:
        reason = clean(str(event.get("reason") or ""), 40).lower()
        said = clean(str(event.get("message") or ""), 400).lower()
        bad = facts.non_finite
        if kind == "error" and (reason in _NON_FINITE_REASONS or any(words in said for words in _NON_FINITE_WORDS)):
            bad = bad or clean(str(event.get("message") or event.get("reason")), 200)
        return replace(facts, active=False, non_finite=bad)
    return facts


def fold_all(facts: RunFacts, events: list[dict[str, Any]]) -> RunFacts:
    """`fold` over many events (one read of a fast run's file): a stretch of step events is
    folded in one go, with one copy of the facts, to the same result as event by event."""
    from dataclasses import replace

    steps: list[dict[str, Any]] = []

    def flush(facts: RunFacts) -> RunFacts:
        if not steps:
            return facts
        last = steps[-1]
        when = number(last.get("time"))
        step, loss, rate, bad = facts.step, facts.loss, facts.samples_per_s, facts.non_finite
        for event in steps:
            step = event.get("step") if isinstance(event.get("step"), int) else step
            value, said = _step_loss(event)
            loss, bad = _or(value, loss), said or bad
            rate = _or(number(event.get("samples_per_s")), rate)
        steps.clear()
        return replace(facts, last_step=when if when is not None else time.time(), step=step, loss=loss,
                       samples_per_s=rate, non_finite=bad)

    for event in events:
        if event.get("event") == "step":
            steps.append(event)
            continue
        facts = fold(flush(facts), event)
    return flush(facts)


def _step_loss(event: dict[str, Any]) -> tuple[float | None, str | None]:
    """A step event's loss if it is a finite number, and what to say when it is NaN or infinite
    (as a number, or as text such as "nan")."""
    raw = event.get("loss")
    if isinstance(raw, float) and not math.isfinite(raw):  # NaN and the infinities: what the alert looks for
        return None, f"{raw} at step {event.get('step')}"
    loss = number(raw)
    if isinstance(raw, str) and raw.strip().lower() in ("nan", "inf", "-inf", "infinity", "-infinity"):
        return None, f"{clean(raw, 20)} at step {event.get('step')}"
    return loss, None


MAX_METRICS = 256  # names a watched program run keeps; a program naming a new one each step is cut here


def _metrics(kept: tuple[tuple[str, float], ...], event: dict[str, Any]) -> tuple[tuple[str, float], ...]:
    """A program run's latest value of each metric after one metrics event (rank 0's reports,
    or those without a rank: another rank's own numbers are not the run's)."""
    from gputui.model.events import metric_values

    if event.get("rank") not in (None, 0):
        return kept
    values = metric_values(event.get("values"))
    if not values:
        return kept
    latest = dict(kept)
    for name, value in values.items():
        if name in latest or len(latest) < MAX_METRICS:
            latest[name] = float(value)
    return tuple(latest.items())


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value



class CloudWatch:
    """The `[cloud]` cluster's spend, $/h and budget, read from the cost ledger (read-only:
    unlike the dashboard's slave control, it never trips the budget guard)."""

    def __init__(self, cluster: str, budget_usd: float, ledger_path: Path | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.cluster = cluster
        self.budget_usd = budget_usd
        self.ledger_path = ledger_path
        self.clock = clock

    def poll(self) -> CloudFacts:
        from gputui.cloud.ledger import Ledger
        from gputui.model.errors import GputuiError
        from gputui.cloud import costs

        now = self.clock()
        try:
            ledger = Ledger.existing(self.ledger_path)
        except GputuiError:
            ledger = None
        if ledger is None:
            return CloudFacts(self.cluster, self.budget_usd, 0.0, 0.0, 0.0)
        with ledger:
            records = ledger.instances(cluster=self.cluster)
            spent = sum(costs.instance_cost(r, now) for r in records)
            spent += sum(kwh * rate for _s, cluster, _r, _a, _b, kwh, rate in ledger.energy() if cluster == self.cluster)
        running = [r for r in records if r.running]
        committed = sum(costs.committed_cost(r, now, 60.0) for r in running)
        return CloudFacts(self.cluster, self.budget_usd, spent, committed, sum(r.hourly_price for r in running))


def cloud_watch(profile_path: Path | None, profile: Any) -> CloudWatch | None:
    """A CloudWatch for a profile with a `[cloud]` table (the cluster is named after the profile,
    as the dashboard names it), else None."""
    if profile is None or profile_path is None or "cloud" not in profile.tables:
        return None
    from gputui.cloud.settings import CLOUD_SECTION

    table = profile.tables["cloud"]
    budget = float(table.get("budget_usd", CLOUD_SECTION.fields["budget_usd"].default or 0.0))
    return CloudWatch(profile_path.stem, budget)
