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

A sweep of your own program (`[run] command`) names its parameters freely, in `[sweep.params]`
(gputui.config.sweep.Param), and rates its trials by a metric the program reports:

    [sweep]
    objective = "val_acc"      # a reported metric (default: [run] objective)
    direction = "maximize"     # or "minimize" (default: [run] direction)
    [sweep.params]
    lr = {low = 1e-4, high = 1e-1, log = true}
    dropout = [0.1, 0.5]       # two floats: uniform
    width = [32, 64, 128]      # choices
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from gputui.config.profile import Profile, parse_profile
from gputui.config.recipes import RECIPES
from gputui.config.sweep import (  # noqa: F401 - re-exported: the table is declared in gputui.config.sweep
    NAME_RE, OBJECTIVES, SPACE_KEYS, SWEEP_SECTION, Param, SweepSpec)
from gputui.config.run import directed
from gputui.model.errors import UserError


def spec_from(table: Mapping[str, Any], run: Any, path: Path | None, text: str) -> SweepSpec:
    """Cross-check a validated `[sweep]` table against the profile's `[run]` (RunSettings)."""
    where = f"{path}: " if path else ""
    values = dict(table)
    space = {k: tuple(values.pop(k)) for k in list(values) if k in SPACE_KEYS}
    name = values.pop("name", None) or (path.stem if path is not None else None)
    if run.command:
        values.update(_program_objective(values, run, where, space))
    else:
        _builtin_objective(values, where)
        if not space:
            raise UserError(f"{where}[sweep] has no search space: give at least one of "
                            f"{', '.join(SPACE_KEYS)} (e.g. lr = [1e-4, 1e-2])")
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
    if spec.pruner != "none" and not spec.of_program:
        most = max_evaluations(run, space)
        if most <= 1:
            raise UserError(f"{where}[sweep] pruner {spec.pruner}: every trial evaluates once, so there is nothing "
                            "to prune on; raise [run] evals_per_epoch or the epochs, or set pruner = \"none\"")
    if name is None or not NAME_RE.match(name):
        raise UserError(f"{where}[sweep] name: give the study a name of letters, digits, '_', '.' or '-'")
    return replace(spec, name=name)


def _builtin_objective(values: dict[str, Any], where: str) -> None:
    """The built-in nets: one of OBJECTIVES (which says its direction), their run keys as the space."""
    objective = values.get("objective", OBJECTIVES[0])
    if objective not in OBJECTIVES:
        raise UserError(f"{where}[sweep] objective {objective!r} names a metric of your own program: set [run] "
                        f"command, or use {' or '.join(repr(o) for o in OBJECTIVES)} for the built-in nets")
    if values.get("params"):
        raise UserError(f"{where}[sweep.params] goes with [run] command (your own program); the built-in nets' "
                        f"space is written in [sweep] itself with their run keys ({', '.join(SPACE_KEYS)})")
    direction = values.get("direction")
    if direction is not None and direction != ("minimize" if objective.startswith("min ") else "maximize"):
        raise UserError(f"{where}[sweep] direction {direction!r} contradicts objective {objective!r}; "
                        "remove direction (the built-in objectives say theirs)")


def _program_objective(values: dict[str, Any], run: Any, where: str,
                       space: Mapping[str, tuple[Any, ...]]) -> dict[str, Any]:
    """Your own program: a metric it reports, with a direction; parameters in [sweep.params]."""
    if space:
        raise UserError(f"{where}[sweep] {', '.join(space)}: your program's parameters go in [sweep.params] "
                        "(e.g. lr = {low = 1e-4, high = 1e-1, log = true}), where any name is allowed")
    if not values.get("params"):
        raise UserError(f"{where}[sweep.params] is missing: give your program's parameters there, e.g. "
                        "lr = {low = 1e-4, high = 1e-1, log = true} (each is {name} in [run] command and a key "
                        "of report.trial())")
    objective = values.get("objective") or run.objective
    if objective is None:
        raise UserError(f"{where}[sweep] objective: name the metric your program reports that rates a trial, "
                        "e.g. objective = \"val_acc\" (with direction = \"maximize\" or \"minimize\")")
    if objective in OBJECTIVES:
        raise UserError(f"{where}[sweep] objective {objective!r} is the built-in nets'; for your program name a "
                        "metric it reports, e.g. objective = \"val_acc\"")
    if values.get("target") is not None:
        raise UserError(f"{where}[sweep] target goes with the built-in nets' 'min time_to_accuracy'; remove it")
    metric, says = directed(objective)
    direction = values.get("direction")
    if says is not None and direction is not None and direction != says:
        raise UserError(f"{where}[sweep] objective {objective!r} is to {says} but direction is {direction!r}; "
                        f"keep one (objective = {metric!r} with direction, or {objective!r} alone)")
    return {"objective": metric, "direction": says or direction or run.direction or "maximize"}


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


def parse_text(text: str, path: Path | None, kept: bool = False) -> tuple[Profile, SweepSpec]:
    profile = parse_profile(text, path, kept)  # kept: the study's copy (parse_profile)
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


def suggest_params(trial: Any, params: Sequence[Param]) -> dict[str, Any]:
    """A program's parameters for one trial, asked of an Optuna trial."""
    out: dict[str, Any] = {}
    for p in params:
        if p.kind == "choice":
            out[p.name] = trial.suggest_categorical(p.name, list(p.choices))
        elif p.kind == "int":
            out[p.name] = trial.suggest_int(p.name, int(p.low or 0), int(p.high or 0), log=p.log)
        else:
            out[p.name] = trial.suggest_float(p.name, float(p.low or 0.0), float(p.high or 0.0), log=p.log)
    return out


def ask(trial: Any, spec: SweepSpec) -> dict[str, Any]:
    """One trial's parameters: the run keys of the built-in nets, or a program's own."""
    return suggest_params(trial, spec.params) if spec.of_program else suggest(trial, spec.space)


def default_threads(workers: int, view: Any = None) -> int:
    """Torch threads per worker when the profile does not say: what is free on this machine shared
    out, at least one (gputui.train.threads.choose_threads; `view`: a CpuView, else the machine now)."""
    from gputui.train.threads import choose_threads

    return choose_threads(workers, view)[0]
