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
from typing import TYPE_CHECKING, Any, ClassVar, Mapping, Sequence

from gputui.config.recipes import MODEL_NAMES, RECIPES
from gputui.config.schema import REQUIRED, key, section_of

DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?)$")
STRATEGIES = ("single", "dataparallel", "ddp")


# A metric's name, in a program's reports, a metrics_regex group, an objective: the one pattern.
METRIC_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.:/-]{0,63}$")
# A parameter of a program's trial ([sweep.params], [run] trial): `{name}` in [run] command, a key of report.trial().
PARAM_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")


def directed(value: str) -> tuple[str, str | None]:
    """An objective as (metric, direction): "val_acc" -> ("val_acc", None), and "max val_acc" /
    "min loss", the way `gputui sweep show` and the study write it, -> with their direction."""
    word, _, rest = value.partition(" ")
    if word in ("max", "min") and METRIC_NAME.match(rest):
        return rest, "maximize" if word == "max" else "minimize"
    return value, None


def _check_objective(value: Any) -> str | None:
    if METRIC_NAME.match(directed(value)[0]):
        return None
    return ("the name of a metric the program reports, e.g. \"val_acc\" (or with its direction: "
            "\"max val_acc\", \"min loss\")")


def _check_regexes(value: Any) -> str | None:
    """Each a regular expression with at least one named group (the metric's name)."""
    for text in value:
        try:
            pattern = re.compile(text)
        except re.error as exc:
            return f"regular expressions; {text!r} is not one ({exc})"
        if not pattern.groupindex:
            return f"regular expressions with named groups, e.g. (?P<loss>[0-9.]+); {text!r} has none"
    return None


def _check_trial(value: Any) -> str | None:
    bad = next((name for name, _ in value if not PARAM_RE.match(name)), None)
    if bad is None:
        return None
    return f"parameter names of letters, digits and '_' ({bad!r} is not one: a parameter is written {{name}} in command)"


def _check_command(value: Any) -> str | None:
    if value and not value[0].strip():
        return "a list of words whose first is the program, e.g. [\"python\", \"train.py\"]"
    return None


def _check_device(value: Any) -> str | None:
    if DEVICE_RE.match(value):
        return None
    return "'auto', 'cpu', 'mps', 'cuda' or 'cuda:N'"


@dataclass(frozen=True)
class RunConfig:
    """A fully resolved run: what the trainer uses and what the run directory records."""

    model: str = key("str", "Network to train (its recipe gives the defaults).", "seed", attr=REQUIRED,
                     choices=MODEL_NAMES, only="net")
    device: str = key("str", "auto (CUDA, then MPS, then CPU), cpu, mps, cuda or cuda:N.", "auto", attr=REQUIRED,
                      check=_check_device)
    strategy: str = key("str", "single, dataparallel (all or `gpus`) or ddp (torchrun).", "single", attr=REQUIRED,
                        choices=STRATEGIES)
    nproc: int | None = key("int", "ddp: processes (default: one per GPU, or 2 on a CPU).", None, attr=REQUIRED,
                            minimum=1, maximum=1024)
    gpus: tuple[int, ...] | None = key("int_list", "dataparallel/ddp: GPU indices to use (default: all visible).",
                                       None, attr=REQUIRED, minimum=0)
    epochs: int = key("int", "Epochs to train (the run's target).", None, attr=REQUIRED, minimum=1, maximum=100000,
                      only="net")
    batch_size: int = key("int", "Global batch size (split across ddp processes).", None, attr=REQUIRED, minimum=1,
                          maximum=1 << 20, only="net")
    lr: float = key("float", "Peak learning rate.", None, attr=REQUIRED, minimum=0, exclusive_minimum=True,
                    maximum=100, only="net")
    optimizer: str = key("str", "sgd or adam.", None, attr=REQUIRED, choices=("sgd", "adam"), only="net")
    momentum: float = key("float", "SGD momentum.", None, attr=REQUIRED, minimum=0, maximum=1, exclusive_maximum=True,
                          only="net")
    betas: tuple[float, float] = key("float_pair", "Adam betas [b1, b2].", None, attr=REQUIRED, minimum=0, maximum=1,
                                     exclusive_maximum=True, only="net")
    weight_decay: float = key("float", "L2 weight decay.", None, attr=REQUIRED, minimum=0, maximum=1, only="net")
    l1: float = key("float", "Coefficient of the L1 penalty on the weights (0 turns it off).", None, attr=REQUIRED,
                    minimum=0, maximum=1, only="net")
    schedule: str = key("str", "Learning-rate schedule.", None, attr=REQUIRED,
                        choices=("onecycle", "cosine", "constant"), only="net")
    warmup: float = key("float", "onecycle: fraction of the steps spent rising to the peak.", None, attr=REQUIRED,
                        minimum=0, maximum=1, exclusive_maximum=True, only="net")
    evals_per_epoch: int = key("int", "Test evaluations per epoch (the last one closes the epoch).", None,
                               attr=REQUIRED, minimum=1, maximum=1000, only="net")
    seed: int = key("int", "Random seed: same seed, same run (0 to 2**32-1).", 0, attr=REQUIRED, minimum=0,
                    maximum=2**32 - 1, only="net")
    data: str | None = key("str", "Directory holding the four MNIST-format IDX files (default: bundled MNIST).", None,
                           attr=REQUIRED, only="net")
    threads: int | None = key("int", "CPU threads for torch (default: torch's choice).", None, attr=REQUIRED,
                              minimum=1, maximum=1024)
    cuda_graph: bool = key("bool", "single on CUDA: capture each training step as one CUDA graph (false: eager).",
                           True, only="net")
    checkpoint_every_s: float = key("float", "Seconds between epoch-end checkpoints (0: every epoch); a run always "
                                    "checkpoints on stop, on a spot notice and at its end.", 5.0, minimum=0,
                                    maximum=86400, only="net")

    # Your own program (docs/program.md): a run whose `command` is set runs it instead of a built-in net.
    command: tuple[str, ...] = key("str_list", "Your own program and its arguments, e.g. [\"python\", \"train.py\", "
                                   "\"--lr\", \"{lr}\"] ({name}: a [sweep] parameter); empty: the built-in `model`.",
                                   (), check=_check_command, only="program")
    workdir: str | None = key("str", "The program's working directory (default: the profile's directory; the "
                              "current one for `gputui run -- PROGRAM`).", None, only="program")
    env: tuple[tuple[str, str], ...] = key("str_table", "Extra environment variables for the program.", (),
                                           only="program")
    metrics_regex: tuple[str, ...] = key("str_list", "Regular expressions whose named groups turn the program's "
                                         "output lines into metrics, e.g. \"Loss: (?P<loss>[0-9.]+)\".", (),
                                         check=_check_regexes, only="program")
    stop_grace_s: float = key("float", "Seconds a stopped program has to save and exit before SIGKILL.", 30.0,
                              minimum=0, maximum=3600, only="program")
    # ... on a cluster's nodes and spot slaves (docs/program.md#on-ssh-hosts-and-spot-slaves)
    sync_exclude: tuple[str, ...] = key("str_list", "Glob patterns of workdir files not sent to the nodes (besides "
                                        "what .gitignore leaves out in a git work tree).", (), only="program")
    sync_max_mb: float = key("float", "The most of workdir sent to a node, in MB: over it the run is refused, naming "
                             "the largest files.", 200.0, minimum=0, exclusive_minimum=True, maximum=1 << 20,
                             only="program")
    setup: str | None = key("str", "A shell command run once per node in its gputui venv, e.g. \"pip install -r "
                            "requirements.txt\" (again when `setup_files` change).", None, only="program")
    setup_files: tuple[str, ...] = key("str_list", "Files of workdir whose change runs `setup` again.",
                                       ("requirements.txt", "pyproject.toml"), only="program")
    checkpoint_pull_s: float = key("float", "Seconds between pulls of rank 0's checkpoint directory to the master "
                                   "(also at each report.log(checkpoint=True) and on stop).", 60.0, minimum=1,
                                   maximum=86400, only="program")
    objective: str | None = key("str", "A reported metric that rates the run (its last and best are listed), e.g. "
                                "\"val_acc\", or with its direction, \"max val_acc\" / \"min loss\".", None,
                                check=_check_objective, only="program")
    direction: str = key("str", "Whether the objective is better high (maximize) or low (minimize).", "maximize",
                         choices=("maximize", "minimize"), only="program")
    trial: tuple[tuple[str, Any], ...] = key(
        "value_table", "A sweep trial's parameters: they fill {name} in `command` and reach the program as "
        "report.trial() (GPUTUI_TRIAL), e.g. {lr = 0.01}; `gputui sweep show --run` writes them.", (),
        check=_check_trial, only="program")

    @property
    def is_program(self) -> bool:
        """A run of the user's own program rather than a built-in net."""
        return bool(self.command)

    def to_toml(self) -> str:
        """The resolved profile, as a TOML document loadable by `load_profile`.

        Written by tomli-w, so any string (quotes, backslashes, control and non-BMP characters
        such as an emoji in a `data` path) survives the round trip; None values are left out.
        """
        aside = "net" if self.is_program else "program"  # a program's profile holds no net keys, and the reverse
        return _TOML_HEADER + _dump_toml({"run": {f.name: getattr(self, f.name) for f in fields(self)
                                                  if RUN_SECTION.fields[f.name].only != aside}})

    def with_trial(self, params: Mapping[str, Any] | None = None) -> RunConfig:
        """This run with a trial's values (`params`, a sweep's choice) on top of [run] trial: {name}
        filled in the command, and [run] trial holding them all (report.trial(), profile.toml)."""
        values = {**dict(self.trial), **(params or {})}
        return replace(self, command=tuple(substitute(self.command, values)), trial=tuple(sorted(values.items())))

    def settings(self) -> RunSettings:
        """These values as (fully set) settings, to merge flags on top of."""
        return RunSettings(**{f.name: getattr(self, f.name) for f in fields(self)})


RUN_SECTION = section_of(
    RunConfig, "run", "How to train: the model, where, how, and the hyper-parameters that override the model's.")

_TOML_HEADER = "# Resolved profile of this run (written by gputui; used by --resume).\n"


def substitute(command: Sequence[str], params: Mapping[str, Any]) -> list[str]:
    """`{name}` in each word replaced by the trial parameter `name` (other braces left as they are;
    a float as its repr, which reads back exactly)."""
    if not params:
        return list(command)
    pattern = re.compile(r"\{(" + "|".join(re.escape(k) for k in params) + r")\}")
    return [pattern.sub(lambda m: _word(params[m.group(1)]), word) for word in command]


def _word(value: Any) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def only_for(kind: str) -> tuple[str, ...]:
    """The [run] keys that concern one kind of run alone, "net" (the built-in nets) or "program"."""
    return tuple(name for name, spec in RUN_SECTION.fields.items() if spec.only == kind)


def written_by_gputui(text: str) -> bool:
    """A resolved profile gputui wrote (a run's profile.toml, `sweep show --run`), of this version or
    an older one: those wrote every key, a program's net keys too."""
    return _TOML_HEADER in text


def uneven_batch(batch_size: int, world: int) -> str | None:
    """Why a global batch cannot be split over `world` DDP processes (each rank takes an equal
    share), or None: checked before a local run starts and again by each trainer."""
    if world > 1 and batch_size % world:
        lower = batch_size - batch_size % world
        return (f"batch_size {batch_size} does not split evenly over {world} ddp processes; use a multiple of "
                f"{world}, e.g. --batch-size {lower if lower else world}")
    return None


def _dump_toml(doc: Mapping[str, Mapping[str, Any]]) -> str:
    import tomli_w  # lazy: only the master writes profiles (slaves only read them)

    return tomli_w.dumps({table: {k: _toml_value(v) for k, v in values.items() if v is not None and v != ()}
                          for table, values in doc.items()})


def _toml_value(value: Any) -> Any:
    """A tuple as a TOML list, a tuple of (name, value) pairs (a "str_table" key) as a table."""
    if isinstance(value, tuple):
        if value and all(isinstance(item, tuple) for item in value):
            return dict(value)
        return list(value)
    return value


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
