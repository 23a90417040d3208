"""The node's side of a cluster run of the user's own program (`gputui.cluster.node --program-dir DIR`).

The node's run directory DIR (under the cluster's remote_dir) holds what docs/program.md gives a
program: `reported.jsonl` (GPUTUI_EVENTS), `checkpoints/` (GPUTUI_CHECKPOINT_DIR), `stop`
(GPUTUI_STOP_FILE) and `program.json` (0600, written by the master through a command's stdin:
the `[run] env`, whether to resume, the sweep trial; never a command line, which `ps` shows).

What the program reports is read here with gputui.jobs.program.Reports (checked, paced) and
printed as tagged `metrics` event lines on the node's stdout, which the master reads as it
reads the nets' ranks. A stop from the master first creates the stop file (`should_stop()`
turns True on every rank), then, a moment later, SIGTERM goes to the whole tree, and SIGKILL
after `[run] stop_grace_s`.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO, Mapping

from gputui.cluster.worker import EVENT_TAG

SETTINGS_FILE = "program.json"  # in the node's run directory: env, resume, trial (0600)
STOP_NOTICE_S = 1.0  # between the stop file and SIGTERM: a program that polls should_stop() saves first
REPORT_POLL_S = 0.05


def program_files(run_dir: str) -> dict[str, str]:
    """The GPUTUI_* paths of a node's run directory (a POSIX path on the node)."""
    from gputui.jobs.program import CHECKPOINTS, REPORTED, STOP_FILE

    return {"GPUTUI_RUN_DIR": run_dir, "GPUTUI_EVENTS": f"{run_dir}/{REPORTED}",
            "GPUTUI_CHECKPOINT_DIR": f"{run_dir}/{CHECKPOINTS}", "GPUTUI_STOP_FILE": f"{run_dir}/{STOP_FILE}"}


def settings_text(env: Mapping[str, str], resume: bool, trial: Mapping[str, Any]) -> str:
    """What the master writes to the node's program.json."""
    return json.dumps({"env": dict(env), "resume": bool(resume), "trial": dict(trial)}, sort_keys=True)


def program_env(base: Mapping[str, str], run_dir: str) -> dict[str, str]:
    """The program's environment on this node: ours, `[run] env`, gputui's variables, and this
    Python's directory first on PATH (`python` is the node's gputui venv: it has gputui and torch)."""
    settings: dict[str, Any] = {}
    path = Path(run_dir) / SETTINGS_FILE
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            settings = loaded if isinstance(loaded, dict) else {}
        except (OSError, ValueError):
            settings = {}
    env = dict(base)
    extra = settings.get("env")
    if isinstance(extra, dict):
        env.update({str(k): str(v) for k, v in extra.items()})
    here = str(Path(sys.executable).parent)
    env["PATH"] = here + (os.pathsep + env["PATH"] if env.get("PATH") else "")
    env.update(program_files(run_dir))
    env["GPUTUI_RESUME"] = "1" if settings.get("resume") is True else "0"
    trial = settings.get("trial")
    env["GPUTUI_TRIAL"] = json.dumps(trial if isinstance(trial, dict) else {}, sort_keys=True)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def prepare_dir(run_dir: str) -> None:
    """The checkpoint directory exists, and no stop file is left from an earlier attempt."""
    from gputui.jobs.program import CHECKPOINTS, STOP_FILE

    os.makedirs(Path(run_dir) / CHECKPOINTS, mode=0o700, exist_ok=True)
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)


def ask_to_stop(run_dir: str) -> None:
    from gputui.jobs.program import STOP_FILE

    try:
        (Path(run_dir) / STOP_FILE).touch()
    except OSError:
        pass


class LockedOut:
    """The node's stdout, shared by the output relay and the reports relay: whole lines only."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.lock = threading.Lock()

    def write(self, data: bytes) -> int:
        with self.lock:
            n = self.out.write(data)
            self.out.flush()
            return n

    def flush(self) -> None:
        pass


class ReportsRelay(threading.Thread):
    """Reads the program's reports file (as gputui.jobs.program does on one machine) and prints
    each paced report as a tagged `metrics` line; `finish()` reads what is left and flushes."""

    def __init__(self, run_dir: str, out: LockedOut) -> None:
        super().__init__(name="gputui-node-reports", daemon=True)
        from gputui.jobs.program import REPORTED, Pacer, Reports, ReportsFile

        self.file = ReportsFile(Path(run_dir) / REPORTED)
        self.reports = Reports("the program's GPUTUI_EVENTS on this node")
        self.pacer = Pacer()
        self.out = out
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if not self._read():
                self.done.wait(REPORT_POLL_S)
        self._read()
        self._send(self.pacer.due(time.monotonic(), flush=True))
        self.file.close()

    def finish(self) -> None:
        self.done.set()
        self.join(30)

    def _read(self) -> bool:
        got = False
        for chunk in self.file.chunks():
            got = True
            for record in self.reports.feed(chunk):
                if record.checkpoint:  # its own line, at its own step: the master pulls what that step wrote
                    self._send(self.pacer.due(time.monotonic(), flush=True))
                    self._send([(record, 1)])
                else:
                    self._send(self.pacer.add(record, time.monotonic()))
        warning = self.reports.tally.warning() or self.file.refused
        self.file.refused = None
        if warning is not None:
            self._line({"event": "warning", "reason": "bad_report", "message": warning})
        self._send(self.pacer.due(time.monotonic()))
        return got

    def _send(self, batch: list[Any]) -> None:
        for record, count in batch:
            event: dict[str, Any] = {"event": "metrics", "values": record.values, "source": record.source}
            for key in ("step", "epoch", "rank", "time"):
                if getattr(record, key) is not None:
                    event[key] = getattr(record, key)
            if count > 1:
                event["merged"] = count
            if record.checkpoint:
                event["checkpoint"] = True
            self._line(event)

    def _line(self, event: dict[str, Any]) -> None:
        try:
            self.out.write((EVENT_TAG + json.dumps(event) + "\n").encode())
        except (OSError, ValueError):
            self.done.set()
