"""Every event a run emits, defined once: its name, its fields and their kinds.

The trainer, the DDP launcher, the cluster master and its workers build events with
`make`, which refuses an unknown event or field (a programming error, caught by the
tests) and a number that is not finite (a NaN loss must become an `error` event, never
a line that is not JSON). The readers (the JSON view, the dashboard, the cluster relay)
use `typed` on what they receive: a relayed or replayed event is data from elsewhere, so
its numbers are kept only when they are finite numbers.
"""

from __future__ import annotations

import math
import time
from typing import Any, Mapping

from gputui.model.outside import MAX_INT, finite  # noqa: F401 - the one home of both; re-exported

# Kinds of field values: "int", "num" (int or float), "str", "bool", "list", "any", and "values" (an
# object of metric name to finite number: what a user's program reports, docs/program.md).
_RUN = {"run_id": "str", "run_dir": "str", "nonce": "str"}
_POSITION = {"epoch": "int", "step": "int", "elapsed_s": "num"}
_MESSAGE = {"message": "str"}

SPEC: dict[str, dict[str, str]] = {
    # The trainer (every strategy; a cluster relays rank 0's).
    "start": {**_RUN, "model": "str", "device": "str", "strategy": "str", "world_size": "int", "epochs": "int",
              "batch_size": "int", "steps_per_epoch": "int", "total_steps": "int", "train_samples": "int",
              "test_samples": "int", "num_classes": "int", "params": "int", "seed": "int",
              "resumed_from_step": "int", "device_choice": "str", "gpus": "list", "node": "str", "nodes": "int", "nproc_per_node": "int", "restart": "int",
              "step_impl": "str", "schedule_from_step": "int", "threads": "int", "threads_why": "str",
              "warmup_s": "num",
              # a run of the user's own program (gputui.jobs.program)
              "program": "str", "workdir": "str", "resumed": "bool", "objective": "str", "direction": "str",
              "git_commit": "str", "git_dirty": "bool"},
    # What a user's program reported (its events file, or an output line a [run] metrics_regex matched).
    "metrics": {**_POSITION, "values": "values", "rank": "int", "source": "str", "merged": "int", "objective_reports": "int",
                "checkpoint": "bool"},
    "step": {**_POSITION, "loss": "num", "l1": "num", "samples_per_s": "num", "lr": "num"},
    "eval": {**_POSITION, "test_loss": "num", "test_acc": "num", "eval_s": "num"},
    "epoch": {**_POSITION, "train_loss": "num", "l1": "num", "test_loss": "num", "test_acc": "num", "eval_s": "num"},
    "interrupted": {**_POSITION, "reason": "str", "checkpoint": "str", "exit_code": "int", "lost_steps": "int"},
    "done": {"step": "int", "epochs": "int", "test_acc": "num", "best_acc": "num", "elapsed_s": "num", "eval_s": "num",
             "exit_code": "int"},
    "error": {**_MESSAGE, "exit_code": "int", "reason": "str", "step": "int", "epoch": "int", "checkpoint": "str",
              "node": "str", "elapsed_s": "num"},
    "warning": {**_MESSAGE, "node": "str", "reason": "str"},
    "fallback": {**_MESSAGE, "from_impl": "str", "to_impl": "str", "reason": "str", "step": "int"},
    # A cluster's workers.
    "restarted": {"restart": "int", "world_size": "int", "node": "str", "nodes": "int", "resumed_from_step": "int"},
    # The cluster master.
    "node": {**_MESSAGE, "node": "str", "kind": "str", "address": "str", "bootstrap_s": "num", "skipped": "bool",
             "steps": "list", "python": "str", "torch": "str"},
    "slaves_started": {**_MESSAGE, "instances": "list"},
    "slaves_terminated": {**_MESSAGE, "instances": "list"},
    "stopping": {**_MESSAGE, "slaves": "int", "processes": "int", "reason": "str"},
    "cluster": {**_MESSAGE, "attempt": "int", "nodes": "list", "world_size": "int", "min_nodes": "int", "rdzv": "str"},
    "relaunch": {**_MESSAGE, "attempt": "int", "from_step": "int", "reason": "str"},
    "resumed": {**_MESSAGE, "from_step": "int", "lost_steps": "int", "nodes": "int", "checkpoint": "str"},
    # A program's checkpoint pulled from rank 0's node into the master's run (gputui.cluster.checkpoints).
    "checkpoint_pulled": {**_MESSAGE, "node": "str", "step": "int", "files": "int", "bytes": "int", "path": "str",
                          "seconds": "num"},
    "node_lost": {**_MESSAGE, "node": "str", "exit_code": "int", "step": "int", "reason": "str"},
    "node_unavailable": {**_MESSAGE, "node": "str"},
    "node_dropped": {**_MESSAGE, "node": "str", "nodes": "int"},
    "node_replaced": {**_MESSAGE, "node": "str", "by": "str"},
    # The monitor and the dashboard.
    "alert": {**_MESSAGE, "rule": "str", "state": "str", "host": "str", "gpu": "int", "run_id": "str", "value": "any",
              "threshold": "num", "since": "num"},
    "kill": {**_MESSAGE, "host": "str", "pid": "int", "signal": "str", "ok": "bool"},
}

# The fields that are numbers in every event that has them (what a reader of an unknown event checks).
NUMBERS = tuple(sorted(
    {name for fields in SPEC.values() for name, kind in fields.items() if kind in ("int", "num")}
    - {name for fields in SPEC.values() for name, kind in fields.items() if kind not in ("int", "num")}
))
ENDS = ("done", "interrupted", "error")  # the events after which a run emits nothing more


class NonFinite(ValueError):
    """An event field that should be a number is NaN or infinite."""


def _fits(kind: str, value: Any) -> bool:
    if value is None or kind == "any":
        return True
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "num":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "values":
        return isinstance(value, dict) and all(isinstance(k, str) and finite(v) is not None for k, v in value.items())
    return isinstance(value, (list, tuple))


def make(name: str, /, **fields: Any) -> dict[str, Any]:
    """The event `name` with `fields` and the time, checked against SPEC.

    Raises TypeError for an unknown event, field or a value of the wrong kind (a bug),
    and NonFinite for a NaN or infinite number.
    """
    spec = SPEC.get(name)
    if spec is None:
        raise TypeError(f"unknown event {name!r}")
    for key, value in fields.items():
        kind = spec.get(key)
        if kind is None:
            raise TypeError(f"event {name!r} has no field {key!r}")
        if not _fits(kind, value):
            raise TypeError(f"event {name!r} field {key!r}: {value!r} is not {kind}")
        if isinstance(value, float) and not math.isfinite(value):
            raise NonFinite(f"event {name!r} field {key!r} is {value}")
    return {"event": name, "time": round(time.time(), 3), **fields}


_NUMBER_KEYS = {name: tuple(k for k, kind in spec.items() if kind in ("int", "num")) for name, spec in SPEC.items()}


def typed(event: Mapping[str, Any]) -> dict[str, Any]:
    """A received event with each number that is not a finite number (text, NaN, a bool, a huge
    integer) as None."""
    out = dict(event)
    for key in _NUMBER_KEYS.get(str(out.get("event")), NUMBERS):
        value = out.get(key)
        if value is not None and finite(value) is None:
            out[key] = None
    if "values" in out:
        out["values"] = metric_values(out["values"])
    return out


def metric_values(value: Any) -> dict[str, float | int]:
    """A `metrics` event's `values` as received: only names that are text, with a finite number."""
    if not isinstance(value, Mapping):
        return {}
    return {k: v for k, v in value.items() if isinstance(k, str) and finite(v) is not None}
