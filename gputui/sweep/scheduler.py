"""The sweep master's loop: trials from the study to idle workers, events back to the pruner.

One thread reads each worker's stdout into one queue; everything else (the study, the slots,
the counts) belongs to the loop, so nothing is shared between threads but that queue.

Each trial held is in one state of gputui.sweep.lifecycle (asked, pending, running, stopping,
finished), moved only through `self.trials`; a worker's `busy` names the trial on it.

One master runs a study at a time (gputui.sweep.study.master_lock). Should a trial still be
finished by someone else (optuna-dashboard, a hand-made script), telling the study about it is
a warning, not a crash. The shutdown is a list of independent steps: every worker is ended, every
held trial given back and every slot closed (cloud slaves released) whatever an earlier step
raised; each failure is reported once (`shutdown_errors`).

A sweep of the user's own program (`spec.of_program`) runs through the same loop: its workers
(gputui.sweep.programs) start the program afresh for each trial, mark the `metrics` events that
carry the objective with `eval` (the program's step + 1), and end a trial with the objective's
last value; a pruned trial's run is stopped as `gputui run` stops one.

Faults: a worker that dies gives its trial back (the retry prefers another slot, and continues
from the trial's checkpoint when one is there); a trial that fails twice (a death or an error
each time) is told FAIL with its error. A trial whose loss is not finite fails at once (it would
again). The study is told exactly once per trial, so none is lost or counted twice.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

from gputui.model.errors import GputuiError
from gputui.model import outside
from gputui.sweep import protocol, study as studies
from gputui.sweep.lifecycle import Outcome, Trial, Trials, TrialState
from gputui.sweep.base import Slot, WorkerGone, WorkerHandle
from gputui.sweep.space import SweepSpec, ask

MAX_ATTEMPTS = 2  # a trial that fails this many times is failed
MAX_RESPAWNS = 3  # a slot whose worker dies this many times is given up
PRIOR_TRIAL_S = 60.0  # the budget's guess of a trial's length before one has finished


@dataclass
class Worker:
    wid: int
    slot: Slot
    handle: WorkerHandle
    spawned: float
    ready: bool = False
    busy: Trial | None = None  # the trial on it (running or stopping)
    fatal: str | None = None
    last_end: float | None = None  # the `time` of its last trial's last event (for the turnaround)


@dataclass
class Progress:
    """What the progress line shows."""

    name: str
    trials: int
    done: int = 0
    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    best: float | None = None
    best_trial: int | None = None
    spent_usd: float = 0.0
    note: str = ""


class Spend:
    """The slots' spend so far and the budget's rule for a new trial."""

    def __init__(self, budget_usd: float | None, clock: Callable[[], float]) -> None:
        self.budget = budget_usd
        self.clock = clock
        self.held: dict[int, tuple[float, float, float | None]] = {}  # wid -> (rate, since, until)
        self.trial_s: list[float] = []

    def hold(self, wid: int, rate: float) -> None:
        self.held[wid] = (rate, self.clock(), None)

    def release(self, wid: int) -> None:
        if wid in self.held and self.held[wid][2] is None:
            rate, since, _ = self.held[wid]
            self.held[wid] = (rate, since, self.clock())

    def spent(self) -> float:
        now = self.clock()
        return sum(rate * ((until or now) - since) / 3600 for rate, since, until in self.held.values())

    def allows_new_trial(self) -> bool:
        """No budget, or the spend projected to the end of one more trial on every held slot stays within it."""
        if self.budget is None:
            return True
        mean = statistics.fmean(self.trial_s) if self.trial_s else PRIOR_TRIAL_S
        rate = sum(r for r, _s, until in self.held.values() if until is None)
        return self.spent() + rate * mean / 3600 <= self.budget


class SweepStudy(Protocol):
    """What the scheduler asks of its study: an optuna.Study does it (checked below, for mypy only:
    optuna is imported lazily)."""

    def ask(self) -> Any: ...

    def tell(self, trial: Any, values: float | None = None, state: Any = None) -> Any: ...

    def get_trials(self, deepcopy: bool = True) -> Sequence[Any]: ...

    def enqueue_trial(self, params: dict[str, Any], user_attrs: dict[str, Any] | None = None) -> None: ...


class SweepView(Protocol):
    """Where the sweep shows itself (gputui.sweep.view makes one: a live line, plain lines, JSON lines)."""

    def sweep(self, kind: str, **fields: Any) -> None:
        """Something happened to the sweep: slot, trial, trial_done, requeued, budget, warning, start, end,
        shutdown_failed (a step of the shutdown that raised: the others ran)."""
        ...

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        """A run event of a trial (gputui.model.events), as its worker wrote it."""
        ...

    def progress(self, p: Progress) -> None:
        """The counts, after anything changed."""
        ...

    def close(self) -> None: ...


if TYPE_CHECKING:
    import optuna

    def _an_optuna_study_is_a_sweep_study(study: optuna.Study) -> SweepStudy:
        return study


class Scheduler:
    """Runs `spec.trials` trials of `study` over `slots`; `view` sees the progress and the events."""

    def __init__(self, study: SweepStudy | None, spec: SweepSpec, run: Any, slots: Sequence[Slot], view: SweepView,
                 stop: threading.Event | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`study` may be None until `attach` (the workers start loading while the study is made)."""
        self._study, self.spec, self.base, self.slots, self.view = study, spec, run, list(slots), view
        self.stop = stop or threading.Event()
        self.clock = clock
        self.inbox: "queue.Queue[tuple[int, str | None]]" = queue.Queue()
        self.workers: dict[int, Worker] = {}
        self.deaths: dict[str, int] = {}
        self.tallies: dict[str, outside.Tally] = {}  # slot -> what its workers sent that was not taken
        self.trials = Trials()  # every trial held, each in its state (gputui.sweep.lifecycle)
        self.code: dict[str, Any] | None = None  # a program's code (its git commit): read at the first trial
        self.spend = Spend(spec.budget_usd, clock)
        self.turnarounds_ms: list[float] = []
        self.startups_ms: list[float] = []
        self.budget_reached = False
        self.fatal_reasons: list[str] = []  # why workers could not start (a bad data path, no torch...)
        self._next_wid = 0
        self.progress = Progress(name=spec.name, trials=spec.trials)
        self.shutdown_errors: list[str] = []  # each failed step of the shutdown, as reported
        self.shutting_down = False  # set while the slots are released (a second Ctrl-C waits for it)
        self._started = False
        if study is not None:
            self.attach(study)

    def attach(self, study: SweepStudy) -> None:
        self._study = study
        self._count_existing()

    @property
    def study(self) -> SweepStudy:
        """The study attached (a programming error before `attach`)."""
        if self._study is None:
            raise RuntimeError("the sweep scheduler has no study yet: attach one first")
        return self._study

    def start_slots(self) -> None:
        """Start every slot's worker (torch and the data load from now on)."""
        if not self._started:
            self._started = True
            self._say_code()
            for slot in self.slots:
                self._spawn(slot)

    def _say_code(self) -> None:
        """A program sweep's code on each host (sent once per host, before its workers): a `code` line."""
        said: set[str] = set()
        for slot in self.slots:
            host: Any = getattr(slot, "host", None)
            shipped = getattr(host, "code", None)
            if host is None or shipped is None or host.name in said:
                continue
            said.add(host.name)
            stats = shipped.stats
            self.view.sweep("code", host=host.name, code_dir=shipped.code_dir, sent_files=stats.sent_files,
                            sent_bytes=stats.sent_bytes, unchanged_files=stats.unchanged_files,
                            removed_files=stats.removed_files, seconds=round(stats.seconds, 3),
                            setup=shipped.setup_ran)
            for note in stats.notes:
                self.view.sweep("warning", slot=host.name, message=note)

    def abort(self) -> None:
        """The sweep will not run after all: end the workers started, release the slots (cloud slaves)."""
        self.shutting_down = True
        steps: list[tuple[str, Callable[[], None]]] = []
        for worker in list(self.workers.values()):
            steps.append((f"end worker {worker.slot.name}", worker.handle.kill))
        steps += [(f"close slot {slot.name}", slot.close) for slot in self.slots]
        self._run_steps(steps)

    # -- counts --------------------------------------------------------------------------
    def _count_existing(self) -> None:
        from optuna.trial import TrialState as Told

        p = self.progress
        for t in self.study.get_trials(deepcopy=False):
            if not studies.counted(t):
                continue
            p.done += 1
            if t.state == Told.COMPLETE:
                p.complete += 1
                self._consider_best(t.number, t.value)
            elif t.state == Told.PRUNED:
                p.pruned += 1
            else:
                p.failed += 1

    def _consider_best(self, number: int, value: float | None) -> None:
        if value is None:
            return
        best = self.progress.best
        better = best is None or (value > best if self.spec.direction == "maximize" else value < best)
        if better:
            self.progress.best, self.progress.best_trial = value, number

    def _running(self) -> list[Trial]:
        return [w.busy for w in self.workers.values() if w.busy is not None]

    def _in_flight(self) -> int:
        return len(self.trials)  # asked, pending, running, stopping, finished and not told yet

    # -- workers -------------------------------------------------------------------------
    def _spawn(self, slot: Slot) -> None:
        try:
            handle = slot.spawn()
        except GputuiError as exc:
            self.deaths[slot.name] = MAX_RESPAWNS
            self.fatal_reasons.append(str(exc))
            self.view.sweep("slot", slot=slot.name, device=slot.device, state="failed", message=str(exc))
            return
        wid = self._next_wid
        self._next_wid += 1
        worker = Worker(wid, slot, handle, self.clock())
        self.workers[wid] = worker
        self.spend.hold(wid, slot.usd_per_hour)
        threading.Thread(target=self._read, args=(wid, handle), name=f"gputui-sweep-{slot.name}", daemon=True).start()
        self.view.sweep("slot", slot=slot.name, device=slot.device, state="starting", pid=handle.pid)

    def _read(self, wid: int, handle: WorkerHandle) -> None:
        try:
            for line in handle.lines():
                self.inbox.put((wid, line))
        finally:
            self.inbox.put((wid, None))

    def _lost(self, worker: Worker) -> None:
        """A worker's output ended: give its trial back, start its slot again (a few times)."""
        self.workers.pop(worker.wid, None)
        self.spend.release(worker.wid)
        worker.handle.kill()
        code = worker.handle.exit_code()
        why = worker.fatal or worker.handle.last_words() or f"exit status {code}"
        name = worker.slot.name
        if worker.fatal:
            self.fatal_reasons.append(worker.fatal)
        self.deaths[name] = self.deaths.get(name, 0) + (MAX_RESPAWNS if worker.fatal else 1)
        self.view.sweep("slot", slot=name, device=worker.slot.device, state="lost", pid=worker.handle.pid,
                        exit_code=code, message=why)
        for warning in getattr(worker.handle, "warnings", ()):  # a remote worker's checkpoint not pulled back
            self.view.sweep("warning", slot=name, message=warning)
        if worker.busy is not None:
            self._retry(worker.busy, f"worker {name} died ({why})", name)
        if self.deaths[name] < MAX_RESPAWNS and not self._over():
            self._spawn(worker.slot)

    # -- trials --------------------------------------------------------------------------
    def _may_ask(self) -> bool:
        if self.stop.is_set() or self.progress.done + self._in_flight() >= self.spec.trials:
            return False
        return self._budget_allows()

    def _budget_allows(self) -> bool:
        if not self.spend.allows_new_trial():
            if not self.budget_reached:
                self.budget_reached = True
                self.view.sweep("budget", spent_usd=round(self.spend.spent(), 6), budget_usd=self.spec.budget_usd,
                                message="no new trial: the projected spend would pass the budget")
            return False
        return True

    def _ask(self) -> Trial:
        from gputui.config.run import RunSettings

        handle = self.study.ask()
        params = ask(handle, self.spec)
        # a program's parameters are not run keys: its worker puts them into the command (and GPUTUI_TRIAL)
        cfg = (self.base if self.spec.of_program else self.base.merged(RunSettings(**params))).resolve()
        return self.trials.add(Trial(number=handle.number, handle=handle, params=params, profile=cfg.to_toml()))

    def _pick(self, worker: Worker) -> Trial | None:
        """The newest retry this worker may take (one avoids the slot it failed on, while others live)."""
        live = {w.slot.name for w in self.workers.values()}
        for trial in reversed(self.trials.queue(TrialState.PENDING)):
            if trial.avoid != worker.slot.name or live <= {worker.slot.name}:
                return trial
        return None

    def _dispatch(self) -> None:
        if self.stop.is_set():
            return
        for worker in list(self.workers.values()):
            if not worker.ready or worker.busy is not None:
                continue
            trial = self._pick(worker)
            asked = self.trials.queue(TrialState.ASKED)
            if trial is None and asked and self._budget_allows():
                trial = asked[0]
            if trial is None:
                if not self._may_ask():
                    continue
                trial = self._ask()
            self._start(worker, trial)

    def _ask_ahead(self) -> None:
        """Ask the study now for the trials the busy workers will want next, so that a worker that
        ends a trial gets the next one at once (the ask and its writes cost 10-30 ms, more under load).
        Running trials are known to TPE (constant liar), so asking early costs the search little."""
        if self.stop.is_set():
            return
        busy = sum(1 for w in self.workers.values() if w.ready and w.busy is not None)
        while (self.trials.count(TrialState.ASKED) < busy - self.trials.count(TrialState.PENDING)
               and self._may_ask()):
            self._ask()

    def _start(self, worker: Worker, trial: Trial) -> None:
        directory = studies.trial_dir(self.spec.name, trial.number)
        # a retry continues from its checkpoint (a program's worker resumes only if it wrote one)
        resume = trial.attempt > 1 and (self.spec.of_program or (directory / "ckpt.pt").is_file())
        trial.started = self.clock()
        self.trials.start(trial)
        worker.busy = trial
        self.view.sweep("trial", trial=trial.number, slot=worker.slot.name, attempt=trial.attempt,
                        params=trial.params, resume=resume)
        message = {"op": "trial", "trial": trial.number, "attempt": trial.attempt, "profile": trial.profile,
                   "run_dir": str(directory), "resume": resume}
        if self.spec.of_program:
            message.update(params=trial.params, objective=self.spec.metric, direction=self.spec.direction,
                           code=self._code())
        try:
            worker.handle.send(message)
        except WorkerGone:
            pass  # its output ends next: _lost gives the trial back
        self._write(trial, lambda: trial.handle.set_user_attr("slot", worker.slot.name))  # after the send: the dashboard's sweep view

    def _code(self) -> dict[str, Any]:
        """The program's code as this master reads its workdir, once a sweep ({}: no work tree):
        each trial records it, wherever it runs (gputui.runs.provenance)."""
        if self.code is None:
            from pathlib import Path

            from gputui.runs.provenance import code_version

            version = code_version(Path(self.base.resolve().workdir or ".").expanduser())
            self.code = version.fields() if version is not None else {}
        return self.code

    def _retry(self, trial: Trial, error: str, slot: str) -> None:
        trial.errors.append(error)
        if trial.attempt >= MAX_ATTEMPTS:
            self._tell(trial, "fail", error=error)
            return
        self.trials.requeue(trial, slot)
        self.view.sweep("requeued", trial=trial.number, slot=slot, attempt=trial.attempt, message=error)

    def _tell(self, trial: Trial, state: str, value: float | None = None, error: str | None = None,
              slot: str | None = None) -> None:
        """Tell the study after the next dispatch: the freed worker gets its next trial first."""
        self.trials.finish(trial, Outcome(state, value, error, slot))

    def _flush(self) -> None:
        for trial in self.trials.queue(TrialState.FINISHED):
            self._tell_now(trial)

    def _write(self, trial: Trial, write: Callable[[], Any]) -> bool:
        """Write something of `trial` to the study; False (and a warning, once) when the study has
        it finished already: someone else told it (another master, optuna-dashboard)."""
        if trial.orphaned:
            return False
        try:
            write()
        except (RuntimeError, ValueError) as exc:  # optuna: UpdateFinishedTrialError, "Cannot tell a FAIL trial"
            trial.orphaned = True
            self.view.sweep("warning", trial=trial.number,
                            message=f"trial {trial.number} is finished in the study already ({exc}): did another "
                            "process tell it? This master's result for it is not recorded")
            return False
        return True

    def _tell_now(self, trial: Trial) -> None:
        from optuna.trial import TrialState as Told

        outcome = self.trials.told(trial)
        state, value, error, slot = outcome.state, outcome.value, outcome.error, outcome.slot
        p = self.progress
        handle = trial.handle

        def attrs() -> None:
            if error:
                handle.set_user_attr("error", error[:2000])
            handle.set_user_attr("attempts", trial.attempt)
            if slot:
                handle.set_user_attr("slot", slot)

        told: dict[str, Any] = {"values": value} if state == "complete" else {
            "state": Told.PRUNED if state == "pruned" else Told.FAIL}
        if not (self._write(trial, attrs) and self._write(trial, lambda: self.study.tell(handle, **told))):
            return  # not counted: the study's own record of it stands
        if state == "complete":
            p.complete += 1
            self._consider_best(trial.number, value)
        elif state == "pruned":
            p.pruned += 1
        else:
            p.failed += 1
        p.done += 1
        self.view.sweep("trial_done", trial=trial.number, state=state, value=value, attempt=trial.attempt,
                        slot=slot, error=error, params=trial.params)

    def _event(self, worker: Worker, message: dict[str, Any]) -> None:
        trial = worker.busy
        event = message.get("data")
        if trial is None or message.get("trial") != trial.number or not isinstance(event, dict):
            return
        kind = event.get("event")
        stamp = protocol.number(event.get("time"))
        if kind in ("done", "interrupted", "error"):
            worker.last_end = stamp
        elif kind == "start" and worker.last_end is not None and stamp is not None:
            # the worker's own clock, from one trial's last event to the next one's first: the time the
            # worker sat idle between trials (the master's round trip included), whatever the master's lag
            self.turnarounds_ms.append(max(0.0, 1000 * (stamp - worker.last_end)))
            worker.last_end = None
        if kind == "start":
            startup = protocol.number(message.get("startup_ms"))
            if startup is not None:
                self.startups_ms.append(startup)
        self.view.run_event(trial.number, worker.slot.name, event)
        index = protocol.integer(message.get("eval"))
        if self.spec.of_program:
            self._program_report(worker, trial, event, index)
            return
        acc = protocol.number(event.get("test_acc"))
        if kind not in ("eval", "epoch") or index is None or acc is None or trial.state is TrialState.STOPPING:
            return
        if self.spec.metric == "time_to_accuracy":
            if acc >= (self.spec.target or 100.0):
                trial.reached_s = protocol.number(event.get("elapsed_s"))
                self._stop_trial(worker, trial, "target")
                return
            reported = 100.0 - acc  # the error falls as the time would
        else:
            reported = acc
        if index - 1 <= trial.last_step:
            return  # a retry evaluates again what its checkpoint had not kept: the study keeps the first value
        trial.last_step = index - 1
        if not self._write(trial, lambda: trial.handle.report(reported, step=index - 1)):
            return
        if self.spec.pruner != "none" and trial.handle.should_prune():
            self._stop_trial(worker, trial, "pruned")

    def _program_report(self, worker: Worker, trial: Trial, event: dict[str, Any], index: int | None) -> None:
        """A program's `metrics` event with the objective in it (its worker marks it with `eval`, the
        program's step + 1): the value goes to the study at that step, and the pruner is asked."""
        values = event.get("values")
        value = protocol.number(values.get(self.spec.metric)) if isinstance(values, dict) else None
        if (event.get("event") != "metrics" or index is None or value is None or index - 1 <= trial.last_step
                or trial.state is TrialState.STOPPING):
            return  # a retry reports its steps again: the study keeps the first attempt's
        trial.last_step = index - 1
        if not self._write(trial, lambda: trial.handle.report(value, step=index - 1)):
            return
        if self.spec.pruner != "none" and trial.handle.should_prune():
            self._stop_trial(worker, trial, "pruned")

    def _stop_trial(self, worker: Worker, trial: Trial, reason: str) -> None:
        self.trials.stop(trial, reason)
        try:
            worker.handle.send({"op": "stop", "trial": trial.number, "reason": reason})
        except WorkerGone:
            pass

    def _result(self, worker: Worker, message: dict[str, Any]) -> None:
        trial = worker.busy
        if trial is None or message.get("trial") != trial.number:
            return
        worker.busy = None
        self.spend.trial_s.append(self.clock() - trial.started)
        outcome = message.get("outcome")
        slot = worker.slot.name
        acc = protocol.number(message.get("test_acc"))
        if outcome == "error":
            error = str(message.get("error") or "the trial failed")[:2000]
            if message.get("reason") == "nan":
                trial.errors.append(error)
                self._tell(trial, "fail", error=error, slot=slot)
            else:
                self._retry(trial, error, slot)
            return
        if trial.stop_reason == "pruned" and outcome == "stopped":
            self._tell(trial, "pruned", slot=slot)
        elif self.spec.of_program and outcome == "done":
            value = protocol.number(message.get("value"))
            if value is None:  # it would not report it on a second try either
                self._tell(trial, "fail", slot=slot, error=f"the program ended without reporting {self.spec.metric} "
                           f"(report.log({self.spec.metric}=...), or a [run] metrics_regex group of that name)")
            else:
                self._tell(trial, "complete", value, slot=slot)
        elif self.spec.metric == "time_to_accuracy":
            if trial.reached_s is not None:
                self._tell(trial, "complete", trial.reached_s, slot=slot)
            else:
                self._tell(trial, "fail", slot=slot, error=f"did not reach {self.spec.target:g}% test accuracy")
        elif outcome == "done" and acc is not None:
            self._tell(trial, "complete", acc, slot=slot)
        else:
            self._retry(trial, f"the trial ended without a result ({outcome})", slot)

    def _handle(self, wid: int, line: str | None) -> None:
        worker = self.workers.get(wid)
        if worker is None:
            return
        if line is None:
            self._lost(worker)
            return
        tally = self.tallies.setdefault(worker.slot.name, outside.Tally(f"the worker on slot {worker.slot.name}"))
        message = protocol.decode(line, tally)
        warning = tally.warning()  # the first bad line of a slot's workers is said; a flood is counted
        if warning is not None:
            self.view.sweep("warning", slot=worker.slot.name, message=warning)
        if message is None:
            return
        op = message["op"]
        if op == "ready":
            worker.ready = True
            self.view.sweep("slot", slot=worker.slot.name, device=str(message.get("device")), state="ready",
                            pid=protocol.integer(message.get("pid")), load_s=protocol.number(message.get("load_s")))
        elif op == "fatal":
            worker.fatal = str(message.get("error"))[:500]
        elif op == "event":
            self._event(worker, message)
        elif op == "result":
            self._result(worker, message)

    # -- the loop ------------------------------------------------------------------------
    def _over(self) -> bool:
        return (self.progress.done >= self.spec.trials or self.stop.is_set()
                or (self.budget_reached and not self._running()))

    def run(self) -> Progress:
        """Run until `trials` are finished, the budget stops new ones, or `stop` is set."""
        try:
            self.start_slots()
            while True:
                self._dispatch()
                self._flush()
                if self._over():
                    break
                self._ask_ahead()
                if self._over():
                    break
                if not self.workers:
                    reasons = "; ".join(sorted(set(self.fatal_reasons))) or "they exited"
                    raise GputuiError(f"sweep {self.spec.name}: no worker is left ({reasons}); continue with "
                                      f"`gputui sweep --resume {self.spec.name}` once fixed")
                try:
                    wid, line = self.inbox.get(timeout=1.0)
                except queue.Empty:
                    self._show_progress()
                    continue
                self._handle(wid, line)
                self._show_progress()
        finally:
            self._shutdown()
        return self._show_progress()

    def _show_progress(self) -> Progress:
        p = self.progress
        p.running = len(self._running())
        p.spent_usd = self.spend.spent()
        if self.budget_reached:
            p.note = "budget reached"
        elif self.stop.is_set():
            p.note = "stopping"
        self.view.progress(p)
        return p

    def _shutdown(self) -> None:
        """Workers end; trials still held go back to the study's queue (requeued) for --resume; every
        slot is closed. Each of these is a step of its own: one that raises is reported and the
        rest still run (a cloud slot's close releases paid slaves)."""
        self.shutting_down = True
        steps: list[tuple[str, Callable[[], None]]] = [
            (f"tell the study trial {t.number}", partial(self._tell_now, t))
            for t in self.trials.queue(TrialState.FINISHED)]
        for worker in list(self.workers.values()):
            steps.append((f"end worker {worker.slot.name}", partial(self._end_worker, worker)))
        held = (self._running() + list(reversed(self.trials.queue(TrialState.PENDING)))
                + self.trials.queue(TrialState.ASKED))
        for worker in self.workers.values():
            worker.busy = None
        for trial in held:
            self.trials.give_back(trial)
        steps += [(f"give trial {t.number} back to the study", partial(self._give_back, t)) for t in held]
        steps += [(f"close slot {slot.name}", slot.close) for slot in self.slots]
        self._run_steps(steps)

    def _end_worker(self, worker: Worker) -> None:
        self.spend.release(worker.wid)
        try:
            worker.handle.send({"op": "exit"})
        except WorkerGone:
            pass
        finally:
            worker.handle.kill()

    def _give_back(self, trial: Trial) -> None:
        from optuna.trial import TrialState as Told

        if trial.orphaned:
            return
        wrote = self._write(trial, lambda: trial.handle.set_user_attr(studies.REQUEUED, True))
        if not (wrote and self._write(trial, lambda: self.study.tell(trial.handle, state=Told.FAIL))):
            return  # finished by someone else: theirs to run again
        self.study.enqueue_trial(dict(trial.params), user_attrs={studies.REQUEUED_FROM: trial.number})
        self.view.sweep("requeued", trial=trial.number, attempt=trial.attempt,
                        message="the sweep stopped first; `gputui sweep --resume` runs it again")

    def _run_steps(self, steps: Sequence[tuple[str, Callable[[], None]]]) -> None:
        """Run every step whatever the ones before raised; each failure is reported once. An
        interrupt (KeyboardInterrupt) is raised again once all the steps have run."""
        interrupted: BaseException | None = None
        for what, step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - any failure of one step is reported, the next runs
                message = f"{what}: {str(exc) or type(exc).__name__}"
                self.shutdown_errors.append(message)
                self.view.sweep("shutdown_failed", step=what, message=str(exc) or type(exc).__name__)
            except BaseException as exc:  # noqa: BLE001 - raised again below, once the slots are closed
                interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted

    def summary(self) -> dict[str, Any]:
        t = sorted(self.turnarounds_ms)
        s = sorted(self.startups_ms)
        return {"turnaround_ms_median": statistics.median(t) if t else None,
                "startup_ms_median": statistics.median(s) if s else None}
