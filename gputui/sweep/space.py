"""A profile's `[sweep]` table (declared in gputui.config.sweep) checked against its `[run]`, and the
search space asked of Optuna. Torch-free and optuna-free, so `gputui --help` stays fast.

The space is written with the run keys themselves:

    [sweep]
    trials = 12
    lr = [1e-4, 3e-2]          # log-uniform between the two bounds
    l1 = [0.0, 1e-4]           # uniform between the two bounds
    batch_size = [64, 128]     # choices
    epochs = [1, 2]            # choices
    model = ["fast"]           # choices
    seed = [0, 1, 2]           # choices

A key left out keeps the `[run]` table's value (or the model's default).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from gputui.config.profile import Profile, parse_profile
from gputui.config.recipes import RECIPES
from gputui.config.sweep import (  # noqa: F401 - re-exported: the table is declared in gputui.config.sweep
    NAME_RE, OBJECTIVES, SPACE_KEYS, SWEEP_SECTION, SweepSpec)
from gputui.model.errors import UserError


def spec_from(table: Mapping[str, Any], run: Any, path: Path | None, text: str) -> SweepSpec:
    """Cross-check a validated `[sweep]` table against the profile's `[run]` (RunSettings)."""
    where = f"{path}: " if path else ""
    values = dict(table)
    space = {k: tuple(values.pop(k)) for k in list(values) if k in SPACE_KEYS}
    if not space:
        raise UserError(f"{where}[sweep] has no search space: give at least one of "
                        f"{', '.join(SPACE_KEYS)} (e.g. lr = [1e-4, 1e-2])")
    name = values.pop("name", None) or (path.stem if path is not None else None)
    spec = SweepSpec(name="", space=space, profile_text=text,
                     profile_path=None if path is None else str(path.resolve()), **values)
    objective, target = spec.objective, spec.target
    if objective == "min time_to_accuracy" and target is None:
        raise UserError(f"{where}[sweep] objective 'min time_to_accuracy' needs `target` (a test accuracy in %, "
                        "e.g. target = 98.0)")
    if objective != "min time_to_accuracy" and target is not None:
        raise UserError(f"{where}[sweep] target goes with objective = 'min time_to_accuracy' (the objective is "
                        f"{objective!r}); remove it or change the objective")
    if run.strategy not in (None, "single"):
        raise UserError(f"{where}[run] strategy {run.strategy}: a sweep's trials train one process each "
                        "(strategy single); remove it")
    if spec.pruner != "none":
        most = max_evaluations(run, space)
        if most <= 1:
            raise UserError(f"{where}[sweep] pruner {spec.pruner}: every trial evaluates once, so there is nothing "
                            "to prune on; raise [run] evals_per_epoch or the epochs, or set pruner = \"none\"")
    if name is None or not NAME_RE.match(name):
        raise UserError(f"{where}[sweep] name: give the study a name of letters, digits, '_', '.' or '-'")
    return replace(spec, name=name)


def max_evaluations(run: Any, space: Mapping[str, tuple[Any, ...]]) -> int:
    """The most test evaluations any trial of the space makes (epochs x evals_per_epoch)."""
    models = space.get("model") or (run.model or "seed",)
    most = 0
    for model in models:
        recipe = RECIPES[model]
        epochs = space.get("epochs") or (run.epochs or recipe.epochs,)
        evals = run.evals_per_epoch or recipe.evals_per_epoch
        most = max(most, max(epochs) * evals)
    return most


def load_spec(path: Path) -> tuple[Profile, SweepSpec]:
    """The profile at `path` and its sweep; a UserError when it has no [sweep]."""
    from gputui.model.errors import read_user_file

    text = read_user_file(path, "profile", " (profiles/sweep.toml is an example sweep)")
    return parse_text(text, path)


def parse_text(text: str, path: Path | None) -> tuple[Profile, SweepSpec]:
    profile = parse_profile(text, path)
    table = profile.tables.get("sweep")
    if table is None:
        raise UserError(f"{path}: no [sweep] table: a sweep profile gives its search space there "
                        "(see profiles/sweep.toml)")
    return profile, spec_from(table, profile.run, path, text)


def suggest(trial: Any, space: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """The run keys of one trial, asked of an Optuna trial (an enqueued trial gives its fixed values)."""
    params: dict[str, Any] = {}
    for key, values in space.items():
        how = SPACE_KEYS[key]
        if how == "log":
            params[key] = trial.suggest_float(key, values[0], values[1], log=True)
        elif how == "uniform":
            params[key] = trial.suggest_float(key, values[0], values[1])
        else:
            params[key] = trial.suggest_categorical(key, list(values))
    return params


def default_threads(workers: int, view: Any = None) -> int:
    """Torch threads per worker when the profile does not say: what is free on this machine shared
    out, at least one (gputui.train.threads.choose_threads; `view`: a CpuView, else the machine now)."""
    from gputui.train.threads import choose_threads

    return choose_threads(workers, view)[0]
