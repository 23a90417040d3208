"""One home for reading data from outside the process (gputui.model.outside): one parser of
outside JSON lines and one "finite number from outside" helper. A second copy elsewhere in
gputui/ fails here: a function named like one of the old copies, a function that checks for a
bool and for finiteness (what such a helper does), or a raw json parse outside the allow-list."""

from __future__ import annotations

import ast
from pathlib import Path

GPUTUI = Path(__file__).resolve().parent.parent / "gputui"
HOME = "model/outside.py"

# Names the old copies had (sweep/protocol.number, curves._num, history._num, sources/nvml._num,
# dashboard/sweep._finite, watches._number, units._num, exporter._finite, events.finite).
HELPER_NAMES = {"_num", "_number", "_finite", "number", "finite", "_float", "_as_float", "_positive_number"}
# Functions with such a name that are not helpers of that kind: (file, name) -> why.
NOT_HELPERS = {
    ("console.py", "_num"): "formats a number for the progress line; parses nothing",
    ("telemetry_view.py", "_num"): "formats a number through its units function; parses nothing",
    ("cloud/lease.py", "number"): "reads an instance tag's text (a string) as a time",
    ("cloud/sim.py", "number"): "reads a simulated instance tag's text (a string) as a time",
}
# json parses of text this process wrote itself: (file) -> how many, and why they are not outside text.
OWN_JSON = {
    "cloud/sim.py": (1, "the simulated cloud's own state file (private, written by gputui)"),
    "cloud/pricing.py": (1, "gputui's own price cache (written by gputui in its cache directory)"),
    "cluster/settings.py": (1, "the cluster record gputui wrote into the run directory"),
    "cluster/store.py": (1, "a JSON column gputui wrote into its own SQLite store"),
    "summaries.py": (1, "gputui's own summary cache (summary.json beside a run's events, written by gputui)"),
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
            elif _checks_bool(node) and ({"math.isfinite", "isfinite"} & _calls(node)):
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
