"""Run directories: one per run, holding profile.toml, events.jsonl and ckpt.pt."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from gputui.errors import GputuiError, UserError
from gputui.paths import runs_home

PROFILE = "profile.toml"
EVENTS = "events.jsonl"
CHECKPOINT = "ckpt.pt"


@dataclass(frozen=True)
class RunDir:
    """A run's directory and id (the directory's name)."""

    path: Path

    @property
    def run_id(self) -> str:
        return self.path.name

    @property
    def profile(self) -> Path:
        return self.path / PROFILE

    @property
    def events(self) -> Path:
        return self.path / EVENTS

    @property
    def checkpoint(self) -> Path:
        return self.path / CHECKPOINT


def new_run_id() -> str:
    """A sortable, unique id: local date and time plus four random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def create(run_dir: Path | None) -> RunDir:
    """Make a fresh run directory (under the default location unless one is given)."""
    path = Path(run_dir).expanduser() if run_dir is not None else runs_home() / new_run_id()
    if (path / EVENTS).exists() or (path / CHECKPOINT).exists():
        raise UserError(f"{path}: already holds a run; resume it with --resume {path} or pick another --run-dir")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create run directory {path}: {exc.strerror or exc}") from None
    return RunDir(path)


def find(ref: str) -> RunDir:
    """The run named by `ref`: 'last', a run id in the default location, or a run directory."""
    home = runs_home()
    if ref == "last":
        runs = sorted((p for p in _run_dirs(home)), key=lambda p: (p.name, p.stat().st_mtime))
        if not runs:
            raise UserError(f"--resume last: no runs in {home} yet; start one with `gputui run`")
        return RunDir(runs[-1])
    candidate = Path(ref).expanduser()
    for path in (home / ref, candidate):
        if (path / PROFILE).is_file():
            return RunDir(path)
    raise UserError(f"--resume {ref}: no such run (not a run id in {home}, nor a run directory)")


def _run_dirs(home: Path) -> Iterator[Path]:
    if not home.is_dir():
        return iter(())
    return (p for p in home.iterdir() if (p / PROFILE).is_file())


class EventLog:
    """Appends events to events.jsonl, one JSON object per line, flushed each time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise GputuiError(f"cannot write {path}: {exc.strerror or exc}") from None

    def write(self, line: str) -> None:
        try:
            self._fh.write(line + "\n")
            self._fh.flush()
        except OSError as exc:
            raise GputuiError(f"cannot write {self.path}: {exc.strerror or exc}; free space and --resume") from None

    def sync(self) -> None:
        try:
            os.fsync(self._fh.fileno())
        except OSError:
            pass

    def close(self) -> None:
        self._fh.close()


def encode(event: dict[str, Any]) -> str:
    """The one-line JSON form of an event."""
    return json.dumps(event, separators=(", ", ": "), allow_nan=False)


def read_events(path: Path) -> list[dict[str, Any]]:
    """All complete events of a run (a torn last line is ignored)."""
    out = []
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out
