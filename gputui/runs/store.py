"""Run directories: one per run, holding profile.toml, events.jsonl and ckpt.pt, and while the
run goes on, run.pid (which process it is, so any dashboard can find, follow and stop it)."""

from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from gputui.model.errors import GputuiError, UserError
from gputui.model import outside
from gputui.model.paths import private_dir, private_opener, runs_home
from gputui.model.pids import process_alive, process_start

PROFILE = "profile.toml"
EVENTS = "events.jsonl"
CHECKPOINT = "ckpt.pt"
# The networks gputui trains checkpoint in well under a megabyte; a file far larger than any of
# them is not one: refused before it is read (gputui.train.checkpoint) and never copied past it
# from a slave or a sweep host (gputui.cluster.sshnode.get counts the bytes as they come).
MAX_CHECKPOINT = 64 << 20
PIDFILE = "run.pid"  # line 1 the pid, line 2 its start time (/proc ticks), line 3 the profile it was started from
STDERR = "stderr.log"  # a run started by the dashboard writes its stderr here (it may outlive the dashboard)
# A run of the user's own program (gputui.jobs.program):
OUTPUT = "output.log"  # the program's stdout and stderr, unchanged (in the order written, but for `> out.txt`)
CHECKPOINTS = "checkpoints"  # GPUTUI_CHECKPOINT_DIR: the program's checkpoints (kept for --resume)


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

    @property
    def pidfile(self) -> Path:
        return self.path / PIDFILE


# -- which process a run is ------------------------------------------------------------------------

@dataclass(frozen=True)
class RunProcess:
    """What run.pid says: the run's process, and the profile it was started from (if known)."""

    pid: int
    start: str | None
    profile: str | None


def write_pid(run: RunDir, pid: int, profile: Path | str | None = None) -> None:
    """Record that `pid` is the run's process (atomically: a reader sees the old file or the new).
    A profile already recorded for the same process is kept when none is given."""
    if profile is None:
        known = read_pid(run)
        profile = known.profile if known is not None and known.pid == pid else None
    text = f"{pid}\n{process_start(pid) or ''}\n{profile or ''}\n"
    tmp = run.path / f".{PIDFILE}.{os.getpid()}"
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, run.pidfile)
    except OSError:
        pass  # a run that cannot say its pid still trains; dashboards then cannot attach to it


def read_pid(run: RunDir) -> RunProcess | None:
    try:
        lines = run.pidfile.read_text(encoding="utf-8").splitlines()
        pid = int(lines[0])
    except (OSError, ValueError, IndexError, UnicodeDecodeError):
        return None
    if pid <= 0:
        return None
    start = lines[1].strip() if len(lines) > 1 and lines[1].strip() else None
    profile = lines[2].strip() if len(lines) > 2 and lines[2].strip() else None
    return RunProcess(pid, start, profile)


def clear_pid(run: RunDir, pid: int) -> None:
    """Remove run.pid if it still names `pid` (a resume may have taken the run over since)."""
    known = read_pid(run)
    if known is not None and known.pid == pid:
        try:
            run.pidfile.unlink()
        except OSError:
            pass


def live_process(run: RunDir) -> RunProcess | None:
    """The run's process if it is alive (and is the one that wrote run.pid, not a later process
    with the same pid), else None."""
    known = read_pid(run)
    if known is None or not process_alive(known.pid):
        return None
    if known.start is not None:
        now = process_start(known.pid)
        if now is not None and now != known.start:
            return None
    return known


def live_runs(home: Path) -> list[RunDir]:
    """The runs under `home` whose process is alive, newest first."""
    try:
        found = [RunDir(p) for p in home.iterdir() if (p / PIDFILE).is_file()] if home.is_dir() else []
    except OSError:
        found = []
    return sorted((r for r in found if live_process(r) is not None), key=lambda r: r.run_id, reverse=True)


def new_run_id() -> str:
    """A sortable, unique id: local date and time plus four random hex digits."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def create(run_dir: Path | None) -> RunDir:
    """Make a fresh run directory (under the default location unless one is given)."""
    path = Path(run_dir).expanduser() if run_dir is not None else runs_home() / new_run_id()
    if (path / EVENTS).exists() or (path / CHECKPOINT).exists():
        raise UserError(f"{path}: already holds a run; resume it with --resume {path} or pick another --run-dir")
    try:
        private_dir(path)  # 0700: its profile, events and checkpoint are this account's alone
    except OSError as exc:
        raise UserError(f"cannot create run directory {path}: {exc.strerror or exc}") from None
    return RunDir(path)


def find(ref: str, home: Path | None = None, flag: str = "--resume") -> RunDir:
    """The run named by `ref`, the one resolver every command and the dashboard use:
    - `last`: the run written to most recently (its events.jsonl, else its profile.toml), so a
      run resumed after a newer one started is `last` again;
    - a run id under `home` (default: the runs home);
    - a run directory (one holding profile.toml or events.jsonl).
    `flag` names the option in the one-line error (`--resume`, `--run`, `runs export`)."""
    home = runs_home() if home is None else home
    if ref == "last":
        newest = max(((written(p), p.name, p) for p in run_dirs(home)), default=None)
        if newest is None:
            raise UserError(f"{flag} last: no runs in {home} yet; start one with `gputui run`")
        return RunDir(newest[2])
    for path in (home / ref, Path(ref).expanduser()):
        if (path / PROFILE).is_file() or (path / EVENTS).is_file():
            return RunDir(path)
    raise UserError(f"{flag} {ref}: no such run (not a run id in {home}, nor a run directory); "
                    "`gputui runs` lists them")


def written(path: Path) -> float:
    """When the run in `path` was last written: its events, else its profile (0 when neither can be read)."""
    for name in (EVENTS, PROFILE):
        try:
            return (path / name).stat().st_mtime
        except OSError:
            continue
    return 0.0


def run_dirs(home: Path) -> Iterator[Path]:
    """The run directories directly under `home` (those holding a profile.toml)."""
    try:
        entries = list(home.iterdir()) if home.is_dir() else []
    except OSError:
        entries = []
    return (p for p in entries if (p / PROFILE).is_file())


def written_files(paths: Iterable[Path]) -> set[Path] | None:
    """Which of `paths` some process on this machine has open for writing (an event log while
    its run goes on); None where that cannot be known (no Linux /proc). Only the user's own
    processes can be seen, which is where their runs are."""
    proc = Path("/proc")
    if not (proc / "self" / "fdinfo").is_dir():
        return None
    wanted: dict[str, Path] = {}
    for path in paths:
        wanted[os.path.realpath(path)] = path
    found: set[Path] = set()
    if not wanted:
        return found
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:  # gone, or another user's
            continue
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target in wanted and _writable(f"/proc/{entry.name}/fdinfo/{fd}"):
                found.add(wanted[target])
    return found


def _writable(fdinfo: str) -> bool:
    """Whether the descriptor described by `fdinfo` was opened for writing (a reader such as
    `tail -f` or the dashboard does not keep a run alive)."""
    try:
        with open(fdinfo, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("flags:"):
                    return (int(line.split()[1], 8) & os.O_ACCMODE) in (os.O_WRONLY, os.O_RDWR)
    except (OSError, ValueError, IndexError):
        pass
    return False


class EventLog:
    """Appends events to events.jsonl, one JSON object per line, flushed each time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh = open(path, "a", encoding="utf-8", opener=private_opener)
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
    """All complete events of a run (a torn last line is ignored), through the one streamed
    reader (iter_events: bounded lines, bad bytes replaced, hostile lines refused)."""
    return list(iter_events(path))


MAX_EVENT_LINE = 1 << 20  # an event line is a few hundred bytes; past this it is not one of ours
READ_CHUNK = 1 << 20  # what a streaming read of an events file takes at a time


class EventLines:
    """The lines of an events file from byte `start` to `end` (default: its end now), read
    `chunk` bytes at a time: never the whole file at once, however long the run was. A line
    longer than `max_line` is dropped (counted in `dropped`).

    Iterating yields the complete lines (those ended by a newline); after it, `offset` is the
    byte after the last of them (where a later read goes on) and `tail` the bytes after it: a
    line still being written, or a last line written without its newline (b"" if none)."""

    def __init__(self, path: Path, start: int = 0, end: int | None = None, max_line: int = MAX_EVENT_LINE,
                 chunk: int = READ_CHUNK) -> None:
        self.path, self.start, self.end, self.chunk = path, start, end, chunk
        self.max_line = max_line
        self.offset = start
        self.tail = b""
        self.dropped = 0
        self.read_bytes = 0  # bytes read from the file (an instrument for the tests and benchmarks)

    def __iter__(self) -> Iterator[bytes]:
        from gputui.model.lines import LineSplitter

        lines = LineSplitter(self.max_line)
        self.offset, self.tail = self.start, b""
        with open(self.path, "rb") as fh:
            fh.seek(self.start)
            left = -1 if self.end is None else max(0, self.end - self.start)
            while left != 0:
                data = fh.read(self.chunk if left < 0 else min(self.chunk, left))
                if not data:
                    break
                left = left - len(data) if left > 0 else left
                self.read_bytes += len(data)
                yield from lines.feed(data)
                self.offset = self.start + lines.line_start
        self.dropped = lines.cut
        self.tail = lines.finish() or b""


def parse_event(line: bytes) -> dict[str, Any] | None:
    """One line of an events file as an event, or None for a line that is not one JSON object
    (torn by a crash, not ours, or hostile: gputui.model.outside, the one parser of outside
    lines). Bytes that are not UTF-8 are replaced, not fatal."""
    try:
        return outside.parse_object(line)
    except outside.Refused:
        return None


def iter_events(path: Path, start: int = 0, end: int | None = None) -> Iterator[dict[str, Any]]:
    """The events of a run's events file, streamed (see EventLines): a run's whole history
    without holding its file. A last line without its newline counts if it is a whole event."""
    lines = EventLines(path, start, end)
    try:
        for line in lines:
            event = parse_event(line)
            if event is not None:
                yield event
    except FileNotFoundError:
        return
    last = parse_event(lines.tail) if lines.tail else None
    if last is not None:
        yield last
