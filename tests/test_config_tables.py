"""Every profile table is declared once, in gputui/config/, and nothing there imports upward.

Each table is a dataclass whose fields carry their schema; its `Section` is generated from it.
These tests fail when a second declaration appears (a `Field(`/`Section(` outside gputui/config/,
a dataclass elsewhere repeating a table's keys) or when gputui/config imports back up.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

from gputui.config.profile import DECLARED_BY, PROFILE_SECTIONS
from gputui.config.recipes import Recipe
from gputui.config.run import RunConfig, RunSettings
from gputui.config.schema import keys_of
from gputui.config.sweep import SPACE_KEYS, SweepSpec

PACKAGE = Path(__file__).resolve().parents[1] / "gputui"
CONFIG = PACKAGE / "config"
# What gputui/config may import of gputui besides itself: the ground floor.
GROUND = ("gputui.model.errors", "gputui.model")


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _imports(path: Path) -> set[str]:
    """The gputui modules `path` imports at run time (lazy imports in functions included,
    `if TYPE_CHECKING:` blocks left out)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if _is_type_checking(node):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gputui"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gputui"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names
                         if (PACKAGE.parent / f"{node.module}.{a.name}".replace(".", "/")).with_suffix(".py").exists())
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def test_every_table_has_one_declaring_dataclass_whose_keys_are_its_section() -> None:
    assert list(DECLARED_BY) == list(PROFILE_SECTIONS)
    for name, cls in DECLARED_BY.items():
        assert set(PROFILE_SECTIONS[name].fields) == set(keys_of(cls)), name
        assert all(spec.doc for spec in PROFILE_SECTIONS[name].fields.values()), name


def test_run_settings_are_run_configs_keys_each_optional() -> None:
    assert [f.name for f in fields(RunSettings)] == [f.name for f in fields(RunConfig)] == list(keys_of(RunConfig))
    assert all(f.default is None for f in fields(RunSettings))
    assert RunSettings() == RunSettings(**{f.name: None for f in fields(RunConfig)})


def test_a_recipe_holds_run_keys_only() -> None:
    assert {f.name for f in fields(Recipe)} - {"summary"} <= set(keys_of(RunConfig))


def test_the_sweep_space_keys_are_the_searchable_ones() -> None:
    space = next(f for f in fields(SweepSpec) if f.name == "space")
    assert list(keys_of(SweepSpec)) and set(SPACE_KEYS) <= set(keys_of(SweepSpec))
    assert space.default is MISSING


def test_schema_fields_and_sections_are_made_only_under_gputui_config() -> None:
    makers = {"Field", "Section", "key", "section_of"}
    outside = []
    for path in _modules(PACKAGE):
        if CONFIG in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
                if name in makers:
                    outside.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {name}(")
            elif isinstance(node, ast.ImportFrom) and node.module == "gputui.config.schema":
                outside += [f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: imports {a.name}"
                            for a in node.names if a.name in makers]
    assert outside == [], "profile keys are declared in gputui/config/ only"


def test_no_dataclass_outside_config_repeats_a_tables_keys() -> None:
    tables = {name: set(keys_of(cls)) for name, cls in DECLARED_BY.items()}
    copies = []
    for path in _modules(PACKAGE):
        if CONFIG in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef):
                continue
            names = {s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
            for table, keys in tables.items():
                common = names & keys
                if len(common) >= 3 and len(common) > len(keys) / 2:
                    copies.append(f"{path.relative_to(PACKAGE.parent)}: {node.name} repeats [{table}]: {sorted(common)}")
    assert copies == []


def test_config_imports_only_itself_and_the_ground_floor_and_has_no_circle() -> None:
    graph = {_module_name(p): _imports(p) for p in _modules(CONFIG)}
    upward = {m: sorted(i for i in deps if not i.startswith(("gputui.config",) + GROUND))
              for m, deps in graph.items()}
    assert {m: deps for m, deps in upward.items() if deps} == {}
    # the table modules never import the registry back
    assert [m for m, deps in graph.items() if "gputui.config.profile" in deps] == []
    # and the config modules import one another one way
    done: set[str] = set()

    def walk(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, " -> ".join(path + (module,))
        if module in done:
            return
        for dep in graph.get(module, ()):
            walk(dep, path + (module,))
        done.add(module)

    for module in graph:
        walk(module, ())


@pytest.mark.parametrize("module", [_module_name(p) for p in _modules(CONFIG)])
def test_a_config_module_imported_alone_loads_no_module_above_the_ground_floor(module: str) -> None:
    code = (f"import json, sys; import {module}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('gputui'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout)
    above = [m for m in loaded if m != "gputui" and not m.startswith(("gputui.config",) + GROUND)]
    assert above == []
    if module != "gputui.config.profile":
        assert "gputui.config.profile" not in loaded
