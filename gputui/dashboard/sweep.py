"""The dashboard's sweep view, its data: one sweep's study read from the SQLite storage (Optuna's
RDB storage, as `gputui sweep` writes it) into frozen rows. No Textual here: the sweep screen
(gputui.ui.sweep_screen) calls `read_sweep` in a thread worker and only draws what it returns.

What a trial is running on: the scheduler records the slot in the trial's `slot` user attribute
(when the trial starts, and again when it ends). Requeued records (a trial a stopped master left
running, asked again under a new number) are shown as `requeued`, and not counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gputui.errors import GputuiError, UserError
from gputui.model.outside import number


@dataclass(frozen=True)
class TrialRow:
    number: int
    state: str  # running, complete, pruned, failed, requeued, waiting
    value: float | None
    params: tuple[tuple[str, Any], ...]
    slot: str | None
    started: float | None  # Unix seconds
    ended: float | None
    attempts: int | None
    error: str | None

    @property
    def seconds(self) -> float | None:
        return self.ended - self.started if self.started is not None and self.ended is not None else None


@dataclass(frozen=True)
class SweepData:
    """One sweep as the screen shows it."""

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
        return sum(1 for r in self.rows if r.state in ("complete", "pruned", "failed"))

    @property
    def running(self) -> tuple[TrialRow, ...]:
        """The running trials, by slot (a trial whose slot is not known yet last)."""
        return tuple(sorted((r for r in self.rows if r.state == "running"), key=lambda r: (r.slot is None,
                                                                                            r.slot or "", r.number)))


_STATES = {"RUNNING": "running", "COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed", "WAITING": "waiting"}


def _ts(when: datetime | None) -> float | None:
    return when.timestamp() if when is not None else None


def row_of(trial: Any) -> TrialRow:
    from gputui.sweep.study import REQUEUED

    attrs = trial.user_attrs
    state = _STATES.get(trial.state.name, trial.state.name.lower())
    if state == "failed" and attrs.get(REQUEUED):
        state = "requeued"
    slot = attrs.get("slot")
    attempts = attrs.get("attempts")
    error = attrs.get("error")
    return TrialRow(number=trial.number, state=state, value=number(trial.value) if state == "complete" else None,
                    params=tuple(sorted(trial.params.items())), slot=str(slot) if slot is not None else None,
                    started=_ts(trial.datetime_start), ended=_ts(trial.datetime_complete),
                    attempts=attempts if isinstance(attempts, int) else None,
                    error=str(error) if error is not None else None)


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


def sweep_names(path: Path | None = None) -> list[str]:
    """The sweeps in the storage, oldest first ([] when there is none yet)."""
    from gputui.sweep import study as studies

    target = path or studies.storage_path()
    if not target.is_file():
        return []
    optuna = studies._optuna()  # noqa: SLF001 - quiet logging, same warnings policy
    store = optuna.storages.RDBStorage(studies.storage_url(target))
    try:
        return [s.study_name for s in sorted(optuna.get_all_study_summaries(store, include_best_trial=False),
                                             key=lambda s: s._study_id)]  # noqa: SLF001 - creation order
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
    optuna = studies._optuna()  # noqa: SLF001
    store = optuna.storages.RDBStorage(studies.storage_url(target))
    try:
        study = optuna.load_study(study_name=name, storage=store)
        trials = study.get_trials(deepcopy=False)
        attrs = study.user_attrs
        direction = "maximize" if study.direction.name == "MAXIMIZE" else "minimize"
    except Exception as exc:  # noqa: BLE001 - a busy or damaged file is a message, not a crash
        raise GputuiError(f"cannot read sweep {name} from {target}: {exc}") from None
    finally:
        store.engine.dispose()
    rows = tuple(row_of(t) for t in sorted(trials, key=lambda t: t.number))
    best, best_trial = best_so_far(rows, direction)
    starts = [r.started for r in rows if r.started is not None]
    wanted = attrs.get("trials")
    objective = attrs.get("objective")
    return SweepData(name=name, storage=studies.storage_url(target), direction=direction,
                     objective=str(objective) if isinstance(objective, str) else
                     ("max test_accuracy" if direction == "maximize" else "min time_to_accuracy"),
                     trials_wanted=wanted if isinstance(wanted, int) else None, rows=rows, best=best,
                     best_trial=best_trial, started=min(starts) if starts else None)


def value_text(value: float | None, metric: str) -> str:
    from gputui.sweep.view import value_text as text

    return text(value, metric)


def params_text(params: tuple[tuple[str, Any], ...]) -> str:
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in params)


def summary(data: SweepData) -> str:
    """The counts line: done of wanted, running, pruned, failed, the best."""
    wanted = f"/{data.trials_wanted}" if data.trials_wanted else ""
    best = value_text(data.best[-1][1] if data.best else None, data.metric)
    if data.best_trial is not None:
        best += f" (trial {data.best_trial})"
    return (f"sweep {data.name} ({data.objective}): {data.done}{wanted} done, {data.count('running')} running, "
            f"{data.count('pruned')} pruned, {data.count('failed')} failed; best {best}")
