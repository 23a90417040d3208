"""Report from your own training program to gputui: `from gputui import report`.

Standard library only (it never imports torch, nor the rest of gputui), so a program can use it
wherever it runs; outside gputui every call is harmless (nothing is written, `should_stop()`
stays False, checkpoints go to ./checkpoints).

    from gputui import report
    for epoch in range(start, epochs):
        ...
        report.log(step=step, epoch=epoch, loss=loss.item(), val_acc=acc)
        if report.should_stop():      # Ctrl-C, `s` in the dashboard, a pruner, a budget, a spot notice
            save(report.checkpoint_dir() / "last.pt"); break

Each `log` appends one JSON line to the file `GPUTUI_EVENTS` names; the format is in
docs/program.md, so a program in any language can report the same way.
"""

from __future__ import annotations

import atexit
import json
import math
import numbers
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

EVENTS_ENV = "GPUTUI_EVENTS"
CHECKPOINT_ENV = "GPUTUI_CHECKPOINT_DIR"
RESUME_ENV = "GPUTUI_RESUME"
TRIAL_ENV = "GPUTUI_TRIAL"
STOP_FILE_ENV = "GPUTUI_STOP_FILE"
RUN_DIR_ENV = "GPUTUI_RUN_DIR"
_STOP_LOOK_S = 0.1  # the stop file is looked at most this often (a call costs a stat otherwise)

__all__ = ["log", "checkpoint_dir", "resuming", "trial", "should_stop"]


class _Reporter:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.fd = -1
        self.pid = 0
        self.warned = 0  # the pid that already said a write failed
        self.torn = False  # a short write left part of a line: the next one starts on a new line
        self.stop_asked = False
        self.stop_looked = 0.0

    def write(self, line: str) -> None:
        """One line, one append (no buffer: a failed write leaves nothing behind to retry at exit).
        A write that fails (a full disk, the run directory gone) costs that report, never the
        program: it is said once on stderr, and later reports are tried again."""
        with self.lock:
            try:
                if self.fd < 0 or self.pid != os.getpid():  # a forked child opens its own
                    path = os.environ.get(EVENTS_ENV)
                    if not path:
                        return
                    self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
                    self.pid = os.getpid()
                data = (b"\n" if self.torn else b"") + line.encode("utf-8")
                written = os.write(self.fd, data)
                self.torn = written < len(data)
                if self.torn:
                    raise OSError(f"a short write ({written} of {len(data)} bytes): is the disk full?")
            except OSError as exc:
                self.lost(exc)

    def lost(self, exc: OSError) -> None:
        if self.warned == os.getpid():
            return
        self.warned = os.getpid()
        try:
            sys.stderr.write(f"gputui.report: cannot write {os.environ.get(EVENTS_ENV)}: {exc.strerror or exc}; "
                             "reports are lost until it can be written (the program goes on)\n")
            sys.stderr.flush()
        except (OSError, ValueError, AttributeError):  # no stderr, or a closed one
            pass


_reporter = _Reporter()


_RANK: dict[int, int] = {}  # this process's RANK (read once per process)
_KEYS: dict[str, str] = {}  # a metric's name -> its JSON key text ('"loss":'), built once


def _rank() -> int:
    pid = os.getpid()
    rank = _RANK.get(pid)
    if rank is None:
        try:
            rank = int(os.environ.get("RANK", "0"))
        except ValueError:
            rank = 0
        _RANK[pid] = rank
    return rank


def _number_text(name: str, value: Any) -> str | None:
    """`value` as JSON number text; None for NaN and the infinities (left out); TypeError for
    anything that is not a number. Written by hand: a json.dumps per call costs more than the rest."""
    kind = type(value)
    if kind is float:
        return float.__repr__(value) if value - value == 0.0 else None
    if kind is int:
        return int.__repr__(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy's scalars are Real; a tensor is not
        raise TypeError(f"report.log: {name}={value!r} is not a number (pass a float or an int, e.g. loss.item())")
    if isinstance(value, numbers.Integral):
        return int.__repr__(int(value))
    number = float(value)
    return float.__repr__(number) if math.isfinite(number) else None


def log(step: int | None = None, epoch: int | None = None, *, all_ranks: bool = False, checkpoint: bool = False,
        **metrics: float) -> None:
    """Record `metrics` (name=number) at `step` and `epoch` as one line gputui reads.

    Numbers only (a bool, text or a tensor is a TypeError: pass `loss.item()`); NaN and infinities
    are left out. Under DDP only rank 0's calls are kept, unless `all_ranks=True`.
    `checkpoint=True`: a checkpoint was just written to `checkpoint_dir()` (on a cluster, gputui
    pulls it to the master now rather than at its next `checkpoint_pull_s`)."""
    parts = []
    for name, value in metrics.items():
        text = _number_text(name, value)
        if text is None:
            continue
        key = _KEYS.get(name)
        if key is None:
            key = _KEYS.setdefault(name, json.dumps(name) + ":")
        parts.append(key + text)
    tail = ""
    for place, given in (("step", step), ("epoch", epoch)):
        if given is None:
            continue
        if type(given) is not int and (isinstance(given, bool) or not isinstance(given, numbers.Integral)):
            raise TypeError(f"report.log: {place}={given!r} is not a whole number")
        tail += f',"{place}":{int(given)}'
    rank = _rank()
    if rank != 0 and not all_ranks:
        return
    if all_ranks:
        tail += f',"rank":{rank}'
    if checkpoint:
        tail += ',"checkpoint":true'
    _reporter.write('{"values":{' + ",".join(parts) + "}" + tail + "}\n")  # gputui times it as it reads it


def checkpoint_dir() -> Path:
    """The directory to save checkpoints in: it survives `gputui run --resume` (created if missing)."""
    path = Path(os.environ.get(CHECKPOINT_ENV) or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def resuming() -> bool:
    """True when gputui resumed this run (`gputui run --resume`): load your checkpoint."""
    return os.environ.get(RESUME_ENV, "0") == "1"


def trial() -> dict[str, Any]:
    """A sweep trial's parameters ({"lr": 0.01, ...}); {} outside a sweep."""
    try:
        value = json.loads(os.environ.get(TRIAL_ENV) or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def should_stop() -> bool:
    """True once gputui has asked this run to stop: save a checkpoint and exit."""
    if _reporter.stop_asked:
        return True
    path = os.environ.get(STOP_FILE_ENV)
    now = time.monotonic()
    if path and now - _reporter.stop_looked >= _STOP_LOOK_S:
        _reporter.stop_looked = now
        _reporter.stop_asked = os.path.exists(path)
    return _reporter.stop_asked


def _on_stop_signal(signum: int, frame: Any) -> None:
    """SIGTERM from gputui: `should_stop()` turns True and the program goes on to save. In a
    process forked from the program (a data loader's worker), the signal keeps its default: it ends."""
    if os.getpid() != _INSTALLED_IN:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    _reporter.stop_asked = True


def _ignore_a_late_stop() -> None:
    """At exit, after the program's own atexit work: Python puts SIGTERM's default back as it shuts
    down, so gputui's SIGTERM, sent as the program stops by itself on `should_stop()` (the stop file
    comes first), would end it with 143 instead of its own status. It is ignored from here on; the
    keeper still SIGKILLs a program that does not end within `[run] stop_grace_s`."""
    if os.getpid() == _INSTALLED_IN and signal.getsignal(signal.SIGTERM) is _on_stop_signal:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


_INSTALLED_IN = os.getpid()
if (os.environ.get(EVENTS_ENV) and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL):  # under gputui, and nobody else handles it
    signal.signal(signal.SIGTERM, _on_stop_signal)
    atexit.register(_ignore_a_late_stop)  # it runs after the atexit functions registered later
