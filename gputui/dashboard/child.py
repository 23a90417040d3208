"""The training run as a child process: `gputui run --json`, so the dashboard shows
exactly what the headless engine does. Its events come on stdout, one JSON line each;
its last error line on stderr. Stopping it is SIGTERM (checkpoint, exit 0).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import deque
from pathlib import Path
from typing import Any, Iterator, Sequence

from gputui.model.text import clean, clean_tree

STOP_GRACE_S = 15.0  # a SIGTERMed run checkpoints within seconds; after this it is killed


def run_argv(profile: Path | None, resume: bool, extra: Sequence[str] = ()) -> list[str]:
    """The command line of the child: a new run of `profile`, or `--resume last`."""
    argv = [sys.executable, "-m", "gputui", "run", "--json"]
    if resume:
        argv += ["--resume", "last"]
    elif profile is not None:
        argv += ["--profile", str(profile)]
    return argv + list(extra)


class TrainingChild:
    """One `gputui run --json` process. `events()` blocks: call it from a worker thread."""

    def __init__(self, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> None:
        self.argv = list(argv)
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self._stderr: deque[str] = deque(maxlen=40)
        self._stderr_done = threading.Event()
        self.stop_requested = False

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the process (OSError if it cannot be)."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True, bufsize=1, env=env, cwd=self.cwd)
        threading.Thread(target=self._drain_stderr, name="training-stderr", daemon=True).start()

    def _drain_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        try:
            for line in self.proc.stderr:
                if line.strip():
                    self._stderr.append(clean(line.rstrip()))
        finally:
            self._stderr_done.set()

    def events(self) -> Iterator[dict[str, Any]]:
        """Each event as it is printed, until the process closes its stdout."""
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # `--json` prints only events; anything else is not ours to show
            if isinstance(event, dict):
                yield clean_tree(event)  # a cluster run relays what slaves said: data, without control characters

    def wait(self) -> int:
        """The exit code, once the process has ended and its stderr is read."""
        assert self.proc is not None
        code = self.proc.wait()
        self._stderr_done.wait(5.0)
        return code

    def last_error(self) -> str | None:
        """The line that says why the run failed: `gputui: error: ...`, else the last stderr line."""
        lines = list(self._stderr)
        for line in reversed(lines):
            if line.startswith("gputui: error:"):
                return line
        return lines[-1] if lines else None

    def stop(self) -> bool:
        """Ask the run to checkpoint and exit (SIGTERM); False if it is not running."""
        if not self.running:
            return False
        assert self.proc is not None
        self.stop_requested = True
        try:
            self.proc.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            return False
        return True

    def shutdown(self, grace_s: float = STOP_GRACE_S) -> None:
        """Stop the run and make sure it is gone: SIGTERM, then SIGKILL after `grace_s`."""
        if self.proc is None:
            return
        self.stop()
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
