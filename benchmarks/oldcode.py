"""One module of gputui as an older commit had it, loaded beside this tree's, for benchmarks
that compare old and new in one process (interleaved)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def module_at(rev: str, path: str, folder: Path) -> Any:
    """`path` (e.g. "gputui/jobs/program.py") at commit `rev`, imported as `old_<its name>` from
    a copy written into `folder`."""
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{path}"], check=True, capture_output=True,
                            text=True).stdout
    name = "old_" + Path(path).stem
    copy = folder / f"{name}.py"
    copy.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, copy)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
