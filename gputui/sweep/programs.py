"""The worker's side of a sweep of the user's own program (`gputui worker --program`): each trial
is a fresh process of the program, run as `gputui run` runs it (gputui.jobs.program, handed in by
the command: this layer does not import jobs), in the trial's run directory.

The worker imports no torch and loads no data: it is ready at once. Per trial it puts the trial's
parameters into `[run] command` (`{lr}`) and GPUTUI_TRIAL, relays the run's events to the master,
and marks each `metrics` event that carries the objective with `eval` (the program's step + 1, or
its epoch + 1, or the count of its reports of the objective when it gives neither, reports merged
into one event counted each (`objective_reports`); only when that moves forward), which the master reports to the study for the pruner. The trial's value is the
last value of the objective the program reported (Optuna's convention: the final value).
A stop from the master (pruned) is the run's stop: `report.should_stop()` turns True, then SIGTERM
goes to the program's tree (gputui.jobs.keeper ends what is left after `[run] stop_grace_s`).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Protocol

from gputui.model import outside
from gputui.model.supervisor import StopFlag
from gputui.runs.provenance import from_fields
from gputui.sweep import protocol

Write = Callable[[dict[str, Any]], None]


class ProgramRuns(Protocol):
    """What a program worker needs of gputui.jobs.program (that module is one)."""

    CHECKPOINTS: str

    def execute_program(self, run: Any, cfg: Any, resume: bool, view: Any, stop: Any = None,
                        code: Any = ...) -> str: ...

    def wrote_checkpoint(self, path: Path) -> bool: ...


class Relay:
    """The run's view inside a worker: each run event goes to the master as it is written; a
    `metrics` event with the objective is marked with `eval` when it moves the trial forward."""

    def __init__(self, number: int, objective: str, write: Write, got: float) -> None:
        self.number, self.objective, self.write, self.got = number, objective, write, got
        self.last: float | None = None  # the objective's last reported value: the trial's value
        self.reports = 0  # reports of the objective so far
        self.position = -1  # the last step the master was given
        self.lock = threading.Lock()

    def show(self, event: dict[str, Any]) -> None:
        out: dict[str, Any] = {"op": "event", "trial": self.number, "data": event}
        kind = event.get("event")
        if kind == "metrics":
            with self.lock:
                at = self._mark(event)
            if at is not None:
                out["eval"] = at + 1
        elif kind == "start":
            out["startup_ms"] = round(1000 * (time.perf_counter() - self.got), 2)
        self.write(out)

    def _mark(self, event: dict[str, Any]) -> int | None:
        values = event.get("values")
        value = outside.number(values.get(self.objective)) if isinstance(values, dict) else None
        if value is None:
            return None
        self.last = value
        said = outside.index(event.get("objective_reports")) or 1  # reports merged into this one (Pacer)
        self.reports += said
        step, epoch = outside.index(event.get("step")), outside.index(event.get("epoch"))
        at = step if step is not None else epoch if epoch is not None else self.reports - 1
        if at <= self.position:
            return None  # a step already given (Optuna keeps the first value of a step)
        self.position = at
        return at


class ProgramWorker(protocol.CurrentTrial):
    """Runs a program's trials read from the master; the same duties as gputui.sweep.trials.Worker."""

    def __init__(self, device: str, threads: int | None, runs: ProgramRuns, write: Write) -> None:
        super().__init__()
        t0 = time.perf_counter()
        self.device, self.threads, self.runs, self.write = device, threads, runs, write
        self.load_s = time.perf_counter() - t0

    def ready(self) -> dict[str, Any]:
        return {"op": "ready", "pid": os.getpid(), "device": self.device, "threads": self.threads,
                "load_s": round(self.load_s, 3)}

    def run_trial(self, message: dict[str, Any]) -> None:
        from gputui.config.profile import parse_profile
        from gputui.model.errors import GputuiError
        from gputui.runs import store as runs

        number = protocol.integer(message.get("trial"))
        if number is None:
            return
        got = time.perf_counter()
        result: dict[str, Any] = {"op": "result", "trial": number}
        stop = StopFlag()
        with self.lock:
            self.current = (number, stop)
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        objective = str(message.get("objective") or "")
        relay = Relay(number, objective, self.write, got)
        try:
            cfg = parse_profile(str(message.get("profile", ""))).run.resolve()
            # the run rates itself as the sweep does (`gputui runs` shows its last and best objective)
            said = message.get("direction")
            direction = said if isinstance(said, str) and said in ("maximize", "minimize") else cfg.direction
            # the study's choice over the profile's [run] trial: its profile.toml runs this trial again
            cfg = replace(cfg.with_trial(params), device=self.device, strategy="single", gpus=None, nproc=None,
                          threads=self.threads or cfg.threads, objective=objective or cfg.objective,
                          direction=direction)
            run = runs.RunDir(Path(str(message.get("run_dir"))))
            run.path.mkdir(parents=True, exist_ok=True)
            resume = bool(message.get("resume")) and self.runs.wrote_checkpoint(run.path / self.runs.CHECKPOINTS)
            if not resume:
                run.profile.write_text(cfg.to_toml(), encoding="utf-8")
            code = from_fields(message.get("code"))  # the master's read of its workdir (gputui.runs.provenance)
            outcome = self.runs.execute_program(run, cfg, resume, relay, stop=stop, code=code)
            result.update(outcome="done" if outcome == "done" else "stopped", reason=stop.reason or None,
                          value=relay.last)
        except GputuiError as exc:
            result.update(outcome="error", reason="error", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a trial's failure is the trial's, the worker goes on
            result.update(outcome="error", reason="crash", error=f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            with self.lock:
                self.current = None
        self.write({k: v for k, v in result.items() if v is not None})


def serve_programs(device: str, threads: int | None, runs: ProgramRuns) -> int:
    """A program sweep's worker: ready at once, then the trials its master sends until the end of stdin."""
    from gputui.sweep.trials import serve

    return serve(device, threads, None, make=lambda write: ProgramWorker(device, threads, runs, write))
