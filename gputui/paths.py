"""Where gputui keeps its files: platformdirs' user data, cache and log directories.

`GPUTUI_HOME` overrides all three (data in it, `cache/` and `logs/` below it), so a test or a
second install keeps its own.
"""

from __future__ import annotations

import logging
import os
import shutil
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


def cache_home() -> Path:
    """The user cache directory (the slaves' wheel, fetched prices); `GPUTUI_HOME/cache` when set."""
    env = os.environ.get("GPUTUI_HOME")
    if env:
        return Path(env).expanduser() / "cache"
    import platformdirs

    return Path(platformdirs.user_cache_dir("gputui", appauthor=False))


def log_home() -> Path:
    """The user log directory (the budget guards' logs); `GPUTUI_HOME/logs` when set."""
    env = os.environ.get("GPUTUI_HOME")
    if env:
        return Path(env).expanduser() / "logs"
    import platformdirs

    return Path(platformdirs.user_log_dir("gputui", appauthor=False))


def moved_once(old: Path, new: Path) -> Path:
    """`new`, after moving into it what an older gputui kept in the directory `old`.

    A one-time move: once `old` is gone there is nothing to do. It never raises; an entry that
    cannot be moved (or whose name `new` already has) stays in `old`, which is removed only when
    empty. Lock files move only by rename (same inode), so a running holder keeps its lock.
    """
    try:
        if old == new or not old.is_dir():
            return new
        new.mkdir(parents=True, exist_ok=True)
        for entry in sorted(old.iterdir()):
            dest = new / entry.name
            if dest.exists() or dest.is_symlink():
                continue
            try:
                os.replace(entry, dest)
            except OSError:
                if entry.suffix == ".lock":
                    continue
                try:
                    shutil.move(str(entry), str(dest))  # another filesystem: copy, then delete
                except (OSError, shutil.Error) as exc:
                    logging.getLogger(__name__).debug("left %s where it was: %s", entry, exc)
        old.rmdir()
    except OSError as exc:
        logging.getLogger(__name__).debug("left %s where it was: %s", old, exc)
    return new


def runs_home() -> Path:
    """The default parent directory of run directories."""
    return data_home() / "runs"


def bundled_mnist() -> Path:
    """The MNIST copy that ships in the source tree (assets/mnist)."""
    return REPO_DIR / "assets" / "mnist"


def profiles_dir() -> Path:
    """The profiles that ship in the source tree."""
    return REPO_DIR / "profiles"
