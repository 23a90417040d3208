"""Profiles: TOML files under profiles/ that describe runs (and, later, hosts and clouds).

A profile has one `[run]` table. Every key is optional: a missing key takes the
model's own default (see gputui.train.recipes) or the documented default below.
Unknown keys, wrong types and impossible values are errors naming the file, the
line, the key and what is expected (exit 2).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Mapping

from gputui.alerts import ALERTS_SECTION
from gputui.cloud.settings import CLOUD_SECTION
from gputui.cluster.settings import CLUSTER_SECTION
from gputui.errors import UserError, read_user_file
from gputui.hosts import HOSTS_SECTION
from gputui.schema import Field, Section, Source
from gputui.sweep.space import SWEEP_SECTION
from gputui.train.recipes import MODEL_NAMES, RECIPES

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
STRATEGIES = ("single", "dataparallel", "ddp")


def _check_device(value: Any) -> str | None:
    if DEVICE_RE.match(value):
        return None
    return "'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"


RUN_SECTION = Section(
    name="run",
    doc="How to train: the model, where, how, and the hyper-parameters that override the model's.",
    fields={
        "model": Field("str", "Network to train (its recipe gives the defaults).", "seed", choices=MODEL_NAMES),
        "device": Field("str", "auto (CUDA, then MPS, then CPU), cpu, mps, cuda or cuda:N.", "auto", check=_check_device),
        "strategy": Field("str", "single, dataparallel (all or `gpus`) or ddp (torchrun).", "single", choices=STRATEGIES),
        "nproc": Field("int", "ddp: processes (default: one per GPU, or 2 on a CPU).", None, minimum=1, maximum=1024),
        "gpus": Field("int_list", "dataparallel/ddp: GPU indices to use (default: all visible).", None, minimum=0),
        "epochs": Field("int", "Epochs to train (the run's target).", None, minimum=1, maximum=100000),
        "batch_size": Field("int", "Global batch size (split across ddp processes).", None, minimum=1, maximum=1 << 20),
        "lr": Field("float", "Peak learning rate.", None, minimum=0, exclusive_minimum=True, maximum=100),
        "optimizer": Field("str", "sgd or adam.", None, choices=("sgd", "adam")),
        "momentum": Field("float", "SGD momentum.", None, minimum=0, maximum=1, exclusive_maximum=True),
        "betas": Field("float_pair", "Adam betas [b1, b2].", None, minimum=0, maximum=1, exclusive_maximum=True),
        "weight_decay": Field("float", "L2 weight decay.", None, minimum=0, maximum=1),
        "l1": Field("float", "Coefficient of the L1 penalty on the weights (0 turns it off).", None, minimum=0, maximum=1),
        "schedule": Field("str", "Learning-rate schedule.", None, choices=("onecycle", "cosine", "constant")),
        "warmup": Field("float", "onecycle: fraction of the steps spent rising to the peak.", None, minimum=0, maximum=1, exclusive_maximum=True),
        "evals_per_epoch": Field("int", "Test evaluations per epoch (the last one closes the epoch).", None, minimum=1, maximum=1000),
        "seed": Field("int", "Random seed: same seed, same run (0 to 2**32-1).", 0, minimum=0, maximum=2**32 - 1),
        "data": Field("str", "Directory holding the four MNIST-format IDX files (default: bundled MNIST).", None),
        "threads": Field("int", "CPU threads for torch (default: torch's choice).", None, minimum=1, maximum=1024),
        "cuda_graph": Field("bool", "single on CUDA: capture each training step as one CUDA graph (false: eager).", True),
    },
)

UI_SECTION = Section(
    name="ui",
    doc="The dashboard's behaviour.",
    fields={
        "confirm": Field("bool", "u (launch a slave) and d (terminate the selected one) ask first; "
                         "the cost panel says what each will do either way.", False),
    },
)

# Every table a profile may hold. Each feature's schema lives in a torch-free module and is
# listed here, so that a profile is validated whole whatever has been imported.
PROFILE_SECTIONS: dict[str, Section] = {
    "run": RUN_SECTION, "hosts": HOSTS_SECTION, "cloud": CLOUD_SECTION, "cluster": CLUSTER_SECTION,
    "alerts": ALERTS_SECTION, "sweep": SWEEP_SECTION, "ui": UI_SECTION,
}


@dataclass(frozen=True)
class RunSettings:
    """The `[run]` table with every key optional: None means "use the default"."""

    model: str | None = None
    device: str | None = None
    strategy: str | None = None
    nproc: int | None = None
    gpus: tuple[int, ...] | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    optimizer: str | None = None
    momentum: float | None = None
    betas: tuple[float, float] | None = None
    weight_decay: float | None = None
    l1: float | None = None
    schedule: str | None = None
    warmup: float | None = None
    evals_per_epoch: int | None = None
    seed: int | None = None
    data: str | None = None
    threads: int | None = None
    cuda_graph: bool | None = None

    def merged(self, override: "RunSettings") -> "RunSettings":
        """These settings with every non-None value of `override` on top."""
        changes = {f.name: getattr(override, f.name) for f in fields(override) if getattr(override, f.name) is not None}
        return replace(self, **changes)

    def resolve(self) -> "RunConfig":
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


@dataclass(frozen=True)
class RunConfig:
    """A fully resolved run: what the trainer uses and what the run directory records."""

    model: str
    device: str
    strategy: str
    nproc: int | None
    gpus: tuple[int, ...] | None
    epochs: int
    batch_size: int
    lr: float
    optimizer: str
    momentum: float
    betas: tuple[float, float]
    weight_decay: float
    l1: float
    schedule: str
    warmup: float
    evals_per_epoch: int
    seed: int
    data: str | None
    threads: int | None
    cuda_graph: bool = True

    def to_toml(self) -> str:
        """The resolved profile, as a TOML document loadable by `load_profile`.

        Written by tomli-w, so any string (quotes, backslashes, control and non-BMP characters
        such as an emoji in a `data` path) survives the round trip; None values are left out.
        """
        return _TOML_HEADER + _dump_toml({"run": {f.name: getattr(self, f.name) for f in fields(self)}})

    def settings(self) -> RunSettings:
        """These values as (fully set) settings, to merge flags on top of."""
        return RunSettings(**{f.name: getattr(self, f.name) for f in fields(self)})


_TOML_HEADER = "# Resolved profile of this run (written by gputui; used by --resume).\n"


def _dump_toml(doc: Mapping[str, Mapping[str, Any]]) -> str:
    import tomli_w  # lazy: only the master writes profiles (slaves only read them)

    return tomli_w.dumps({table: {k: list(v) if isinstance(v, tuple) else v
                                  for k, v in values.items() if v is not None}
                          for table, values in doc.items()})


@dataclass(frozen=True)
class Profile:
    """A loaded profile: where it came from and its validated sections."""

    path: Path | None
    run: RunSettings
    tables: Mapping[str, Any] = field(default_factory=dict)  # the other sections, validated


def parse_profile(text: str, path: Path | None = None) -> Profile:
    """Validate TOML text as a profile; errors name `path`, the line and the key."""
    source = Source(path, text)
    where = str(path) if path else "profile"
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{where}: not valid TOML: {exc}") from None
    for name in doc:
        if name not in PROFILE_SECTIONS:
            known = ", ".join(f"[{s}]" for s in PROFILE_SECTIONS)
            raise source.error(None, name, f"unknown table or key (a profile has {known})")
    tables = {name: PROFILE_SECTIONS[name].validate_any(value, source) for name, value in doc.items() if name != "run"}
    run = RUN_SECTION.validate(doc.get("run", {}), source)
    if "data" in run and path is not None:
        data = Path(run["data"]).expanduser()
        run["data"] = str(data if data.is_absolute() else (path.parent / data).resolve())
    return Profile(path=path, run=RunSettings(**run), tables=tables)


def load_profile(path: Path) -> Profile:
    """Read and validate a profile file."""
    text = read_user_file(path, "profile", " (profiles ship in profiles/, e.g. profiles/local.toml)")
    return parse_profile(text, path)
