"""`gputui sweep PROFILE`: a hyper-parameter search over the profile's `[sweep]` space, many trials
at once on every slot (Optuna's TPE and median pruner; gputui's long-lived workers).
`gputui sweep --resume NAME` continues one; `gputui sweep show NAME` shows one."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gputui.model.units import plural


def register(subparsers: Any) -> None:
    sweep = subparsers.add_parser(
        "sweep", help="hyper-parameter search: many runs at once on every slot",
        usage="gputui sweep PROFILE [--json] [--workers N] [--trials N] [--name NAME]\n"
              "       gputui sweep --resume NAME [--json] [--workers N] [--trials N]\n"
              "       gputui sweep show NAME [--json] [--run [FILE]]",
        description="Search the [sweep] space of PROFILE with Optuna (TPE, median pruner), one long-lived "
        "worker per slot (every local GPU, or the CPU's cores). The study lives in the user data dir's "
        "sweeps/sweeps.db: optuna-dashboard sqlite:///PATH opens it. `show NAME` prints the trials sorted by "
        "the objective, the best parameters and the parameter importances.")
    sweep.add_argument("target", nargs="?", metavar="PROFILE|show", help="a profile with a [sweep] table, or `show`")
    sweep.add_argument("name", nargs="?", metavar="NAME", help="show: the sweep to show")
    sweep.add_argument("--resume", metavar="NAME", help="continue sweep NAME (its running trials are asked again)")
    sweep.add_argument("--name", dest="study_name", metavar="NAME", help="name of the study (default: [sweep] name, "
                       "or the profile's file name)")
    sweep.add_argument("--trials", type=int, metavar="N", help="trials to finish (default: [sweep] trials)")
    sweep.add_argument("--workers", type=int, metavar="N", help="local workers (default: [sweep] workers, or one "
                       "per GPU times trials_per_gpu, or one per CPU core)")
    sweep.add_argument("--json", action="store_true", help="JSON lines on stdout: the sweep's happenings and every "
                       "trial's run events")
    sweep.add_argument("--run", nargs="?", const="", metavar="FILE", help="show: write the best trial's run profile "
                       "to FILE (default: NAME-best.toml) for `gputui run --profile FILE`")
    sweep.set_defaults(handler=cmd_sweep)


def cmd_sweep(args: argparse.Namespace) -> int:
    from gputui.model.errors import UserError

    if args.target == "show":
        if not args.name:
            raise UserError("sweep show: name the sweep: gputui sweep show NAME")
        return _show(args)
    if args.name is not None:
        raise UserError(f"sweep: unexpected {args.name!r} (gputui sweep PROFILE, or gputui sweep show NAME)")
    if args.run is not None:
        raise UserError("--run goes with show: gputui sweep show NAME --run [FILE]")
    if args.trials is not None and args.trials < 1:
        raise UserError(f"--trials {args.trials}: expected a whole number >= 1")
    if args.workers is not None and args.workers < 0:
        raise UserError(f"--workers {args.workers}: expected a whole number >= 0")
    if args.resume is not None:
        if args.target is not None:
            raise UserError("--resume NAME takes no profile: a sweep keeps the profile it started with")
        if args.study_name is not None:
            raise UserError("--name does not go with --resume (the sweep keeps its name)")
        return _sweep(args, resume=args.resume)
    if args.target is None:
        raise UserError("sweep: name a profile with a [sweep] table (e.g. profiles/sweep.toml), "
                        "or gputui sweep show NAME")
    return _sweep(args, resume=None)


def _show(args: argparse.Namespace) -> int:
    from gputui.views import cloud as view
    from gputui.sweep import show

    if args.run is not None:
        path = show.write_best_profile(args.name, Path(args.run).expanduser() if args.run else None)
        view.say(f"wrote {path}; train it again with: gputui run --profile {path}")
        return 0
    data = show.report(args.name)
    if args.json:
        view.print_json(data)
    else:
        show.print_report(data)
    return 0


def _sweep(args: argparse.Namespace, resume: str | None) -> int:
    from gputui.views import cloud as view
    from gputui.model.errors import UserError
    from gputui.sweep import study as studies
    from gputui.sweep.slots import sweep_slots
    from gputui.sweep.space import load_spec

    study: Any = None
    if resume is None:
        profile, spec = load_spec(Path(args.target))
        if args.study_name is not None:
            from gputui.sweep.space import NAME_RE

            if not NAME_RE.match(args.study_name):
                raise UserError(f"--name {args.study_name}: letters, digits, '_', '.' or '-' (at most 64)")
            spec = replace(spec, name=args.study_name)
    else:
        study, profile, spec = studies.load(resume)
    if args.trials is not None:
        spec = replace(spec, trials=args.trials)
    # One master per study: a second one would requeue the first's running trials under it (and
    # start slots of its own). Refused before any slot starts or any trial is touched.
    with studies.master_lock(spec.name) as lock:
        if not lock.mine:
            held = f" (pid {lock.holder})" if lock.holder is not None else ""
            raise UserError(f"sweep {spec.name} is running{held}: stop it first, or wait")
        return _master(args, profile, spec, study)


def _master(args: argparse.Namespace, profile: Any, spec: Any, study: Any) -> int:
    """The sweep, under its master lock: `study` is the one resumed, or None for a new one."""
    from gputui.views import cloud as view
    from gputui.model.errors import UserError
    from gputui.sweep import study as studies
    from gputui.sweep.slots import sweep_slots

    resume = spec.name if study is not None else None
    slots = sweep_slots(profile, spec, studies.sweeps_home() / spec.name / "workers", args.workers)
    if not slots:
        raise UserError(f"sweep {spec.name}: no slot to run trials on ([sweep] workers = 0 or --workers 0, and no "
                        "GPU); give workers >= 1")
    from gputui.sweep.cloudslots import fleet_name
    from gputui.sweep.scheduler import Scheduler
    from gputui.sweep.view import make_view

    stop = threading.Event()
    view_ = make_view(args.json, spec.metric)
    scheduler = Scheduler(None, spec, profile.run, slots, view_, stop)
    requeued: list[int] = []
    try:
        if resume is None:
            scheduler.start_slots()  # the workers import torch and load the data while Optuna makes the study
            study = studies.create(spec)
        else:
            requeued = studies.requeue_running(study)
            study.set_user_attr("trials", spec.trials)
        scheduler.attach(study)
    except BaseException:
        scheduler.abort()  # the slots are released (cloud slaves) whatever went wrong
        view_.close()
        raise
    view_.sweep("start", name=spec.name, trials=spec.trials, slots=len(slots), storage=studies.storage_url(),
                requeued=requeued or None, resumed=resume is not None)
    # With [cloud], the fleet's slaves carry the sweep's cluster name: the run goes under it too.
    cluster = fleet_name(spec.name) if "cloud" in profile.tables else "local"
    _ledger(spec.name, None, cluster)
    status = "failed"
    try:
        with _stop_on_signals(stop, scheduler):
            progress = scheduler.run()
        status = "interrupted" if stop.is_set() else "done"
    finally:
        _ledger(spec.name, status, cluster)
        view_.close()
    view_.sweep("end", name=spec.name, done=progress.done, trials=spec.trials, complete=progress.complete,
                pruned=progress.pruned, failed=progress.failed, best=progress.best, best_trial=progress.best_trial,
                spent_usd=round(progress.spent_usd, 6), stopped=stop.is_set() or None,
                budget_reached=scheduler.budget_reached or None, **scheduler.summary())
    if stop.is_set() or progress.done < spec.trials:
        why = "stopped" if stop.is_set() else "the budget stopped it"
        view.say(f"sweep {spec.name}: {why} at {progress.done}/{spec.trials}; continue with: "
                 f"gputui sweep --resume {spec.name}")
    view.say(f"see it with: gputui sweep show {spec.name}; optuna-dashboard {studies.storage_url()}")
    if scheduler.shutdown_errors:
        view.say(f"sweep {spec.name}: {plural(len(scheduler.shutdown_errors), 'step')} of its shutdown failed (above)")
        return 1
    return 0


def _ledger(name: str, ended: str | None, cluster: str) -> None:
    """The sweep in the cost ledger under its own name (never fails the sweep)."""
    import sqlite3

    from gputui.cloud.ledger import Ledger
    from gputui.model.errors import GputuiError
    from gputui.sweep.cloudslots import fleet_name

    try:
        with Ledger() as ledger:
            if ended is None:
                ledger.start_run(fleet_name(name), cluster, time.time())
            else:
                ledger.end_run(fleet_name(name), time.time(), ended)
    except (GputuiError, sqlite3.Error, OSError) as exc:
        print(f"gputui: warning: sweep not recorded in the cost ledger ({exc})", file=sys.stderr)


class _stop_on_signals:
    """SIGTERM/SIGINT/SIGHUP: no new trial, running ones go back to the study for --resume.
    A second SIGINT stops at once, but not while the slots are being closed (that releases the
    cloud slaves, which cost money until then)."""

    def __init__(self, stop: threading.Event, scheduler: Any) -> None:
        self.stop, self.scheduler = stop, scheduler
        self.previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.stop.is_set() and signum == signal.SIGINT and not self.scheduler.shutting_down:
            raise KeyboardInterrupt
        self.stop.set()
        self.scheduler.inbox.put((-1, ""))  # wake the loop

    def __enter__(self) -> "_stop_on_signals":
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
