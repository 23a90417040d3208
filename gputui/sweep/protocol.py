"""The JSON lines between the sweep master and a worker (`gputui worker`), one object a line.

master -> worker (stdin):
  {"op": "trial", "trial": N, "attempt": A, "profile": TOML, "run_dir": PATH, "resume": bool}
      train one trial: `profile` is a resolved run profile ([run] table, as profile.toml);
      `resume` continues from the checkpoint in run_dir (a retried trial whose checkpoint is there)
  a program's trial (`gputui worker --program`) also carries "params": {NAME: VALUE} (into `{NAME}` in
      [run] command and GPUTUI_TRIAL), "objective": METRIC, "direction" and "code": {"git_commit": SHA,
      "git_dirty": bool} (the master's workdir, gputui.runs.provenance; {}: none), which its start records
  {"op": "stop", "trial": N, "reason": "pruned"}
      end trial N at its next step (a stop for another trial is ignored: it came too late)
  {"op": "exit"}, or the end of stdin: finish at once (a running trial is stopped)

worker -> master (stdout):
  {"op": "ready", "pid": P, "device": D, "torch": V, "threads": T, "load_s": S}
  {"op": "event", "trial": N, "data": EVENT, "eval": K}
      a run event (gputui.model.events) of trial N; eval/epoch events carry K, the 1-based index of
      the evaluation within the trial (the step the pruner compares trials at); a program's `metrics`
      event carrying the objective has K = its step + 1 (gputui.sweep.programs), when that moves forward
  {"op": "result", "trial": N, "outcome": "done"|"stopped"|"error", "test_acc": .., "best_acc": ..,
   "elapsed_s": .., "reason": .., "error": MESSAGE, "idle_ms": ..}
      (a program's trial: "value", the objective's last reported value, instead of the accuracies)
      (the start event of a trial also carries "startup_ms": from its trial message to that event)
  {"op": "fatal", "error": MESSAGE}   the worker cannot start (no torch, bad data): it exits next

A worker reads its messages as data (gputui.model.outside): numbers are checked, an integer
beyond +-2**63 is read as None, unknown ops are ignored.
"""

from __future__ import annotations

import json
from typing import Any

from gputui.model import outside

MAX_LINE = outside.MAX_LINE  # a trial message carries a profile: far below this

# The numbers in a message are read by the one helper for numbers from outside (index: a trial
# number, a pid, an evaluation's index: 0..2**31-1; number: a finite float).
number = outside.number
integer = outside.index


def encode(message: dict[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), allow_nan=False)


def decode(line: str | bytes, tally: outside.Tally | None = None) -> dict[str, Any] | None:
    """A message, or None for a line that is not one (noise on a pipe, a torn line, hostile
    text); `tally` counts what was refused (and an integer out of range, read as None)."""
    tally = tally or outside.Tally("a worker")
    value = tally.line(line)
    if value is None:
        return None
    if not isinstance(value.get("op"), str):
        tally.refuse("a JSON object that is not a message (no op)")
        return None
    return value


class CurrentTrial:
    """A worker's one trial at a time, and its stop: the master's `stop` (one trial) and the end of
    its stdin (all) set the running trial's StopFlag. Both kinds of worker (the nets', a program's)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.current: tuple[int, Any] | None = None

    def stop(self, trial: Any, reason: str) -> None:
        with self.lock:
            if self.current is not None and self.current[0] == trial:
                self.current[1].set(reason)

    def stop_all(self, reason: str) -> None:
        with self.lock:
            if self.current is not None:
                self.current[1].set(reason)
