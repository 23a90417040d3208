"""The `[sweep]` profile table: the search space over the run keys, the objective, the sampler,
the pruner and the workers. Torch-free and optuna-free: gputui.profiles validates it with the
other tables, and `gputui --help` stays fast.

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

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from gputui.errors import UserError
from gputui.schema import Field, Section
from gputui.train.recipes import MODEL_NAMES, RECIPES

OBJECTIVES = ("max test_accuracy", "min time_to_accuracy")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The run keys the space may cover: (how they are searched, the [run] field that bounds them).
SPACE_KEYS: dict[str, str] = {"lr": "log", "l1": "uniform", "batch_size": "choice", "epochs": "choice",
                              "model": "choice", "seed": "choice"}


def _range(value: Any) -> str | None:
    low, high = value
    if low == high:
        return f"[low, high] with low < high: [{low:g}, {high:g}] is an empty range (fix the value in [run] instead)"
    if low > high:
        return f"[low, high] with low < high: [{low:g}, {high:g}] is inverted (write [{high:g}, {low:g}])"
    return None


def _choices(value: Any) -> str | None:
    return None if len(value) else "at least one choice (an empty list leaves nothing to try)"


def _models(value: Any) -> str | None:
    if not value:
        return _choices(value)
    bad = [v for v in value if v not in MODEL_NAMES]
    return f"models among {', '.join(MODEL_NAMES)} (not {bad[0]!r})" if bad else None


def _name(value: Any) -> str | None:
    return None if NAME_RE.match(value) else "a name of letters, digits, '_', '.' or '-' (at most 64)"


SWEEP_SECTION = Section(
    name="sweep",
    doc="A hyper-parameter search over the [run] keys (gputui sweep): the space, the objective, the workers.",
    fields={
        "name": Field("str", "The study's name (default: the profile's file name); `gputui sweep show NAME`.", None,
                      check=_name),
        "trials": Field("int", "Trials to finish (complete, pruned or failed).", 20, minimum=1, maximum=100000),
        "objective": Field("str", "'max test_accuracy' (the final test accuracy) or 'min time_to_accuracy' "
                           "(training seconds to reach `target`).", OBJECTIVES[0], choices=OBJECTIVES),
        "target": Field("float", "min time_to_accuracy: the test accuracy to reach, in percent.", None,
                        minimum=0, exclusive_minimum=True, maximum=100),
        "sampler": Field("str", "tpe (Optuna's TPE, seeded) or random.", "tpe", choices=("tpe", "random")),
        "sampler_seed": Field("int", "Seed of the sampler: same seed, same trials asked.", 0, minimum=0,
                              maximum=2**32 - 1),
        "pruner": Field("str", "median (stop a trial whose test accuracy at an evaluation is below the median of "
                        "the trials before it there) or none.", "median", choices=("median", "none")),
        "pruner_startup": Field("int", "median: finished trials before any is pruned.", 3, minimum=0, maximum=10000),
        "pruner_warmup": Field("int", "median: evaluations of a trial before it may be pruned.", 1, minimum=0,
                               maximum=10000),
        "lr": Field("float_pair", "Learning rate: [low, high], searched log-uniformly.", None, minimum=0,
                    exclusive_minimum=True, maximum=100, check=_range),
        "l1": Field("float_pair", "L1 coefficient: [low, high], searched uniformly.", None, minimum=0, maximum=1,
                    check=_range),
        "batch_size": Field("int_list", "Batch sizes to choose from.", None, minimum=1, maximum=1 << 20, check=_choices),
        "epochs": Field("int_list", "Epoch counts to choose from.", None, minimum=1, maximum=100000, check=_choices),
        "model": Field("str_list", "Models to choose from.", None, check=_models),
        "seed": Field("int_list", "Seeds to choose from (a seed study).", None, minimum=0, maximum=2**32 - 1,
                      check=_choices),
        "workers": Field("int", "Local workers (default: trials_per_gpu on each GPU, or one per CPU core with no "
                         "GPU); 0: none here (the slots are elsewhere).", None, minimum=0, maximum=1024),
        "trials_per_gpu": Field("int", "Workers sharing one GPU (for nets too small to fill it).", 1, minimum=1,
                                maximum=64),
        "threads": Field("int", "CPU threads for torch in each worker (default: the CPUs free on this machine "
                         "over the local workers).", None, minimum=1, maximum=1024),
        "budget_usd": Field("float", "No new trial starts once the projected spend would pass this.", None,
                            minimum=0, exclusive_minimum=True),
        "keep_slaves": Field("bool", "Keep the cloud slaves the sweep started when it ends.", False),
    },
)


@dataclass(frozen=True)
class SweepSpec:
    """A validated `[sweep]` table with its defaults, and the profile it came with."""

    name: str
    trials: int
    objective: str
    target: float | None
    sampler: str
    sampler_seed: int
    pruner: str
    pruner_startup: int
    pruner_warmup: int
    space: Mapping[str, tuple[Any, ...]]  # key -> (low, high) for lr/l1, the choices for the others
    workers: int | None
    trials_per_gpu: int
    threads: int | None
    budget_usd: float | None
    keep_slaves: bool
    profile_text: str  # the whole profile, kept in the study so --resume needs no file
    profile_path: str | None

    @property
    def direction(self) -> str:
        return "maximize" if self.objective.startswith("max") else "minimize"

    @property
    def metric(self) -> str:
        return self.objective.split()[1]


def spec_from(table: Mapping[str, Any], run: Any, path: Path | None, text: str) -> SweepSpec:
    """Cross-check a validated `[sweep]` table against the profile's `[run]` (RunSettings)."""
    where = f"{path}: " if path else ""
    values = {k: v for k, v in table.items()}
    space = {k: tuple(values.pop(k)) for k in list(values) if k in SPACE_KEYS}
    if not space:
        raise UserError(f"{where}[sweep] has no search space: give at least one of "
                        f"{', '.join(SPACE_KEYS)} (e.g. lr = [1e-4, 1e-2])")
    objective = values.get("objective", OBJECTIVES[0])
    target = values.get("target")
    if objective == "min time_to_accuracy" and target is None:
        raise UserError(f"{where}[sweep] objective 'min time_to_accuracy' needs `target` (a test accuracy in %, "
                        "e.g. target = 98.0)")
    if objective != "min time_to_accuracy" and target is not None:
        raise UserError(f"{where}[sweep] target goes with objective = 'min time_to_accuracy' (the objective is "
                        f"{objective!r}); remove it or change the objective")
    if run.strategy not in (None, "single"):
        raise UserError(f"{where}[run] strategy {run.strategy}: a sweep's trials train one process each "
                        "(strategy single); remove it")
    pruner = values.get("pruner", "median")
    if pruner != "none":
        most = max_evaluations(run, space)
        if most <= 1:
            raise UserError(f"{where}[sweep] pruner {pruner}: every trial evaluates once, so there is nothing to "
                            "prune on; raise [run] evals_per_epoch or the epochs, or set pruner = \"none\"")
    name = values.get("name") or (path.stem if path is not None else None)
    if name is None or not NAME_RE.match(name):
        raise UserError(f"{where}[sweep] name: give the study a name of letters, digits, '_', '.' or '-'")
    return SweepSpec(
        name=name, trials=values.get("trials", 20), objective=objective, target=target,
        sampler=values.get("sampler", "tpe"), sampler_seed=values.get("sampler_seed", 0), pruner=pruner,
        pruner_startup=values.get("pruner_startup", 3), pruner_warmup=values.get("pruner_warmup", 1),
        space=space, workers=values.get("workers"), trials_per_gpu=values.get("trials_per_gpu", 1),
        threads=values.get("threads"), budget_usd=values.get("budget_usd"),
        keep_slaves=values.get("keep_slaves", False), profile_text=text,
        profile_path=None if path is None else str(path.resolve()))


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


def load_spec(path: Path) -> tuple[Any, SweepSpec]:
    """The profile at `path` (gputui.profiles.Profile) and its sweep; a UserError when it has no [sweep]."""
    from gputui.errors import read_user_file

    text = read_user_file(path, "profile", " (profiles/sweep.toml is an example sweep)")
    return parse_text(text, path)


def parse_text(text: str, path: Path | None) -> tuple[Any, SweepSpec]:
    from gputui.profiles import parse_profile

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
