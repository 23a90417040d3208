"""Where gputui keeps its files. `GPUTUI_HOME` overrides the user data directory."""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_DIR = PACKAGE_DIR.parent


def data_home() -> Path:
    """The user data directory (runs, ledger); `GPUTUI_HOME` overrides it."""
    env = os.environ.get("GPUTUI_HOME")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("gputui", appauthor=False))


def runs_home() -> Path:
    """The default parent directory of run directories."""
    return data_home() / "runs"


def bundled_mnist() -> Path:
    """The MNIST copy that ships in the source tree (assets/mnist)."""
    return REPO_DIR / "assets" / "mnist"


def profiles_dir() -> Path:
    """The profiles that ship in the source tree."""
    return REPO_DIR / "profiles"
