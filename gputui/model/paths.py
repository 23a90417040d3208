"""Where gputui keeps its files: platformdirs' user data, cache and log directories.

`GPUTUI_HOME` overrides all three (data in it, `cache/` and `logs/` below it), so a test or a
second install keeps its own.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent  # gputui/ (this file is gputui/model/paths.py)
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
        private_dir(new)
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


# -- private files ---------------------------------------------------------------------------------
# Another account on the same machine must not read runs, the ledger, the sweeps' study (which
# holds the profile) or the logs. Two parts, one idea:
# - `private_umask` (the CLI's first act): everything the process and its children create is
#   0700/0600, whatever module or library creates it (torch's checkpoints, SQLite's -wal/-shm,
#   the workers' logs);
# - `private_dir` / `private_file` where gputui opens its stores, which also tighten what an
#   older gputui left 0755/0644, and keep them private for callers that never ran the CLI.
# Files the user asks for at a path of their own (CSV exports) take the user's umask: `user_opener`.

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_OPEN_BITS = 0o077  # group and other
_user_umask: int | None = None


def _current_umask() -> int:
    """This process's umask, read without changing it where Linux says it (/proc), else by a swap."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def private_umask() -> int:
    """Make what this process (and every child it starts) creates private to this account:
    umask 077 on top of the user's (kept for `user_umask`). Returns the umask it replaced."""
    global _user_umask
    mask = os.umask(0o077)
    if _user_umask is None:
        _user_umask = mask
    os.umask(mask | 0o077)
    return mask


def user_umask() -> int:
    """The umask the user started gputui with (the current one when gputui never changed it)."""
    return _user_umask if _user_umask is not None else _current_umask()


def homes() -> tuple[Path, ...]:
    """gputui's own directories: data, cache and logs."""
    return (data_home(), cache_home(), log_home())


def _inside(path: Path, home: Path) -> bool:
    try:
        Path(os.path.abspath(path)).relative_to(os.path.abspath(home))
        return True
    except ValueError:
        return False


def _tighten(path: Path, is_dir: bool) -> bool:
    """Drop group and other bits from `path` (our own, not a link); whether it had any. Never raises."""
    try:
        st = os.lstat(path)
        if (st.st_mode & _OPEN_BITS) == 0 or st.st_uid != os.geteuid() or stat.S_ISLNK(st.st_mode):
            return False
        os.chmod(path, (st.st_mode & 0o7777 & ~_OPEN_BITS) | (PRIVATE_DIR_MODE if is_dir else 0o600))
        return True
    except OSError as exc:
        logging.getLogger(__name__).debug("left the mode of %s as it was: %s", path, exc)
        return False


def _tighten_tree(top: Path) -> None:
    """Tighten everything below `top` (once: what an older gputui made 0755/0644); links are left alone."""
    for root, dirs, files in os.walk(top, followlinks=False):
        for name in dirs:
            _tighten(Path(root) / name, True)
        for name in files:
            _tighten(Path(root) / name, False)


def tighten_home(home: Path) -> None:
    """Make an existing gputui home 0700; a home that was open to others is tightened throughout."""
    if home.is_dir() and not home.is_symlink() and _tighten(home, True):
        _tighten_tree(home)


def tighten_homes() -> None:
    """The first use of gputui's homes in a process: tighten those that exist (cheap when private)."""
    for home in homes():
        tighten_home(home)


def private_dir(path: Path) -> Path:
    """`path` as a directory only this account can use: missing parts are made 0700, and the
    directory itself, with every directory between it and the gputui home it lies in, is
    tightened to 0700 (a home found open is tightened throughout). OSError when it cannot be made."""
    path = Path(os.path.abspath(path))
    missing: list[Path] = []
    probe = path
    while not probe.exists() and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    for part in reversed(missing):
        try:
            os.mkdir(part, PRIVATE_DIR_MODE)
        except FileExistsError:
            pass
        _tighten(part, True)  # a umask wider than 077 is narrowed by mkdir, never widened
    for home in (Path(os.path.abspath(h)) for h in homes()):
        if _inside(path, home):
            tighten_home(home)
            between = path
            while between != home and _inside(between, home):
                _tighten(between, True)
                between = between.parent
            break
    else:
        _tighten(path, True)
    return path


def private_file(path: Path) -> Path:
    """`path` as a file only this account can read (made empty when missing, else tightened to
    0600), in a `private_dir`. Made before a library opens it (SQLite gives its -wal, -shm and
    -journal files the database's mode). OSError when it cannot be made."""
    path = Path(path)
    private_dir(path.parent)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), PRIVATE_FILE_MODE))
    _tighten(path, False)
    return path


def private_opener(path: str, flags: int) -> int:
    """An `open(..., opener=)` for gputui's own files: created 0600, an existing one tightened."""
    fd = os.open(path, flags, PRIVATE_FILE_MODE)
    try:
        st = os.fstat(fd)
        if st.st_mode & _OPEN_BITS and st.st_uid == os.geteuid():
            os.fchmod(fd, st.st_mode & 0o7777 & ~_OPEN_BITS)
    except OSError:
        pass
    return fd


def user_opener(path: str, flags: int) -> int:
    """An `open(..., opener=)` for a file the user asked for (a CSV export): a new file takes the
    mode the user's own umask gives (gputui runs under 077), private when it lies in gputui's
    homes; an existing file keeps its mode."""
    if not flags & os.O_CREAT:
        return os.open(path, flags)
    try:
        fd = os.open(path, flags | os.O_EXCL, 0o666)
    except FileExistsError:
        return os.open(path, flags, 0o666)
    inside = any(_inside(Path(path), home) for home in homes())
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE if inside else 0o666 & ~user_umask())
    except OSError:
        pass
    return fd


def private_db(path: Path) -> Path:
    """A SQLite database file made or tightened by `private_file`, with the -wal, -shm and
    -journal files an older gputui left beside it (new ones take the database's mode)."""
    private_file(path)
    for suffix in ("-wal", "-shm", "-journal"):
        _tighten(path.with_name(path.name + suffix), False)
    return path
