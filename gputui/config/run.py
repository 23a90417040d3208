"""The `[run]` profile table: the model, where and how to train it, and its hyper-parameters.

Declared once, as `RunConfig` (a fully resolved run, every key typed and documented by
`key`). `RunSettings` (the table as written, every key optional: None means "use the
default") is generated from RunConfig's fields, and `RUN_SECTION` from its metadata: a new
key is one line here (plus, when each model has its own default, a field of `Recipe`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, make_dataclass, replace
from dataclasses import field as attribute
from typing import TYPE_CHECKING, Any, ClassVar, Mapping

from gputui.config.recipes import MODEL_NAMES, RECIPES
from gputui.config.schema import REQUIRED, key, section_of

DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
STRATEGIES = ("single", "dataparallel", "ddp")


def _check_device(value: Any) -> str | None:
    if DEVICE_RE.match(value):
        return None
    return "'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"


@dataclass(frozen=True)
class RunConfig:
    """A fully resolved run: what the trainer uses and what the run directory records."""

    model: str = key("str", "Network to train (its recipe gives the defaults).", "seed", attr=REQUIRED,
                     choices=MODEL_NAMES)
    device: str = key("str", "auto (CUDA, then MPS, then CPU), cpu, mps, cuda or cuda:N.", "auto", attr=REQUIRED,
                      check=_check_device)
    strategy: str = key("str", "single, dataparallel (all or `gpus`) or ddp (torchrun).", "single", attr=REQUIRED,
                        choices=STRATEGIES)
    nproc: int | None = key("int", "ddp: processes (default: one per GPU, or 2 on a CPU).", None, attr=REQUIRED,
                            minimum=1, maximum=1024)
    gpus: tuple[int, ...] | None = key("int_list", "dataparallel/ddp: GPU indices to use (default: all visible).",
                                       None, attr=REQUIRED, minimum=0)
    epochs: int = key("int", "Epochs to train (the run's target).", None, attr=REQUIRED, minimum=1, maximum=100000)
    batch_size: int = key("int", "Global batch size (split across ddp processes).", None, attr=REQUIRED, minimum=1,
                          maximum=1 << 20)
    lr: float = key("float", "Peak learning rate.", None, attr=REQUIRED, minimum=0, exclusive_minimum=True,
                    maximum=100)
    optimizer: str = key("str", "sgd or adam.", None, attr=REQUIRED, choices=("sgd", "adam"))
    momentum: float = key("float", "SGD momentum.", None, attr=REQUIRED, minimum=0, maximum=1, exclusive_maximum=True)
    betas: tuple[float, float] = key("float_pair", "Adam betas [b1, b2].", None, attr=REQUIRED, minimum=0, maximum=1,
                                     exclusive_maximum=True)
    weight_decay: float = key("float", "L2 weight decay.", None, attr=REQUIRED, minimum=0, maximum=1)
    l1: float = key("float", "Coefficient of the L1 penalty on the weights (0 turns it off).", None, attr=REQUIRED,
                    minimum=0, maximum=1)
    schedule: str = key("str", "Learning-rate schedule.", None, attr=REQUIRED, choices=("onecycle", "cosine", "constant"))
    warmup: float = key("float", "onecycle: fraction of the steps spent rising to the peak.", None, attr=REQUIRED,
                        minimum=0, maximum=1, exclusive_maximum=True)
    evals_per_epoch: int = key("int", "Test evaluations per epoch (the last one closes the epoch).", None,
                               attr=REQUIRED, minimum=1, maximum=1000)
    seed: int = key("int", "Random seed: same seed, same run (0 to 2**32-1).", 0, attr=REQUIRED, minimum=0,
                    maximum=2**32 - 1)
    data: str | None = key("str", "Directory holding the four MNIST-format IDX files (default: bundled MNIST).", None,
                           attr=REQUIRED)
    threads: int | None = key("int", "CPU threads for torch (default: torch's choice).", None, attr=REQUIRED,
                              minimum=1, maximum=1024)
    cuda_graph: bool = key("bool", "single on CUDA: capture each training step as one CUDA graph (false: eager).",
                           True)
    checkpoint_every_s: float = key("float", "Seconds between epoch-end checkpoints (0: every epoch); a run always "
                                    "checkpoints on stop, on a spot notice and at its end.", 5.0, minimum=0,
                                    maximum=86400)

    def to_toml(self) -> str:
        """The resolved profile, as a TOML document loadable by `load_profile`.

        Written by tomli-w, so any string (quotes, backslashes, control and non-BMP characters
        such as an emoji in a `data` path) survives the round trip; None values are left out.
        """
        return _TOML_HEADER + _dump_toml({"run": {f.name: getattr(self, f.name) for f in fields(self)}})

    def settings(self) -> RunSettings:
        """These values as (fully set) settings, to merge flags on top of."""
        return RunSettings(**{f.name: getattr(self, f.name) for f in fields(self)})


RUN_SECTION = section_of(
    RunConfig, "run", "How to train: the model, where, how, and the hyper-parameters that override the model's.")

_TOML_HEADER = "# Resolved profile of this run (written by gputui; used by --resume).\n"


def _dump_toml(doc: Mapping[str, Mapping[str, Any]]) -> str:
    import tomli_w  # lazy: only the master writes profiles (slaves only read them)

    return tomli_w.dumps({table: {k: list(v) if isinstance(v, tuple) else v
                                  for k, v in values.items() if v is not None}
                          for table, values in doc.items()})


def _merged(self: Any, override: Any) -> Any:
    """These settings with every non-None value of `override` on top."""
    changes = {f.name: getattr(override, f.name) for f in fields(override) if getattr(override, f.name) is not None}
    return replace(self, **changes)


def _resolve(self: Any) -> RunConfig:
    """Fill the gaps from the model's recipe and the schema defaults."""
    model = self.model or RUN_SECTION.fields["model"].default
    recipe = RECIPES[model]
    values: dict[str, Any] = {}
    for f in fields(RunConfig):
        mine = getattr(self, f.name)
        if mine is not None:
            values[f.name] = mine
        elif hasattr(recipe, f.name):
            values[f.name] = getattr(recipe, f.name)
        else:
            values[f.name] = RUN_SECTION.fields[f.name].default
    values["model"] = model
    return RunConfig(**values)


if TYPE_CHECKING:
    class RunSettings:
        """The `[run]` table with every key optional: None means "use the default"."""

        __dataclass_fields__: ClassVar[dict[str, Any]]

        def __init__(self, **values: Any) -> None: ...
        def __getattr__(self, name: str) -> Any: ...
        def merged(self, override: RunSettings) -> RunSettings: ...
        def resolve(self) -> RunConfig: ...
else:
    # RunConfig's keys, each Optional with None for "not set": generated, never listed a second time.
    RunSettings = make_dataclass(
        "RunSettings", [(f.name, f"{f.type} | None", attribute(default=None)) for f in fields(RunConfig)],
        frozen=True, namespace={"merged": _merged, "resolve": _resolve,
                                "__doc__": 'The `[run]` table with every key optional: None means "use the default".'})
    RunSettings.__module__ = __name__
