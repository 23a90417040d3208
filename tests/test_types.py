"""The type check: `mypy gputui` in the default mode, with pyproject's [tool.mypy], is clean.

It checks what the tests cannot reach: the code for Python 3.10 (`python_version`), the
scheduler's seams (an optuna.Study is a SweepStudy, every sweep view is a SweepView) and the
Optional values that a rare path hands on. The cache is kept out of the checkout.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.integration
def test_mypy_finds_no_error_in_gputui(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "mypy", "gputui", "--cache-dir", str(tmp_path / "mypy-cache")],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, f"mypy gputui (exit {done.returncode}):\n{done.stdout}{done.stderr}"
