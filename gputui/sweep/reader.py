"""The one reader of a sweep's study: a frozen snapshot of its trials, its best and its progress,
read through the study's one storage (gputui.sweep.study.storage, with its 60 s busy timeout).
`gputui sweep show` (text and `--json`) and the dashboard's sweep screen both show this snapshot,
so a trial's state reads the same in both.

State names are Optuna's, lower case, as `sweep show --json` has always printed them (scripts rely
on them): running, waiting, complete, pruned, fail; and `requeued` for the record of a trial a
stopped master left running and asked again under a new number (not counted).

What a trial is running on: the scheduler records the slot in the trial's `slot` user attribute
(when the trial starts, and again when it ends).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gputui.model.errors import GputuiError, UserError
from gputui.model.outside import number

STATES = ("running", "waiting", "complete", "pruned", "fail", "requeued")
FINISHED = ("complete", "pruned", "fail")  # counted toward `trials` (a requeued record is not)


@dataclass(frozen=True)
class TrialRow:
    """One trial as both views show it."""

    number: int
    state: str  # one of STATES
    value: float | None  # the objective's value where Optuna has one (a pruned trial keeps its last)
    params: tuple[tuple[str, Any], ...]  # in the order the study asked for them
    slot: str | None
    started: float | None  # Unix seconds
    ended: float | None
    evaluations: int
    attempts: int | None
    error: str | None
    requeued_from: int | None  # the number of the trial this one asks again

    @property
    def seconds(self) -> float | None:
        return self.ended - self.started if self.started is not None and self.ended is not None else None


@dataclass(frozen=True)
class SweepData:
    """One sweep's study at one moment."""

    name: str
    storage: str
    direction: str  # maximize or minimize
    objective: str  # "max test_accuracy", "min time_to_accuracy"
    trials_wanted: int | None
    rows: tuple[TrialRow, ...]  # by trial number
    best: tuple[tuple[float, float], ...]  # (seconds since the first trial started, best value so far)
    best_trial: int | None
    started: float | None

    @property
    def metric(self) -> str:
        return self.objective.split()[1] if " " in self.objective else self.objective

    def count(self, state: str) -> int:
        return sum(1 for r in self.rows if r.state == state)

    @property
    def done(self) -> int:
        """The trials that count toward `trials`: finished, and not requeued records."""
        return sum(1 for r in self.rows if r.state in FINISHED)

    @property
    def running(self) -> tuple[TrialRow, ...]:
        """The running trials, by slot (a trial whose slot is not known yet last)."""
        return tuple(sorted((r for r in self.rows if r.state == "running"), key=lambda r: (r.slot is None,
                                                                                            r.slot or "", r.number)))

    @property
    def best_row(self) -> TrialRow | None:
        return next((r for r in self.rows if r.number == self.best_trial), None)


def state_name(trial: Any) -> str:
    """A trial's state as both views name it (see STATES)."""
    from gputui.sweep.study import REQUEUED

    if trial.user_attrs.get(REQUEUED):
        return "requeued"
    return str(trial.state.name).lower()


def _ts(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def row_of(trial: Any) -> TrialRow:
    from gputui.sweep.study import REQUEUED_FROM

    attrs = trial.user_attrs
    slot, error = attrs.get("slot"), attrs.get("error")
    return TrialRow(number=trial.number, state=state_name(trial), value=number(trial.value),
                    params=tuple(trial.params.items()), slot=str(slot) if slot is not None else None,
                    started=_ts(trial.datetime_start), ended=_ts(trial.datetime_complete),
                    evaluations=len(trial.intermediate_values), attempts=_int(attrs.get("attempts")),
                    error=str(error) if error is not None else None, requeued_from=_int(attrs.get(REQUEUED_FROM)))


def best_so_far(rows: tuple[TrialRow, ...], direction: str) -> tuple[tuple[tuple[float, float], ...], int | None]:
    """The best value against the time each complete trial ended (seconds since the first start)."""
    starts = [r.started for r in rows if r.started is not None]
    if not starts:
        return (), None
    t0 = min(starts)
    done = sorted((r for r in rows if r.state == "complete" and r.value is not None and r.ended is not None),
                  key=lambda r: (r.ended, r.number))
    points: list[tuple[float, float]] = []
    best: float | None = None
    best_trial = None
    for r in done:
        assert r.value is not None and r.ended is not None
        if best is None or (r.value > best if direction == "maximize" else r.value < best):
            best, best_trial = r.value, r.number
        points.append((r.ended - t0, best))
    return tuple(points), best_trial


def snapshot(study: Any, storage: str) -> SweepData:
    """A loaded Optuna study as a frozen snapshot."""
    trials = study.get_trials(deepcopy=False)
    attrs = study.user_attrs
    direction = "maximize" if study.direction.name == "MAXIMIZE" else "minimize"
    rows = tuple(row_of(t) for t in sorted(trials, key=lambda t: t.number))
    best, best_trial = best_so_far(rows, direction)
    starts = [r.started for r in rows if r.started is not None]
    wanted = _int(attrs.get("trials"))
    objective = attrs.get("objective")
    return SweepData(name=study.study_name, storage=storage, direction=direction,
                     objective=objective if isinstance(objective, str) else
                     ("max test_accuracy" if direction == "maximize" else "min time_to_accuracy"),
                     trials_wanted=wanted if wanted is not None and wanted >= 1 else None, rows=rows, best=best,
                     best_trial=best_trial, started=min(starts) if starts else None)


def sweep_names(path: Path | None = None) -> list[str]:
    """The sweeps in the storage, oldest first ([] when there is none yet)."""
    from gputui.sweep import study as studies

    target = path or studies.storage_path()
    if not target.is_file():
        return []
    store = studies.storage(target)
    try:
        return studies.names(store)
    finally:
        store.engine.dispose()


def read_sweep(name: str | None = None, path: Path | None = None) -> SweepData | None:
    """Sweep `name` (default: the newest) from the storage; None when there is no sweep yet.
    A UserError when `name` is not there."""
    from gputui.sweep import study as studies

    target = path or studies.storage_path()
    names = sweep_names(target)
    if not names:
        return None
    if name is None:
        name = names[-1]
    elif name not in names:
        raise UserError(f"no sweep {name} in {target} (sweeps: {', '.join(names[-8:])})")
    store = studies.storage(target)
    try:
        return snapshot(studies.open_study(name, store), studies.storage_url(target))
    except Exception as exc:  # noqa: BLE001 - a busy or damaged file is a message, not a crash
        raise GputuiError(f"cannot read sweep {name} from {target}: {exc}") from None
    finally:
        store.engine.dispose()
