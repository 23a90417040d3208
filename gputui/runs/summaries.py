"""A run's summary, folded from its events file line by line and cached beside it.

`gputui runs` and the dashboard's runs screen list every run: reading each run's whole events
file for that (a million steps is 141 MB) cost seconds and a gigabyte per long run. Here the
file is streamed once (gputui.runs.store.EventLines: bounded chunks and lines, bytes that are not
UTF-8 replaced), what a listing needs is folded into a `Digest`, and the digest is written to
`summary.json` in the run directory (atomically, 0600), keyed by the events file's size and
modification time. A later listing of a run that has not changed reads only that file; a run
that has grown since (it is still going) is folded on from where the last one stopped.

A run of the user's own program (its start event has `program`) is folded too: its command, its
objective (a metric name, with the direction that makes it better) and that metric's last and
best value from the `metrics` events (rank 0's, or a report without a rank), and the last epoch
it reported. Every metrics line is parsed (a best value needs them all; gputui writes at most
50 a second).

Everything in an events file or a summary.json is data: numbers go through
`gputui.model.events.typed`, a summary.json that is not what this module writes is ignored.
"""

from __future__ import annotations

import json
import os
import secrets
from collections import deque
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterable, Mapping

from gputui.runs import store as runs
from gputui.model.events import ENDS, typed
from gputui.model.outside import finite as _num  # the one helper for a number read from a file

SUMMARY = "summary.json"
FORMAT = 2  # 2: the program run's fields (a format-1 file is folded again)
_CHECK_BYTES = 64  # the bytes before the cached offset, kept to tell a grown file from a rewritten one
_EVAL_KINDS = ("eval", "epoch", "done")
DIRECTIONS = ("maximize", "minimize")  # [run] direction; an objective is maximized unless told otherwise


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


@dataclass
class Digest:
    """What a listing needs of a run's events, folded one event at a time (None: not known)."""

    events: int = 0  # the events folded (of a stretch of steps in a file, the last: see fold_lines)
    started: float | None = None  # the first start's time
    has_start: bool = False
    model: str | None = None  # these five: the latest start's (a resume may change them)
    device: str | None = None
    strategy: str | None = None
    world_size: int | None = None
    epochs: int | None = None
    epochs_done: int = 0  # the highest epoch event's epoch
    best_acc: float | None = None  # the highest test_acc of an eval, epoch or done event
    final_acc: float | None = None  # the last one
    done_best: float | None = None  # the last done event's best_acc
    train_s: float | None = None  # the last elapsed_s
    last_kind: str | None = None  # the last start or end (done, interrupted, error) event: the run's last word
    last_text: str | None = None  # the interruption's reason, the error's message
    done_epochs: int | None = None  # the last word's epochs, when it is done
    last_time: float | None = None  # the last event's time
    # A run of the user's own program (None for the built-in nets):
    program: str | None = None  # the latest start's command, as one string
    objective: str | None = None  # the metric it is judged by ([run] objective), when one is named
    direction: str | None = None  # "maximize" or "minimize"
    objective_last: float | None = None  # that metric's last value
    objective_best: float | None = None  # and its best, in `direction`
    program_epoch: int | None = None  # the last epoch a metrics event named
    git_commit: str | None = None  # the latest start's code (gputui.runs.provenance)
    git_dirty: bool | None = None  # and whether its tracked files had uncommitted changes

    def fold(self, raw: Mapping[str, Any]) -> None:
        """Take one more event (read from a file: data)."""
        event = typed(raw)
        kind = event.get("event")
        self.events += 1
        if kind == "start":
            if not self.has_start:
                self.has_start, self.started = True, _num(event.get("time"))
            self.model, self.device = _str(event.get("model")), _str(event.get("device"))
            self.strategy = _str(event.get("strategy"))
            self.world_size, self.epochs = _int(event.get("world_size")), _int(event.get("epochs"))
            self._program(event)
        elif kind == "metrics":
            self._metrics(event)
        elif kind == "epoch":
            self.epochs_done = max(self.epochs_done, _int(event.get("epoch")) or 0)
        if kind in _EVAL_KINDS:
            acc = event.get("test_acc")
            if acc is not None:
                self.final_acc = acc
                self.best_acc = acc if self.best_acc is None else max(self.best_acc, acc)
            if kind == "done":
                self.done_best = event.get("best_acc")
        elapsed = event.get("elapsed_s")
        if elapsed is not None:
            self.train_s = elapsed
        if kind in ENDS or kind == "start":
            self.last_kind = kind
            self.last_text = _str(event.get("reason" if kind == "interrupted" else "message"))
            self.done_epochs = _int(event.get("epochs")) if kind == "done" else None
        self.last_time = _num(event.get("time"))

    def _program(self, start: Mapping[str, Any]) -> None:
        """A start event's program fields (a built-in net's start clears them)."""
        self.program = _str(start.get("program"))
        objective = _str(start.get("objective")) if self.program is not None else None
        if objective != self.objective:  # a resume names the same one; another is another measure
            self.objective_last = self.objective_best = None
        self.objective = objective
        direction = _str(start.get("direction"))
        self.direction = None if self.program is None else direction if direction in DIRECTIONS else DIRECTIONS[0]
        if self.program is None:
            self.program_epoch = None
        commit = _str(start.get("git_commit")) if self.program is not None else None
        dirty = start.get("git_dirty") if commit is not None else None
        self.git_commit, self.git_dirty = commit, dirty if isinstance(dirty, bool) else None

    def _metrics(self, event: Mapping[str, Any]) -> None:
        rank = event.get("rank")
        if rank not in (None, 0):  # another rank's own numbers (all_ranks=True): not the run's
            return
        epoch = _int(event.get("epoch"))
        if epoch is not None:
            self.program_epoch = epoch
        if self.objective is None:
            return
        value = _num(event.get("values", {}).get(self.objective))
        if value is None:
            return
        self.objective_last = value
        best = self.objective_best
        if best is None or (value < best if self.direction == "minimize" else value > best):
            self.objective_best = value

    def fold_all(self, events: Iterable[Any]) -> "Digest":
        for event in events:
            if isinstance(event, dict):
                self.fold(event)
        return self

    @property
    def best(self) -> float | None:
        """The best accuracy: of the evaluations, and the done event's own best."""
        if self.done_best is None:
            return self.best_acc
        return self.done_best if self.best_acc is None else max(self.best_acc, self.done_best)

    @property
    def unfinished(self) -> bool:
        """Whether the run has said no last word since it (last) started."""
        return self.last_kind in (None, "start")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> "Digest | None":
        """A digest as to_json wrote it, or None for anything else (a summary.json is data)."""
        if not isinstance(data, dict) or set(data) != {f.name for f in fields(cls)}:
            return None
        digest = cls(**data)
        checks = (
            isinstance(digest.events, int) and isinstance(digest.epochs_done, int) and isinstance(digest.has_start, bool),
            all(getattr(digest, name) is None or _str(getattr(digest, name)) is not None
                for name in ("model", "device", "strategy", "last_kind", "last_text", "program", "objective",
                             "git_commit")),
            digest.git_dirty is None or isinstance(digest.git_dirty, bool),
            digest.direction is None or digest.direction in DIRECTIONS,
            all(getattr(digest, name) is None or _int(getattr(digest, name)) is not None
                for name in ("world_size", "epochs", "done_epochs", "program_epoch")),
            all(getattr(digest, name) is None or _num(getattr(digest, name)) is not None
                for name in ("started", "best_acc", "final_acc", "done_best", "train_s", "last_time",
                             "objective_last", "objective_best")),
        )
        return digest if all(checks) else None


def of_events(events: Iterable[Any]) -> Digest:
    """The digest of events given (not read from a file, not cached)."""
    return Digest().fold_all(events)


# -- the cache -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Cached:
    size: int  # the events file's, when this was written
    mtime_ns: int
    offset: int  # the byte after the last complete line folded into `digest`
    check: str  # hex of the bytes just before `offset`
    digest: Digest  # the complete lines up to `offset`
    whole: Digest  # and a last line without its newline, if it was an event


def read(run: runs.RunDir) -> Digest:
    """The run's digest: from its summary.json when its events file has not changed since, folded
    on from the cached offset when the file has only grown, else streamed from its start. The
    summary.json is brought up to date (a run directory that cannot be written just goes
    without)."""
    try:
        stat = run.events.stat()
    except OSError:
        return Digest()  # no events yet
    cached = _load(run.path / SUMMARY)
    if cached is not None and (cached.size, cached.mtime_ns) == (stat.st_size, stat.st_mtime_ns):
        return replace(cached.whole)
    start, digest = 0, Digest()
    if cached is not None and cached.offset <= stat.st_size and _check(run.events, cached.offset) == cached.check:
        start, digest = cached.offset, replace(cached.digest)
    lines = runs.EventLines(run.events, start, end=stat.st_size)
    try:
        fold_lines(digest, lines)
    except OSError:
        return digest  # gone or unreadable meanwhile: what was read, not cached
    whole = digest
    last = runs.parse_event(lines.tail) if lines.tail else None
    if last is not None:
        whole = replace(digest)
        whole.fold(last)
    _store(run.path / SUMMARY, _Cached(stat.st_size, stat.st_mtime_ns, lines.offset, _check(run.events, lines.offset) or "",
                                       digest, whole))
    return replace(whole)


STEP_PREFIX = b'{"event": "step", '  # how gputui.runs.store.encode starts a step event's line
_STRETCH_KEPT = 16  # step lines kept of a stretch, newest first, to find its last whole event


def fold_lines(digest: Digest, lines: Iterable[bytes]) -> None:
    """Fold the events of `lines` (an events file's) into `digest`. A step event changes only
    the training time and the last event's time, so of a stretch of step lines (a million in a
    long run) only the last that parses is parsed and folded: a listing streams a long run's
    file at the cost of splitting it, not of parsing every line as JSON."""
    stretch: deque[bytes] = deque(maxlen=_STRETCH_KEPT)
    for line in lines:
        if line.startswith(STEP_PREFIX):
            stretch.append(line)
            continue
        if stretch:
            _fold_stretch(digest, stretch)
        event = runs.parse_event(line)
        if event is not None:
            digest.fold(event)
    if stretch:
        _fold_stretch(digest, stretch)


def _fold_stretch(digest: Digest, stretch: deque[bytes]) -> None:
    while stretch:
        event = runs.parse_event(stretch.pop())
        if event is not None:
            digest.fold(event)
            break
    stretch.clear()


def _check(path: Path, offset: int) -> str | None:
    """Hex of the bytes before `offset` in `path` (None if they cannot be read)."""
    begin = max(0, offset - _CHECK_BYTES)
    try:
        with open(path, "rb") as fh:
            fh.seek(begin)
            data = fh.read(offset - begin)
    except OSError:
        return None
    return data.hex() if len(data) == offset - begin else None


def _load(path: Path) -> _Cached | None:
    try:
        with open(path, "rb") as fh:
            data = json.loads(fh.read(1 << 16))  # a summary is a few hundred bytes
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        return None
    size, mtime_ns, offset = (_int(data.get(k)) for k in ("size", "mtime_ns", "offset"))
    digest, whole = Digest.from_json(data.get("digest")), Digest.from_json(data.get("whole"))
    if size is None or mtime_ns is None or offset is None or min(size, mtime_ns, offset) < 0 \
            or not isinstance(data.get("check"), str) or digest is None or whole is None:
        return None
    return _Cached(size, mtime_ns, offset, data["check"], digest, whole)


def _store(path: Path, cached: _Cached) -> None:
    """Write the summary atomically (a reader sees the old file or the new), private to this user."""
    doc = {"format": FORMAT, "size": cached.size, "mtime_ns": cached.mtime_ns, "offset": cached.offset,
           "check": cached.check, "digest": cached.digest.to_json(), "whole": cached.whole.to_json()}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh)
        os.replace(tmp, path)
    except (OSError, ValueError):
        try:
            tmp.unlink()
        except OSError:
            pass
