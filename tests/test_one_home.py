"""One home for reading data from outside the process (gputui.model.outside): one parser of
outside JSON lines and one "finite number from outside" helper. A second copy elsewhere in
gputui/ fails here: a function named like one of the old copies, a function that checks for a
bool and for finiteness (what such a helper does), or a raw json parse outside the allow-list."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

GPUTUI = Path(__file__).resolve().parent.parent / "gputui"
HOME = "model/outside.py"

# Names the old copies had (sweep/protocol.number, curves._num, history._num, sources/nvml._num,
# dashboard/sweep._finite, watches._number, units._num, exporter._finite, events.finite).
HELPER_NAMES = {"_num", "_number", "_finite", "number", "finite", "_float", "_as_float", "_positive_number"}
# Functions with such a name that are not helpers of that kind: (file, name) -> why.
NOT_HELPERS = {
    ("views/progress.py", "_num"): "formats a number for the progress line; parses nothing",
    ("views/telemetry.py", "_num"): "formats a number through its units function; parses nothing",
    ("cloud/lease.py", "number"): "reads an instance tag's text (a string) as a time",
    ("cloud/sim.py", "number"): "reads a simulated instance tag's text (a string) as a time",
    ("report.py", "_number_text"): "gputui.report is stdlib only and imports nothing of gputui (a user's program copies or "
                          "imports it alone): it checks the numbers it is given, it parses nothing",
}
# json parses of text this process wrote itself: (file) -> how many, and why they are not outside text.
OWN_JSON = {
    "cloud/sim.py": (1, "the simulated cloud's own state file (private, written by gputui)"),
    "cloud/pricing.py": (1, "gputui's own price cache (written by gputui in its cache directory)"),
    "cluster/settings.py": (1, "the cluster record gputui wrote into the run directory"),
    "cluster/store.py": (1, "a JSON column gputui wrote into its own SQLite store"),
    "runs/summaries.py": (1, "gputui's own summary cache (summary.json beside a run's events, written by gputui)"),
    "report.py": (1, "GPUTUI_TRIAL, set by gputui for the program; stdlib only, so not gputui.model.outside"),
    "cluster/checkpoints.py": (1, "the record of the last pull gputui wrote into the master's run directory"),
    "cluster/nodeprog.py": (1, "the 0600 settings file the master wrote for the program on the node"),
}
PARSERS = {"loads", "load", "JSONDecoder", "raw_decode"}


def sources() -> list[tuple[str, ast.Module]]:
    out = []
    for path in sorted(GPUTUI.rglob("*.py")):
        rel = path.relative_to(GPUTUI).as_posix()
        if rel != HOME:
            out.append((rel, ast.parse(path.read_text(encoding="utf-8"), filename=str(path))))
    return out


def _calls(node: ast.AST) -> set[str]:
    """The dotted names called inside `node` (math.isfinite, isinstance, ...)."""
    names = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call):
            func = sub.func
            if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
                names.add(f"{func.value.id}.{func.attr}")
            elif isinstance(func, ast.Name):
                names.add(func.id)
    return names


def _checks_bool(node: ast.AST) -> bool:
    """Whether `node` has an isinstance(..., bool) check (or bool in a tuple of types)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id == "isinstance" and len(sub.args) == 2:
            kinds = sub.args[1].elts if isinstance(sub.args[1], ast.Tuple) else [sub.args[1]]
            if any(isinstance(k, ast.Name) and k.id == "bool" for k in kinds):
                return True
    return False


def test_there_is_one_finite_number_helper() -> None:
    found = []
    for rel, tree in sources():
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if node.name in HELPER_NAMES and (rel, node.name) not in NOT_HELPERS:
                found.append(f"{rel}:{node.lineno} def {node.name}: a number helper of its own")
            elif (_checks_bool(node) and ({"math.isfinite", "isfinite"} & _calls(node))
                  and (rel, node.name) not in NOT_HELPERS):
                found.append(f"{rel}:{node.lineno} def {node.name}: checks for a bool and for finiteness")
    assert not found, ("use gputui.model.outside (finite, number, index) instead of a copy:\n" + "\n".join(found))


def test_outside_json_is_parsed_by_the_one_parser() -> None:
    found: dict[str, list[int]] = {}
    for rel, tree in sources():
        for node in ast.walk(tree):
            hit = False
            if isinstance(node, ast.Attribute):  # json.loads, json.load, json.JSONDecoder, any .raw_decode
                hit = node.attr == "raw_decode" or (
                    node.attr in PARSERS and isinstance(node.value, ast.Name) and node.value.id == "json")
            elif isinstance(node, ast.ImportFrom) and node.module == "json":
                hit = any(alias.name in PARSERS for alias in node.names)
            if hit:
                found.setdefault(rel, []).append(node.lineno)
    wrong = {rel: lines for rel, lines in found.items() if len(lines) > OWN_JSON.get(rel, (0, ""))[0]}
    assert not wrong, ("parse text from outside with gputui.model.outside (parse, parse_object, Tally), "
                       f"or add a json parse of gputui's own file to OWN_JSON with why: {wrong}")
    stale = {rel: len(found.get(rel, [])) for rel in OWN_JSON
             if (GPUTUI / rel).is_file() and len(found.get(rel, [])) != OWN_JSON[rel][0]}
    assert not stale, f"OWN_JSON allows more json parses than these files hold now; lower its counts: {stale}"


def test_the_names_allowed_are_functions_that_are_there() -> None:
    names = {(rel, node.name) for rel, tree in sources() for node in ast.walk(tree)
             if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert set(NOT_HELPERS) <= names, set(NOT_HELPERS) - names


# One reader of the sweep study (gputui.sweep.reader) --------------------------------------------

def _study_in_every_state(tmp_path: Path) -> Any:
    """A study with a trial in each state: complete, pruned, fail, requeued (a running trial a
    stopped master left), running (the requeued trial's parameters asked again) and waiting."""
    import optuna
    from optuna.trial import TrialState

    from gputui.sweep import study as studies
    from gputui.sweep.space import parse_text

    _profile, spec = parse_text('[run]\nmodel = "fast"\n[sweep]\nname = "every"\ntrials = 8\nlr = [1e-3, 1e-1]\n',
                                tmp_path / "every.toml")
    study = studies.create(spec)
    lr = {"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)}
    study.tell(study.ask(lr), 90.0)
    study.tell(study.ask(lr), state=TrialState.PRUNED)
    study.tell(study.ask(lr), state=TrialState.FAIL)
    study.ask(lr)  # running when the master stops: requeued, its parameters asked again (trial 4)
    assert studies.requeue_running(study) == [3]
    assert study.ask(lr).number == 4  # running
    study.enqueue_trial({"lr": 0.01})  # waiting
    return study


def test_sweep_show_and_the_dashboard_name_each_trial_state_the_same(tmp_path: Path) -> None:
    from gputui.dashboard.sweep import read_sweep
    from gputui.sweep import show
    from gputui.sweep.reader import STATES
    from gputui.ui.sweep_screen import STATE_STYLE

    _study_in_every_state(tmp_path)
    shown = {r["number"]: r["state"] for r in show.report("every")["trial_rows"]}  # `sweep show --json`
    data = read_sweep("every")
    assert data is not None
    dashboard = {r.number: r.state for r in data.rows}
    assert shown == dashboard == {0: "complete", 1: "pruned", 2: "fail", 3: "requeued", 4: "running", 5: "waiting"}
    assert set(dashboard.values()) == set(STATES)
    assert set(STATE_STYLE) == set(STATES), "the sweep screen styles every state by the name it shows"
    assert show.report("every")["finished"] == data.done == 3  # the requeued record is not counted


def test_the_dashboard_reads_the_study_through_its_one_storage(tmp_path: Path, monkeypatch: Any) -> None:
    """study.storage (with its 60 s busy timeout) is how every reader opens the file."""
    from gputui.dashboard.sweep import read_sweep
    from gputui.sweep import study as studies

    _study_in_every_state(tmp_path)
    opened: list[Path | None] = []
    real = studies.storage

    def storage(path: Path | None = None) -> Any:
        opened.append(path)
        return real(path)

    monkeypatch.setattr(studies, "storage", storage)
    data = read_sweep("every")
    assert data is not None and len(data.rows) == 6
    assert opened, "the dashboard's reader opened the study without study.storage (no busy timeout)"


def test_only_the_study_module_opens_optuna_storage() -> None:
    found = []
    for rel, tree in sources():
        if rel == "sweep/study.py":
            continue
        for node in ast.walk(tree):
            name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
            if name in {"load_study", "RDBStorage", "create_study"}:
                found.append(f"{rel}:{node.lineno} {name}")
    assert not found, "open the sweep study through gputui.sweep.study (storage, open_study, create, load):\n" + \
        "\n".join(found)


# One display format per unit (gputui.model.units) ------------------------------------------------------

FORMAT_NAMES = {"money", "per_hour", "price", "dollars", "duration", "span", "minutes", "ago", "_ago", "elapsed",
                "hms", "clock"}
TIME_UNITS = {60, 3600, 86400}


def _time_arithmetic(node: ast.AST) -> bool:
    """`x // 60`, `x % 3600`, `x / 60` ...: seconds cut into minutes, hours or days."""
    return (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Mod, ast.Div))
            and isinstance(node.right, ast.Constant) and node.right.value in TIME_UNITS)


def format_copies(rel: str, tree: ast.AST) -> list[str]:
    """The display formats for money and durations in one module that are not gputui.model.units'."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in FORMAT_NAMES and (
                isinstance(node.returns, ast.Name) and node.returns.id == "str"):  # text, not a price or a clock
            found.append(f"{rel}:{node.lineno} def {node.name}: a money or duration format of its own")
        elif isinstance(node, ast.JoinedStr):
            for a, b in zip(node.values, node.values[1:]):
                if isinstance(a, ast.Constant) and str(a.value).endswith("$") and isinstance(b, ast.FormattedValue):
                    found.append(f"{rel}:{node.lineno} f\"...${{...}}\": dollars formatted in place")
            if any(isinstance(v, ast.FormattedValue) and _time_arithmetic(v.value) for v in node.values):
                found.append(f"{rel}:{node.lineno} f\"{{seconds / 60}}...\": a duration formatted in place")
    return found


def test_money_and_durations_are_formatted_by_units_alone() -> None:
    found = [line for rel, tree in sources() if rel != "model/units.py" for line in format_copies(rel, tree)]
    assert not found, ("format money with units.money / units.per_hour and a duration with units.duration "
                       "(styles short, clock, words) instead of a copy:\n" + "\n".join(found))


def test_the_format_check_finds_the_copies_there_were() -> None:
    """The copies this check replaced (commands/cloud_view.money and span, dashboard/child.minutes,
    alerts._ago, cloud/leaks' "${rate:.2f}/h", the idle stop's "{idle_s / 60:.1f} min") are found."""
    old = '''
def money(value: float, digits: int = 4) -> str:
    return f"${value:,.{digits}f}"
def span(seconds: int) -> str:
    return f"{seconds // 60}m{seconds % 60:02d}s"
def describe(rate):
    return f"running, ${rate:.2f}/h"
def idle(idle_s):
    return f"idle for {idle_s / 60:.1f} min"
'''
    found = format_copies("old.py", ast.parse(old))
    assert [line.split()[1:3] for line in found if "def " in line] == [["def", "money:"], ["def", "span:"]]
    assert sum("dollars formatted in place" in line for line in found) == 2
    assert sum("a duration formatted in place" in line for line in found) == 2


def test_lines_of_outside_bytes_are_split_by_the_one_splitter() -> None:
    """Bytes that come in pieces (an events file, a node's output, a socket) are split into lines
    by gputui.model.lines.LineSplitter alone (bounded, each byte searched once): a second
    `buffer.split(b"\\n")` or a `readline()` loop (unbounded) fails here."""
    found = []
    for path in sorted(GPUTUI.rglob("*.py")):
        if path == GPUTUI / "model" / "lines.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            splits_bytes = (node.func.attr == "split" and node.args and isinstance(node.args[0], ast.Constant)
                            and node.args[0].value == b"\n")
            if splits_bytes or node.func.attr in ("readline", "readlines"):
                found.append(f"{path.relative_to(GPUTUI.parent)}:{node.lineno}")
    assert found == []
