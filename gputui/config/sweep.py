"""The `[sweep]` profile table: the search space over the run keys, the objective, the sampler,
the pruner and the workers. Declared once, as `SweepSpec`; torch-free and optuna-free.

The space of the built-in nets is written with the run keys themselves (see gputui.sweep.space);
they are gathered in `SweepSpec.space`. A sweep of the user's own program (`[run] command`)
names its parameters freely in `[sweep.params]` (`Param`, in `SweepSpec.params`) and rates its
trials by a metric the program reports (`objective = "val_acc"`, `direction`). Cross-checking the
table against the profile's `[run]` is gputui.sweep.space.spec_from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as attribute
from typing import Any, Mapping

from gputui.config.recipes import MODEL_NAMES
from gputui.config.run import METRIC_NAME, PARAM_RE, directed
from gputui.config.schema import REQUIRED, SCHEMA, SCHEMA_KEYS, Field, key, section_of

OBJECTIVES = ("max test_accuracy", "min time_to_accuracy")
DIRECTIONS = ("maximize", "minimize")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
# The run keys the space may cover, and how each is searched.
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


def _objective(value: Any) -> str | None:
    if value in OBJECTIVES or METRIC_NAME.match(directed(value)[0]):
        return None
    return (f"{' or '.join(repr(o) for o in OBJECTIVES)} for the built-in nets, or the name of a metric your "
            "program reports (e.g. \"val_acc\", or \"max val_acc\" with its direction)")


@dataclass(frozen=True)
class Param:
    """One parameter of a program's sweep, as `[sweep.params]` writes it:

    - `name = [low, high]`, two floats: a float, uniform in [low, high];
    - `name = {low = L, high = H}` (`log = true`: log-uniform): a float, or a whole number when
      both bounds are whole numbers;
    - `name = [a, b, c, ...]`, anything else: one of these choices (numbers, strings, booleans);
      `name = {choices = [...]}` says the same (for two floats to choose between).
    """

    name: str
    kind: str  # "float", "int" or "choice"
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()



def _is_number(value: Any) -> bool:
    from gputui.model.outside import finite

    return finite(value) is not None


def _choices_of(name: str, values: Any) -> Param:
    if not isinstance(values, list) or not values:
        raise ValueError(f"{name} as at least one choice (an empty list leaves nothing to try)")
    for v in values:
        if not (isinstance(v, (str, bool)) or _is_number(v)):
            raise ValueError(f"{name}'s choices as numbers, strings or booleans (not {v!r})")
    seen: list[Any] = []
    for v in values:
        if any(type(v) is type(s) and v == s for s in seen):
            raise ValueError(f"{name}'s choices each once ({v!r} is given twice)")
        seen.append(v)
    return Param(name, "choice", choices=tuple(values))


def _range_of(name: str, low: Any, high: Any, log: Any) -> Param:
    if not (_is_number(low) and _is_number(high)):
        raise ValueError(f"{name}'s low and high as numbers (not {low!r}, {high!r})")
    if not isinstance(log, bool):
        raise ValueError(f"{name}'s log as true or false (not {log!r})")
    if low >= high:
        why = "an empty range (a fixed value goes in the command)" if low == high else f"inverted: write [{high}, {low}]"
        raise ValueError(f"{name} as [low, high] with low < high ([{low}, {high}] is {why})")
    if log and low <= 0:
        raise ValueError(f"{name} with low > 0 for log = true (low = {low})")
    whole = isinstance(low, int) and isinstance(high, int)
    return Param(name, "int" if whole else "float", low if whole else float(low), high if whole else float(high), log)


def param_of(name: str, value: Any) -> Param:
    """A `[sweep.params]` entry as a Param; a ValueError whose text follows "expected" (the schema's error)."""
    if not PARAM_RE.match(name):
        raise ValueError(f"parameter names of letters, digits and '_' ({name!r} is not one: a parameter is "
                         "written {name} in [run] command)")
    if isinstance(value, dict):
        extra = sorted(set(value) - {"low", "high", "log", "choices"})
        if extra:
            raise ValueError(f"{name} as {{low, high, log}} or {{choices = [...]}} (unknown key {extra[0]!r})")
        if "choices" in value:
            if len(value) > 1:
                raise ValueError(f"{name} as {{choices = [...]}} alone (no low, high or log beside them)")
            return _choices_of(name, value["choices"])
        if "low" not in value or "high" not in value:
            raise ValueError(f"{name} as a range with low and high, e.g. {{low = 1e-4, high = 1e-1, log = true}}")
        return _range_of(name, value["low"], value["high"], value.get("log", False))
    if isinstance(value, list):
        if len(value) == 2 and all(_is_number(v) for v in value) and any(isinstance(v, float) for v in value):
            return _range_of(name, value[0], value[1], False)
        return _choices_of(name, value)
    raise ValueError(f"{name} as a range [low, high] or {{low, high, log}}, or a list of choices, not the one value "
                     f"{value!r} (a fixed value goes in the command)")


class ParamsField(Field):
    """`[sweep.params]`: a table of parameters (`Param`), kept as a tuple in the order written."""

    def expected(self) -> str:
        return "a table of parameters (name = [low, high], {low, high, log}, or a list of choices)"

    def coerce(self, value: Any) -> Any:
        if isinstance(value, tuple):  # already coerced
            return value
        if not isinstance(value, dict):
            raise ValueError(self.expected())
        if not value:
            raise ValueError("at least one parameter, e.g. [sweep.params] lr = {low = 1e-4, high = 1e-1, log = true}")
        return tuple(param_of(str(name), item) for name, item in value.items())


_PARAMS = ParamsField("table", "Your own program's parameters ([run] command): name = [low, high] (two floats, "
                      "uniform), {low = L, high = H, log = true} (log-uniform; whole numbers when both bounds are), or "
                      "a list of choices. Each is {name} in the command and a key of report.trial().", ())


# The keys of the space, one per entry of SPACE_KEYS: all gathered in SweepSpec.space.
_SPACE: dict[str, Field] = {
    "lr": Field("float_pair", "Learning rate: [low, high], searched log-uniformly.", None, minimum=0,
                exclusive_minimum=True, maximum=100, check=_range),
    "l1": Field("float_pair", "L1 coefficient: [low, high], searched uniformly.", None, minimum=0, maximum=1,
                check=_range),
    "batch_size": Field("int_list", "Batch sizes to choose from.", None, minimum=1, maximum=1 << 20, check=_choices),
    "epochs": Field("int_list", "Epoch counts to choose from.", None, minimum=1, maximum=100000, check=_choices),
    "model": Field("str_list", "Models to choose from.", None, check=_models),
    "seed": Field("int_list", "Seeds to choose from (a seed study).", None, minimum=0, maximum=2**32 - 1,
                  check=_choices),
}


@dataclass(frozen=True)
class SweepSpec:
    """A validated `[sweep]` table with its defaults, and the profile it came with."""

    # key -> (low, high) for lr/l1, the choices for the others
    space: Mapping[str, tuple[Any, ...]] = attribute(metadata={SCHEMA_KEYS: _SPACE})
    profile_text: str = attribute()  # the whole profile, kept in the study so --resume needs no file
    profile_path: str | None = attribute()
    name: str = key("str", "The study's name (default: the profile's file name); `gputui sweep show NAME`.", None,
                    attr=REQUIRED, check=_name)
    # a program's sweep: its own parameters ([sweep.params]); () for the built-in nets
    params: tuple[Param, ...] = attribute(default=(), metadata={SCHEMA: _PARAMS})
    trials: int = key("int", "Trials to finish (complete, pruned or failed).", 20, minimum=1, maximum=100000)
    objective: str = key("str", "'max test_accuracy' (the final test accuracy) or 'min time_to_accuracy' "
                         "(training seconds to reach `target`); for your own program, the name of a metric it "
                         "reports, e.g. \"val_acc\" (default: [run] objective), or with its direction, \"max "
                         "val_acc\" / \"min loss\": a trial's value is its last report.",
                         OBJECTIVES[0], check=_objective)
    direction: str = key("str", "Your own program's objective: maximize or minimize (default: [run] direction). "
                         "The built-in objectives say theirs.", None, choices=DIRECTIONS)
    target: float | None = key("float", "min time_to_accuracy: the test accuracy to reach, in percent.", None,
                               minimum=0, exclusive_minimum=True, maximum=100)
    sampler: str = key("str", "tpe (Optuna's TPE, seeded) or random.", "tpe", choices=("tpe", "random"))
    sampler_seed: int = key("int", "Seed of the sampler: same seed, same trials asked.", 0, minimum=0,
                            maximum=2**32 - 1)
    pruner: str = key("str", "median (stop a trial whose test accuracy at an evaluation is below the median of "
                      "the trials before it there) or none.", "median", choices=("median", "none"))
    pruner_startup: int = key("int", "median: finished trials before any is pruned.", 3, minimum=0, maximum=10000)
    pruner_warmup: int = key("int", "median: evaluations of a trial before it may be pruned.", 1, minimum=0,
                             maximum=10000)
    workers: int | None = key("int", "Local workers (default: trials_per_gpu on each GPU, or one per CPU core with "
                              "no GPU); 0: none here (the slots are elsewhere).", None, minimum=0, maximum=1024)
    trials_per_gpu: int = key("int", "Workers sharing one GPU (for nets too small to fill it).", 1, minimum=1,
                              maximum=64)
    threads: int | None = key("int", "CPU threads for torch in each worker (default: the CPUs free on this machine "
                              "over the local workers).", None, minimum=1, maximum=1024)
    budget_usd: float | None = key("float", "No new trial starts once the projected spend would pass this.", None,
                                   minimum=0, exclusive_minimum=True)
    keep_slaves: bool = key("bool", "Keep the cloud slaves the sweep started when it ends.", False)

    def __post_init__(self) -> None:
        if self.direction is None:  # a built-in objective says its own direction
            object.__setattr__(self, "direction", "minimize" if self.objective.startswith("min ") else "maximize")

    @property
    def of_program(self) -> bool:
        """A sweep of the user's own program: its objective is a metric the program reports."""
        return self.objective not in OBJECTIVES

    @property
    def metric(self) -> str:
        return self.objective if self.of_program else self.objective.split()[1]

    @property
    def objective_text(self) -> str:
        """The objective with its direction, as the study records it: "max val_acc", "max test_accuracy"."""
        return f"{'max' if self.direction == 'maximize' else 'min'} {self.metric}" if self.of_program else self.objective


SWEEP_SECTION = section_of(
    SweepSpec, "sweep",
    "A hyper-parameter search over the [run] keys (gputui sweep): the space, the objective, the workers.")
