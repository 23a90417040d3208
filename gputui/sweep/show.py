"""`gputui sweep show NAME`: the trials sorted by the objective, the best parameters, Optuna's
parameter importances; `--json`; `--run FILE` writes the best trial's run profile."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gputui.model import units
from gputui.model.errors import UserError
from gputui.model.paths import user_opener
from gputui.sweep import study as studies
from gputui.sweep.reader import SweepData, snapshot
from gputui.sweep.view import value_text


def trial_rows(data: SweepData) -> list[dict[str, Any]]:
    """Every trial as a dict, sorted: complete ones by the objective (best first), then the rest by number."""
    rows = [{"number": r.number, "state": r.state, "value": r.value, "params": dict(r.params),
             "evaluations": r.evaluations, "duration_s": r.seconds, "slot": r.slot, "attempts": r.attempts,
             "error": r.error, "requeued_from": r.requeued_from} for r in data.rows]
    sign = -1 if data.direction == "maximize" else 1

    def key(row: dict[str, Any]) -> tuple[Any, ...]:
        if row["state"] == "complete" and row["value"] is not None:
            return (0, sign * row["value"], row["number"])
        return (1, 0, row["number"])

    return sorted(rows, key=key)


def importances(study: Any) -> tuple[dict[str, float] | None, str | None]:
    """Optuna's parameter importances, or None and why there are none yet."""
    from optuna.trial import TrialState

    complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]
    if len(complete) < 2:
        return None, f"importances need 2 complete trials or more ({len(complete)} so far)"
    import optuna

    try:
        values = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError, ZeroDivisionError) as exc:
        return None, f"importances not available ({str(exc).splitlines()[0][:160]})"
    clean = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and math.isfinite(v)}
    if not clean:
        return None, "importances not available (no parameter varied among the complete trials)"
    return clean, None


def best(study: Any) -> Any:
    from optuna.trial import TrialState

    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return None
    return study.best_trial


def wanted(study: Any, default: int) -> int:
    """The trials the sweep's last master was asked for (`--trials` included), as the study records
    it; the profile's `[sweep] trials` for a study that does not say."""
    value = study.user_attrs.get("trials")
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else default


def report(name: str) -> dict[str, Any]:
    study, _profile, spec = studies.load(name, "sweep show")
    winner = best(study)
    imp, why = importances(study)
    data = snapshot(study, studies.storage_url())  # the one reader: the dashboard shows the same
    return {"name": name, "storage": data.storage, "objective": spec.objective, "target": spec.target,
            "direction": spec.direction, "trials": wanted(study, spec.trials), "finished": data.done,
            "best": None if winner is None else {"number": winner.number, "value": winner.value,
                                                 "params": dict(winner.params)},
            "importances": imp, "importances_note": why, "trial_rows": trial_rows(data)}


def print_report(data: dict[str, Any]) -> None:
    from gputui.views import cloud as view

    metric = data["objective"].split()[-1]
    objective = data["objective"] if " " in data["objective"] else \
        f"{'max' if data['direction'] == 'maximize' else 'min'} {metric}"  # a program's metric
    rows = []
    for r in data["trial_rows"]:
        params = ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["params"].items())
        value = value_text(r["value"], metric) if r["state"] == "complete" else "n/a"
        note = r["error"] or (f"requeued from {r['requeued_from']}" if r["requeued_from"] is not None else "")
        rows.append([r["number"], r["state"], value, params, r["evaluations"],
                     units.duration(r["duration_s"]), r["slot"] or "n/a", note])
    view.print_table(f"Sweep {data['name']}: {objective}"
                     + (f" (target {data['target']:g}%)" if data["target"] else "")
                     + f", {data['finished']}/{data['trials']} trials finished",
                     ["trial", "state", "value", "params", "evals", "time", "slot", "note"], rows,
                     caption=f"study: {data['storage']} (optuna-dashboard opens it); "
                     f"the best as a run profile: gputui sweep show {data['name']} --run FILE")
    b = data["best"]
    if b is None:
        view.say("best: none yet (no trial complete)")
    else:
        params = ", ".join(f"{k} = {v!r}" for k, v in b["params"].items())
        view.say(f"best: trial {b['number']}, {value_text(b['value'], metric)}: {params}")
    if data["importances"]:
        view.say("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in data["importances"].items()))
    else:
        view.say(data["importances_note"] or "importances: n/a")


def write_best_profile(name: str, target: Path | None) -> Path:
    """The best trial's run profile, as `gputui run --profile` reads it; the file written. A
    program's parameters go into its command and its [run] trial."""
    from dataclasses import replace

    from gputui.config.run import RunSettings

    study, profile, spec = studies.load(name, "sweep show")
    winner = best(study)
    if winner is None:
        raise UserError(f"sweep {name}: no trial is complete yet, so there is no best run to write")
    path = target if target is not None else Path(f"{name}-best.toml")
    text = (f"# The best trial ({winner.number}) of sweep {name}: {spec.objective_text} = {winner.value!r}.\n"
            f"# Train it again with: gputui run --profile {path}\n")
    if spec.of_program:
        cfg = replace(profile.run.resolve().with_trial(dict(winner.params)), objective=spec.metric,
                      direction=spec.direction)
        text += ("# Its parameters, in its command and in [run] trial (report.trial()): "
                 + json.dumps(dict(cfg.trial), sort_keys=True) + "\n")
    else:
        cfg = profile.run.merged(RunSettings(**dict(winner.params))).resolve()
    cfg = replace(cfg, device=profile.run.device or "auto")
    try:
        with open(path, "w", encoding="utf-8", opener=user_opener) as fh:  # the user's file: the user's umask
            fh.write(text + cfg.to_toml())
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}") from None
    return path
