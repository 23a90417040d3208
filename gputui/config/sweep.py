"""The `[sweep]` profile table: the search space over the run keys, the objective, the sampler,
the pruner and the workers. Declared once, as `SweepSpec`; torch-free and optuna-free.

The space is written with the run keys themselves (see gputui.sweep.space); they are gathered
in `SweepSpec.space`. Cross-checking the table against the profile's `[run]` is
gputui.sweep.space.spec_from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from dataclasses import field as attribute
from typing import Any, Mapping

from gputui.config.recipes import MODEL_NAMES
from gputui.config.schema import REQUIRED, SCHEMA_KEYS, Field, key, section_of

OBJECTIVES = ("max test_accuracy", "min time_to_accuracy")
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
    trials: int = key("int", "Trials to finish (complete, pruned or failed).", 20, minimum=1, maximum=100000)
    objective: str = key("str", "'max test_accuracy' (the final test accuracy) or 'min time_to_accuracy' "
                         "(training seconds to reach `target`).", OBJECTIVES[0], choices=OBJECTIVES)
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

    @property
    def direction(self) -> str:
        return "maximize" if self.objective.startswith("max") else "minimize"

    @property
    def metric(self) -> str:
        return self.objective.split()[1]


SWEEP_SECTION = section_of(
    SweepSpec, "sweep",
    "A hyper-parameter search over the [run] keys (gputui sweep): the space, the objective, the workers.")
