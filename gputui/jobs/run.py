"""`gputui run`: from a profile and flags to a finished (or cleanly interrupted) run.

Resolves the settings (model recipe < profile < flags), creates or reopens the run
directory, and trains in this process (`single`, `dataparallel`) or through
torchrun (`ddp`), handing every event to the run's events.jsonl and to a view.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Callable

from gputui.runs import store as runs
from gputui.cluster.settings import cluster_profile, remember_cluster
from gputui.views.progress import View
from gputui.model.errors import GputuiError, UserError
from gputui.runs.history import completed_epochs
from gputui.model.paths import profiles_dir, runs_home
from gputui.config.run import RunConfig, RunSettings, only_for
from gputui.config.profile import load_profile
from gputui.model.units import plural
from gputui.model.supervisor import StopFlag, stop_on_signals

# Settings a resumed run may change; the others would break the checkpoint or its schedule.
RESUMABLE = {"epochs", "device", "strategy", "nproc", "gpus", "threads", "evals_per_epoch", "cuda_graph"}


@dataclass(frozen=True)
class RunRequest:
    profile: Path | None
    overrides: RunSettings
    run_dir: Path | None = None
    resume: str | None = None
    program: tuple[str, ...] | None = None  # `gputui run -- PROGRAM ARGS`: the user's own program, in this directory


class AlreadyComplete(Exception):
    """--resume of a run that has trained every epoch asked for: nothing to do (exit 0)."""


def _ref(run: runs.RunDir) -> str:
    """How commands name the run: its id under the default location, else its path."""
    return run.run_id if run.path.parent == runs_home() else str(run.path)


def default_profile() -> Path | None:
    path = profiles_dir() / "local.toml"
    return path if path.is_file() else None


def prepare(req: RunRequest) -> tuple[runs.RunDir, RunConfig, bool]:
    """The run directory, its resolved configuration, and whether it resumes."""
    if req.resume is not None:
        if req.run_dir is not None:
            raise UserError("--run-dir and --resume do not go together: --resume takes a run id or directory")
        if req.profile is not None:
            raise UserError("--profile and --resume do not go together: a resumed run keeps its own profile")
        run = runs.find(req.resume)
        changed = [f.name for f in fields(req.overrides) if getattr(req.overrides, f.name) is not None]
        fixed = sorted(set(changed) - RESUMABLE)
        if fixed:
            flags = ", ".join("--" + name.replace("_", "-") for name in fixed)
            raise UserError(f"{flags}: cannot change when resuming (allowed: --epochs, --device, --strategy, --nproc, --cuda-graph)")
        cfg = load_profile(run.profile).run.merged(req.overrides).resolve()
        if cfg.is_program:
            from gputui.jobs.gpus import free_table

            check(cfg, req.overrides)
            run.profile.write_text(cfg.to_toml() + free_table(run.profile), encoding="utf-8")  # --device auto's [free]
            return run, cfg, True
        validate(cfg)
        done_epochs = completed_epochs(run)
        if done_epochs is not None and cfg.epochs <= done_epochs:
            raise AlreadyComplete(f"run {_ref(run)} is already complete ({plural(done_epochs, 'epoch')}); resume with "
                                  f"--epochs M (more than {done_epochs}) to train more")
        from gputui.jobs.gpus import free_table

        run.profile.write_text(cfg.to_toml() + free_table(run.profile), encoding="utf-8")  # --device auto's [free]
        return run, cfg, True
    profile_path = req.profile if req.profile is not None else default_profile()
    profile = load_profile(profile_path) if profile_path is not None else None
    base = profile.run if profile is not None else RunSettings()
    overrides = req.overrides
    if req.program is not None:
        if not req.program:
            raise UserError("nothing after --: give the program to run, e.g. gputui run -- python train.py")
        overrides = replace(overrides, command=tuple(req.program), workdir=str(Path.cwd()))
    cfg = base.merged(overrides).resolve()
    if cfg.is_program and cfg.trial:  # [run] trial fills {name} in the command, as a sweep's trial does
        cfg = cfg.with_trial()
    if cfg.is_program and profile is not None:
        _check_filled(cfg, profile)
    check(cfg, req.overrides)
    cluster = _check_cluster(profile_path)
    if cluster is not None and cfg.is_program:  # the code that goes to every node fits, before anything starts
        from gputui.cluster.codesync import check_size, workdir_files

        workdir = Path(cfg.workdir or ".").expanduser()
        if not workdir.is_dir():
            raise UserError(f"{workdir}: the program's workdir is not a directory (set [run] workdir)")
        check_size(workdir_files(workdir, cfg.sync_exclude), cfg.sync_max_mb)
    if cluster is None and not cfg.is_program:  # a cluster's nodes check their own devices and data
        validate(cfg)
    run = runs.create(req.run_dir)  # only now: a run that fails a check leaves no directory behind
    from gputui.jobs.gpus import free_table

    try:
        run.profile.write_text(cfg.to_toml() + free_table(profile_path), encoding="utf-8")
    except OSError as exc:
        raise UserError(f"cannot write {run.profile}: {exc.strerror or exc}") from None
    remember_cluster(run.path, profile_path)  # a profile with [cluster] trains across its nodes
    return run, cfg, False


def _check_filled(cfg: RunConfig, profile: Any) -> None:
    """A sweep's profile run alone: a [sweep.params] parameter still written {name} in the command
    has no value here, which the program would get as it is (and fail on, or worse, take)."""
    for param in profile.tables.get("sweep", {}).get("params", ()):
        if any("{" + param.name + "}" in word for word in cfg.command):
            value = param.choices[0] if param.kind == "choice" else param.low
            example = json.dumps(value) if isinstance(value, (str, bool)) else repr(value)
            raise UserError(f"{profile.path}: [run] command has {{{param.name}}}, a [sweep.params] parameter with no "
                            f"value outside a sweep: run it with `gputui sweep {profile.path}`, or give it one in "
                            f"[run] trial, e.g. trial = {{{param.name} = {example}}}")


def _check_cluster(profile_path: Path | None) -> Any:
    """A cluster the master cannot train in is refused before its run directory exists; the
    profile's cluster settings (None: a local run)."""
    if profile_path is None:
        return None
    from gputui.cluster.settings import cluster_settings
    from gputui.config.profile import load_profile

    settings = cluster_settings(load_profile(profile_path))
    refused = settings.master_unreachable() if settings is not None else None
    if refused:
        raise UserError(refused)
    return settings


def validate(cfg: RunConfig) -> None:
    """What a local run needs from this machine, checked before its run directory exists: the
    data directory's four IDX files and the device asked for (torch is imported only to check a
    device other than auto or cpu)."""
    if cfg.data:
        from gputui.train.data import STEMS, find_file

        directory = Path(cfg.data)
        if not directory.is_dir():
            raise UserError(f"{directory}: no such data directory (--data takes a directory of IDX files)")
        for role in STEMS:
            find_file(directory, role)
    if cfg.strategy == "ddp":  # known before any process starts where the process count is
        from gputui.config.run import uneven_batch

        uneven = uneven_batch(cfg.batch_size, cfg.nproc or (2 if cfg.device == "cpu" else 1))
        if uneven is not None:
            raise UserError(uneven)
    if cfg.device not in ("auto", "cpu"):
        from gputui.train.devices import resolve_device

        resolve_device(cfg.device)
    if cfg.gpus and cfg.device != "cpu" and cfg.strategy in ("dataparallel", "ddp"):
        import torch

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        bad = [g for g in cfg.gpus if g >= count]
        if bad and count:
            raise UserError(f"--gpus {','.join(map(str, cfg.gpus))}: only {plural(count, 'CUDA device')} visible "
                            f"(0..{count - 1})")


def check(cfg: RunConfig, flags: RunSettings | None = None) -> None:
    """Cross-field rules the schema cannot express alone (`flags`: what the command line set)."""
    if cfg.is_program:
        if cfg.strategy == "dataparallel":
            raise UserError("strategy dataparallel is for the built-in nets: your program decides how it uses its "
                            "GPUs (use --strategy ddp for torchrun, or single)")
        given = [name for name in only_for("net") if flags is not None and getattr(flags, name) is not None]
        if given:
            names = ", ".join("--" + name.replace("_", "-") for name in given)
            raise UserError(f"{names}: a setting of the built-in nets; pass your program's own flags after --")
    if cfg.strategy == "dataparallel" and cfg.device in ("cpu", "mps"):
        raise UserError(
            f"strategy dataparallel needs CUDA GPUs, not device {cfg.device}; "
            "on a CPU use --strategy ddp --nproc N (gloo) or --strategy single"
        )
    if cfg.strategy != "ddp" and cfg.nproc is not None:
        raise UserError(f"--nproc goes with --strategy ddp (the strategy is {cfg.strategy})")


def execute(run: runs.RunDir, cfg: RunConfig, resume: bool, view: View) -> str:
    """Train; return 'done' or 'interrupted'. Errors are GputuiError subclasses."""
    cluster = cluster_profile(run.path)
    if cfg.is_program and cluster is None:
        from gputui.jobs.program import execute_program

        return execute_program(run, cfg, resume, view)
    if cluster is not None:  # the built-in nets or a program, across the cluster's nodes
        from gputui.cluster.launch import execute_cluster

        return execute_cluster(run, cfg, resume, view, cluster)
    if cfg.strategy == "ddp":
        return _execute_ddp(run, cfg, resume, view)
    return _execute_local(run, cfg, resume, view)


def _execute_local(run: runs.RunDir, cfg: RunConfig, resume: bool, view: View) -> str:
    from gputui.train.startup import Prefetch, warm_dynamo
    from gputui.train.threads import machine, run_threads, take_sample

    sample = take_sample()  # others' CPU use is sampled while torch imports, at no extra wait
    prefetch = Prefetch(Path(cfg.data) if cfg.data else None)  # decodes while torch imports
    import torch

    from gputui.train.devices import resolve_device
    from gputui.train.distributed import error_event
    from gputui.train.loop import Trainer

    warm_dynamo()  # gputui's modules are in: an optimizer that needs torch._dynamo finds it sooner
    device, why = resolve_device(cfg.device)
    if cfg.device == "auto" and device.type == "cuda" and cfg.strategy == "single":
        device, why = _free_gpu(device, why, run.profile)
    start_info: dict[str, Any] = {"device_choice": why}
    if cfg.strategy == "dataparallel":
        if device.type != "cuda":
            raise UserError("strategy dataparallel needs CUDA GPUs and none is available; use single or ddp")
        if cfg.gpus:
            count = torch.cuda.device_count()
            bad = [g for g in cfg.gpus if g >= count]
            if bad:
                raise UserError(f"gpus {bad}: only {plural(count, 'CUDA device')} visible")
            device = torch.device("cuda", cfg.gpus[0])
        start_info["gpus"] = list(cfg.gpus) if cfg.gpus else list(range(torch.cuda.device_count()))
    threads, threads_why = run_threads(cfg.threads, os.environ, view=None if cfg.threads else machine(sample))
    torch.set_num_threads(threads)
    start_info.update(threads=threads, threads_why=threads_why)
    stop = StopFlag()
    with stop_on_signals(stop):
        data = prefetch.dataset()
        log = runs.EventLog(run.events)
        emit = _tee(log, view, stop)
        try:
            trainer = Trainer(cfg, run, data, device, emit, stop, start_info=start_info)
            if not cfg.threads and "OMP_NUM_THREADS" not in os.environ and device.type == "cpu":
                from gputui.train.threads import Governor

                trainer.governor = Governor(threads)  # chosen by gputui: it follows the machine's load
            outcome = trainer.train(resume=resume)
            if outcome == "interrupted" and stop.reason == OUTPUT_CLOSED:  # checkpointed, said in the log; exit 1, as DDP's
                raise BrokenPipeError(OUTPUT_CLOSED)
            return outcome
        except GputuiError as exc:  # the run's last event says why it ended, as a DDP rank's does
            emit(error_event(exc))
            raise
        finally:
            log.close()


def _free_gpu(device: Any, why: str, profile: Path) -> tuple[Any, str]:
    """A single-process network run with `--device auto` on several GPUs takes the least used
    free one by the profile's [free] (gputui.jobs.gpus.net_gpu), not cuda:0 whoever holds it.
    Where NVML cannot tell (no NVML, no UUIDs), cuda:0 as before, and the reason says why."""
    import torch

    from gputui.jobs import gpus

    try:
        count = torch.cuda.device_count()
        if count < 2:
            return device, why
        visible = [str(getattr(torch.cuda.get_device_properties(i), "uuid", "")) for i in range(count)]
        picked = gpus.net_gpu(visible, rule=gpus.free_rule_of(profile))
    except Exception as exc:  # noqa: BLE001 - choosing is an extra: the run goes on on cuda:0
        return device, f"{why}; the free GPU could not be chosen ({type(exc).__name__}: {exc})"
    if picked is None:
        return device, f"{why}; NVML could not match torch's GPUs, so cuda:0"
    return torch.device("cuda", picked[0]), picked[1]


def _execute_ddp(run: runs.RunDir, cfg: RunConfig, resume: bool, view: View) -> str:
    from gputui.train.distributed import launch

    from gputui.train.threads import child_env, run_threads

    nproc = cfg.nproc
    if nproc is None:
        nproc = _visible_gpus(cfg) or 2
    threads, why = run_threads(cfg.threads, os.environ, workers=nproc)  # the ranks share what is free
    return launch(run, nproc, resume, view.show, env=child_env({}, threads, why))


def _visible_gpus(cfg: RunConfig) -> int:
    if cfg.device == "cpu":
        return 0
    import torch

    if not torch.cuda.is_available():
        return 0
    return len(cfg.gpus) if cfg.gpus else torch.cuda.device_count()


OUTPUT_CLOSED = "output closed"  # the stop reason when the command's stdout went away (`| head`)


def _tee(log: runs.EventLog, view: View, stop: StopFlag) -> Callable[[dict[str, Any]], None]:
    """Each event to the run's log, then to the view. Once the view cannot write (its reader
    closed stdout: `gputui run --json | head`), the run stops as one SIGTERM stops it (a
    checkpoint at the next step, `interrupted` in the log) and the view is written no more."""
    shown = [True]

    def emit(event: dict[str, Any]) -> None:
        log.write(runs.encode(event))
        if not shown[0]:
            return
        try:
            view.show(event)
        except BrokenPipeError:
            shown[0] = False
            if not stop.is_set():
                stop.set(OUTPUT_CLOSED)

    return emit


def _record_run(run_id: str, ended: str | None, say: Callable[[str], None]) -> None:
    """Note a local run's start (ended=None) or end in the cost ledger; never fails the run."""
    import sqlite3

    from gputui.cloud.ledger import LOCAL_CLUSTER, Ledger

    try:
        with Ledger() as ledger:
            if ended is None:
                ledger.start_run(run_id, LOCAL_CLUSTER, time.time())
            else:
                ledger.end_run(run_id, time.time(), ended)
    except (GputuiError, sqlite3.Error, OSError) as exc:
        say(f"gputui: warning: run not recorded in the cost ledger ({exc})")


# What gputui writes in a run directory before the run's start event.
BEFORE_START = (runs.PROFILE, runs.EVENTS, runs.PIDFILE, "launcher.log")


def _discard_unstarted(run: runs.RunDir, say: Callable[[str], None]) -> None:
    """A new run that failed a check before it started (a DDP rank's device or data, found only
    there) leaves no directory and no ledger line behind: its error has said everything. What
    gputui wrote there goes, and the directory with it unless something else is in it (--run-dir
    may be a folder of the user's)."""
    if any(isinstance(e, dict) and e.get("event") == "start" for e in runs.read_events(run.events)):
        return
    try:
        for name in BEFORE_START:
            (run.path / name).unlink(missing_ok=True)
        run.path.rmdir()
    except OSError:
        pass  # something else is in it: it stays
    import sqlite3

    from gputui.cloud.ledger import Ledger

    try:
        ledger = Ledger.existing()
        if ledger is not None:
            with ledger:
                ledger.forget_run(run.run_id)
    except (GputuiError, sqlite3.Error, OSError) as exc:
        say(f"gputui: warning: run {run.run_id} left in the cost ledger ({exc})")


def run(req: RunRequest, view: View, say: Callable[[str], None] = lambda msg: print(msg, file=sys.stderr)) -> int:
    """Prepare and execute a run; return the process exit code (0 done or interrupted)."""
    try:
        run_dir, cfg, resume = prepare(req)
    except AlreadyComplete as exc:
        say(str(exc))
        return 0
    local = cluster_profile(run_dir.path) is None  # cluster runs keep their own ledger lines
    if local and cfg.threads:  # a cluster's nodes have CPUs of their own
        from gputui.train.threads import too_many_threads

        # DDP's process count where it is known before torch looks (the least otherwise: no false alarm)
        workers = (cfg.nproc or (2 if cfg.device == "cpu" else 1)) if cfg.strategy == "ddp" else 1
        crowded = too_many_threads(cfg.threads, workers)
        if crowded is not None:
            say(f"gputui: warning: {crowded}")
    # run.pid: any dashboard on this machine can find this run, follow its events and stop it.
    source = None if resume else (req.profile or default_profile())
    runs.write_pid(run_dir, os.getpid(), source.expanduser().resolve() if source is not None else None)
    if local:
        _record_run(run_dir.run_id, None, say)
    outcome = "failed"
    try:
        try:
            outcome = execute(run_dir, cfg, resume, view)
        finally:
            view.close()
            if local:
                _record_run(run_dir.run_id, outcome, say)
            runs.clear_pid(run_dir, os.getpid())
    except UserError:
        if local and not resume:
            _discard_unstarted(run_dir, say)
        raise
    ref = shlex.quote(_ref(run_dir))  # the hints are commands to paste
    if outcome == "interrupted" and cfg.is_program:
        from gputui.jobs.program import CHECKPOINTS, wrote_checkpoint

        saved = run_dir.path / CHECKPOINTS
        kept = (f"the program's checkpoints are in {saved}" if wrote_checkpoint(saved)
                else "the program saved nothing in its checkpoint directory")
        say(f"interrupted: {kept}; resume with: gputui run --resume {ref}")
    elif outcome == "interrupted":
        say(f"interrupted: checkpoint saved in {run_dir.path}; resume with: gputui run --resume {ref}")
    listing = ("gputui runs" if run_dir.path.parent == runs_home()
               else f"gputui runs --dir {shlex.quote(str(run_dir.path.parent))}")
    say(f"run saved in {run_dir.path}; see it with: {listing}, gputui runs export {ref} --csv")
    return 0
