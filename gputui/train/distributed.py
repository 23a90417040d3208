"""DDP through torchrun (torch.distributed.run): the launcher side and the worker side.

`gputui run --strategy ddp` starts torchrun (`python -m gputui.train.launch --nnodes=1
--rdzv-backend=gputui ... -m gputui.train.distributed --run-dir DIR`: gputui's static
rendezvous, a client of the loopback store this process serves, its keys under a secret
token passed in the environment; nothing from the store is unpickled); each rank reads the run's resolved
profile, trains its share of every global batch, and rank 0 writes the events and
checkpoints. The launching process tails events.jsonl and shows it, so the output
is the same as a single-process run.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Mapping, NoReturn

from gputui.model.errors import GputuiError, UserError
from gputui.model import outside
from gputui.model.lines import LineSplitter
from gputui.runs.store import RunDir
from gputui.model.supervisor import STOP_SIGNALS, Tree, become_subreaper
from gputui.train.rdzv import BACKEND, LAUNCHER, LOOPBACK, TOKEN_ENV, clean_env, new_token, serve_store

LAUNCHER_LOG = "launcher.log"
READ_CHUNK = 1 << 20  # bytes of rank 0's events read at a time


def torchrun_command(run: RunDir, nproc: int, resume: bool, rdzv_port: int) -> list[str]:
    """torchrun on this machine alone, meeting at the loopback store gputui serves on `rdzv_port`
    through gputui's static rendezvous (gputui.train.launch: node rank 0 of 1, nothing unpickled;
    not `--standalone`, whose c10d store listens on every interface and feeds the agent pickles)."""
    cmd = [
        sys.executable,
        "-m",
        LAUNCHER,
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        f"--rdzv-backend={BACKEND}",
        f"--rdzv-endpoint={LOOPBACK}:{rdzv_port}",
        f"--rdzv-id={run.run_id}",
        "--rdzv-conf=rank=0",
        f"--local-addr={LOOPBACK}",
        "--max-restarts=0",
        "-m",
        "gputui.train.distributed",
        "--run-dir",
        str(run.path),
    ]
    return cmd + (["--resume"] if resume else [])


def local_group_env(base: Mapping[str, str], token: str) -> dict[str, str]:
    """The environment of a one-machine torchrun: no credentials, every socket on loopback
    (the workers' store on MASTER_ADDR = 127.0.0.1, gloo and NCCL's bootstrap on `lo`), and the
    rendezvous token (an environment is private to its account, a command line is not)."""
    env = clean_env(base)
    env[TOKEN_ENV] = token
    env.setdefault("PYTHONUNBUFFERED", "1")
    if sys.platform.startswith("linux"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
        env.setdefault("NCCL_SOCKET_IFNAME", "lo")
    return env


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the launcher gets SIGTERM if gputui itself dies, so no trainer is orphaned."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def launch(run: RunDir, nproc: int, resume: bool, show: Callable[[dict[str, Any]], None],
           env: Mapping[str, str] | None = None) -> str:
    """Run torchrun to the end, showing rank 0's events; return 'done' or 'interrupted'. `env`:
    more for the ranks' environment (their threads: gputui.train.threads.child_env)."""
    offset = run.events.stat().st_size if run.events.exists() else 0
    log_path = run.path / LAUNCHER_LOG
    env = {**local_group_env(os.environ, new_token()), **(env or {})}
    store = serve_store(LOOPBACK, 0, timeout_s=600)
    become_subreaper()  # workers whose torchrun dies come back to us, not to init
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            torchrun_command(run, nproc, resume, store.port),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            start_new_session=not sys.platform.startswith("linux"),
        )
    tree = Tree(proc, marker=str(run.path), launcher=True)  # torchrun and its workers (each in a session of its own)
    signals = {"count": 0}

    def forward(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        if signals["count"] == 1:  # every rank checkpoints; the supervisor's grace bounds the wait
            threading.Thread(target=tree.stop, name="gputui-ddp-stop", daemon=True).start()
        else:
            tree.kill()

    previous = {s: signal.signal(s, forward) for s in STOP_SIGNALS}
    last: dict[str, Any] | None = None
    tally = outside.Tally(f"the events file {run.events}")
    lines = LineSplitter(outside.MAX_LINE)  # rank 0's events, a line at most MAX_LINE (longer: dropped)
    looked = time.monotonic()
    try:
        with open(run.events, "ab+") as fh:
            fh.seek(offset)
            while True:
                finished = proc.poll() is not None
                if time.monotonic() - looked > 1.0:  # remember the workers while torchrun still shows them
                    tree.refresh()
                    looked = time.monotonic()
                chunk = fh.read(READ_CHUNK)
                if chunk:
                    last = show_lines(lines.feed(chunk), show, tally) or last
                elif finished:
                    break
                else:
                    time.sleep(0.05)
    except BaseException:  # e.g. stdout closed under us (`| head`): the run stops the one way, checkpointing
        tree.stop()
        raise
    finally:
        try:
            tree.kill()  # nothing of the run outlives the command (a no-op once all have exited)
            del store  # the store stops listening as it goes (nothing else holds it)
        finally:  # only now: a signal in between is still forwarded, never a KeyboardInterrupt
            for s, handler in previous.items():
                signal.signal(s, handler)
    kind = last.get("event") if last else None
    if kind in ("done", "interrupted"):
        return str(kind)
    if kind == "error":
        error = UserError if last and last.get("exit_code") == 2 else GputuiError
        raise error(str(last.get("message") if last else ""))
    if signals["count"]:  # stopped before the ranks said they checkpointed: say what there is
        print(_stopped_line(run), file=sys.stderr)
        return "stopped"
    raise GputuiError(f"ddp workers failed (torchrun exit {proc.returncode}): {_last_line(log_path)}; see {log_path}")


def show_lines(lines: list[bytes], show: Callable[[dict[str, Any]], None], tally: outside.Tally) -> dict[str, Any] | None:
    """Show each event of rank 0's `lines`; the last one shown (None if none was). A line that is
    not an event (garbage, hostile JSON) is skipped: the first is said in a warning, the rest counted."""
    last = None
    for line in lines:
        event = tally.line(line) if line.strip() else None
        warning = tally.warning()
        if warning is not None:
            from gputui.model import events

            show(events.make("warning", reason="bad_line", message=warning))
        if event is not None:
            last = event
            show(event)
    return last


def _stopped_line(run: RunDir) -> str:
    from gputui.model.paths import runs_home

    ref = run.run_id if run.path.parent == runs_home() else str(run.path)
    if not run.checkpoint.is_file():
        return "stopped before the first checkpoint: nothing to resume; start a new run"
    return (f"stopped before the workers saved this point; the last checkpoint is in {run.path}; "
            f"resume with: gputui run --resume {ref}")


def _last_line(path: Path) -> str:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no output"
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return (errors or lines or ["no output"])[-1][:200]


def init_rank(cfg: Any, local_rank: int) -> Any:
    """This rank's device (its GPU, or the CPU with `threads`) and its process group (NCCL or gloo)."""
    import torch
    import torch.distributed as tdist

    from gputui.train.devices import resolve_device

    device, _why = resolve_device(cfg.device)
    if device.type == "cuda":
        index = cfg.gpus[local_rank] if cfg.gpus else local_rank
        device = torch.device("cuda", index)
        torch.cuda.set_device(device)
    elif cfg.threads:
        torch.set_num_threads(cfg.threads)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" or "MASTER_ADDR" not in os.environ:
        tdist.init_process_group(backend)
    else:  # serve the workers' store on MASTER_ADDR alone (env:// would listen on every interface)
        from gputui.train.rdzv import worker_store

        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        tdist.init_process_group(backend, store=worker_store(rank, world), rank=rank, world_size=world)
    return device


def error_event(exc: GputuiError) -> dict[str, Any]:
    """The `error` event a rank emits before it exits with the error's code (with the step,
    reason and checkpoint of a run that diverged: gputui.train.loop.Diverged's `fields`)."""
    from gputui.model import events

    return events.make("error", message=str(exc), exit_code=exc.exit_code, **getattr(exc, "fields", {}))


def leave_group() -> None:
    """Destroy this process's group if it joined one (after training, or after an error)."""
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()


def exit_rank(code: int) -> NoReturn:
    """End a rank's process, once its group is left and its files closed, without Python's
    interpreter teardown. torch's gloo worker threads outlive `destroy_process_group` (DDP keeps the
    group), and one may still be releasing the last collective's tensors as Python finalizes: it then
    needs the GIL and aborts the whole process (SIGABRT, "terminate called without an active
    exception", pytorch/pytorch#190489): a finished run reported as failed, about one in 40 beside
    two CPU hogs here. os._exit skips that teardown; nothing is lost (stdout flushed here)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader gone: nothing left to say to it
            pass
    os._exit(code)


def worker_main(argv: list[str] | None = None) -> int:
    """One torchrun rank: train the run in --run-dir; rank 0 writes events and checkpoints."""
    parser = argparse.ArgumentParser(prog="gputui-ddp-worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)

    from gputui.config.profile import load_profile
    from gputui.runs.store import EventLog, encode
    from gputui.train.data import load_dataset
    from gputui.train.loop import Dist, StopFlag, Trainer

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    run = RunDir(args.run_dir)
    log = EventLog(run.events) if rank == 0 else None

    def emit(event: dict[str, Any]) -> None:
        if log is not None:
            log.write(encode(event))

    stop = StopFlag()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, _f: stop.set(signal.Signals(s).name))
    code = 0
    try:
        cfg = load_profile(run.profile).run.resolve()
        device = init_rank(cfg, local_rank)
        data = load_dataset(Path(cfg.data) if cfg.data else None)
        from gputui.train.threads import rank_fields

        trainer = Trainer(cfg, run, data, device, emit, stop, dist=Dist(rank, world),
                          start_info=rank_fields(cfg.threads, os.environ))
        trainer.train(resume=args.resume)
    except GputuiError as exc:
        emit(error_event(exc))
        code = exc.exit_code
    finally:
        leave_group()
        if log is not None:
            log.close()
    return code


if __name__ == "__main__":
    exit_rank(worker_main())
