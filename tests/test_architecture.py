"""The package layout holds (docs/architecture.md): few modules at the top of gputui/, no import
circle among gputui's modules, and Textual under gputui/ui/ alone.

Imports are read from the source (every `import` and `from ... import`, at module level and
inside functions), leaving out those under `if TYPE_CHECKING:`, which never run. A lazy import
inside a function still counts: it closes the same circle when it runs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator

PACKAGE = Path(__file__).resolve().parent.parent / "gputui"
# The top of gputui/: the package, `python -m gputui` and the command line. Everything else lives
# in a package that says what it is (model, config, runs, train, sources, cloud, cluster, sweep,
# monitor, jobs, dashboard, views, ui, commands). At most 8 modules may stand here.
TOP = {"__init__.py", "__main__.py", "cli.py", "report.py"}  # report: `from gputui import report` (docs/program.md)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import that can run: `if TYPE_CHECKING:` bodies are skipped (their `else:` is not)."""
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The gputui modules `name` imports (a `from pkg import mod` names the module mod)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            if node.level:  # a relative import, from the package this module is in
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
        out.update(t for t in targets if t in known and t != name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported(name, path, known) for name, path in found.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_at_most_the_listed_modules_stand_at_the_top_of_gputui() -> None:
    top = {p.name for p in PACKAGE.glob("*.py")}
    assert len(TOP) <= 8
    assert top - TOP == set(), "a module at the top of gputui/: give it the package that says what it is"


def test_no_import_circle_among_gputuis_modules() -> None:
    found = circles(graph())
    assert found == [], "import circles (move the shared names down, into a module both can import)"


def test_the_circle_finder_sees_a_lazy_circle_and_not_a_type_only_one() -> None:
    # The check itself: a circle closed by an import inside a function is one; an import under
    # `if TYPE_CHECKING:` closes none.
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    lazy = ast.parse("def f():\n    from gputui.b import x\n")
    typed = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gputui.b import x\n")
    assert [n.module for n in _imports(lazy) if isinstance(n, ast.ImportFrom)] == ["gputui.b"]
    assert [n.module for n in _imports(typed) if isinstance(n, ast.ImportFrom)] == ["typing"]


def test_textual_is_imported_under_gputui_ui_alone() -> None:
    ui = PACKAGE / "ui"
    outside = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if ui in path.parents:
            continue
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n == "textual" or n.startswith("textual.") for n in names):
                outside.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    assert outside == [], "Textual outside gputui/ui/: the headless packages draw nothing"
