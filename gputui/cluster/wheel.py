"""This version of gputui as a wheel, built locally and cached by the hash of its sources.

The package directory (and the project's pyproject.toml when running from a source tree) is
copied to a temporary directory and built there with `pip wheel --no-deps
--no-build-isolation`, so concurrent builds never share a build/ folder and no index is
needed. Installed copies of gputui get a minimal pyproject.toml written for them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from gputui import __version__
from gputui.model.errors import GputuiError, UserError
from gputui.model.paths import PACKAGE_DIR, REPO_DIR, cache_home, data_home, moved_once

_SKIP_DIRS = {"__pycache__"}
_MINIMAL_PYPROJECT = f"""[build-system]
requires = ["setuptools>=64"]
build-backend = "setuptools.build_meta"

[project]
name = "gputui"
version = "{__version__}"
requires-python = ">=3.10"

[project.scripts]
gputui = "gputui.cli:main"

[tool.setuptools.packages.find]
include = ["gputui*"]
"""


@dataclass(frozen=True)
class Wheel:
    path: Path
    source_hash: str  # 16 hex digits of the sources' sha256

    @property
    def name(self) -> str:
        return self.path.name


def _package_files() -> list[Path]:
    files = []
    for root, dirs, names in os.walk(PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        files += [Path(root) / n for n in sorted(names) if not n.endswith((".pyc", ".pyo"))]
    return files


def _pyproject() -> str:
    path = REPO_DIR / "pyproject.toml"
    if path.is_file() and 'name = "gputui"' in path.read_text(encoding="utf-8"):
        return path.read_text(encoding="utf-8")
    return _MINIMAL_PYPROJECT


def source_hash() -> str:
    """The sha256 (16 hex digits) of the package's files and the build recipe."""
    digest = hashlib.sha256(_pyproject().encode())
    for path in _package_files():
        digest.update(str(path.relative_to(PACKAGE_DIR)).encode() + b"\0")
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def given_wheel(path: Path) -> Wheel:
    """A wheel named by `GPUTUI_WHEEL` (e.g. one built by CI), identified by its own hash."""
    if not path.is_file() or not path.name.startswith("gputui-") or path.suffix != ".whl":
        raise UserError(f"GPUTUI_WHEEL={path}: not a gputui wheel file (gputui-VERSION-....whl)")
    return Wheel(path, hashlib.sha256(path.read_bytes()).hexdigest()[:16])


def build_wheel(cache: Path | None = None) -> Wheel:
    """The wheel of the running gputui, built once per source hash (or `GPUTUI_WHEEL`'s)."""
    if os.environ.get("GPUTUI_WHEEL"):
        return given_wheel(Path(os.environ["GPUTUI_WHEEL"]).expanduser())
    digest = source_hash()
    folder = (cache or moved_once(data_home() / "wheels", cache_home() / "wheels")) / digest
    found = sorted(folder.glob("gputui-*.whl")) if folder.is_dir() else []
    if found:
        return Wheel(found[0], digest)
    with tempfile.TemporaryDirectory(prefix="gputui-wheel-") as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(PACKAGE_DIR, src / "gputui", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (src / "pyproject.toml").write_text(_pyproject(), encoding="utf-8")
        readme = REPO_DIR / "README.md"
        (src / "README.md").write_text(readme.read_text(encoding="utf-8") if readme.is_file() else "gputui\n",
                                       encoding="utf-8")
        out = Path(tmp) / "out"
        done = subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
             "--disable-pip-version-check", "-q", "-w", str(out), str(src)],
            capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600,
        )
        built = sorted(out.glob("gputui-*.whl"))
        if done.returncode != 0 or not built:
            last = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()] or ["no output"]
            raise GputuiError(f"cannot build the gputui wheel for the slaves (pip wheel exit {done.returncode}): "
                              f"{last[-1][:200]}; is setuptools installed here?")
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / built[0].name
        shutil.copy2(built[0], folder / (built[0].name + ".part"))
        os.replace(folder / (built[0].name + ".part"), target)
    return Wheel(target, digest)
