"""DDP through torchrun (torch.distributed.run): the launcher side and the worker side.

`gputui run --strategy ddp` starts `python -m torch.distributed.run --standalone ...
-m gputui.train.distributed --run-dir DIR`; each rank reads the run's resolved
profile, trains its share of every global batch, and rank 0 writes the events and
checkpoints. The launching process tails events.jsonl and shows it, so the output
is the same as a single-process run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

from gputui.errors import GputuiError, UserError
from gputui.runs import RunDir

LAUNCHER_LOG = "launcher.log"


def torchrun_command(run: RunDir, nproc: int, resume: bool) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "-m",
        "gputui.train.distributed",
        "--run-dir",
        str(run.path),
    ]
    return cmd + (["--resume"] if resume else [])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    """Linux: the launcher gets SIGTERM if gputui itself dies, so no trainer is orphaned."""
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def launch(run: RunDir, nproc: int, resume: bool, show: Callable[[dict[str, Any]], None]) -> str:
    """Run torchrun to the end, showing rank 0's events; return 'done' or 'interrupted'."""
    offset = run.events.stat().st_size if run.events.exists() else 0
    log_path = run.path / LAUNCHER_LOG
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            torchrun_command(run, nproc, resume),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None,
            start_new_session=not sys.platform.startswith("linux"),
        )
    signals = {"count": 0}

    def forward(signum: int, _frame: Any) -> None:
        signals["count"] += 1
        sig = signal.SIGTERM if signals["count"] == 1 else signal.SIGKILL
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    last: dict[str, Any] | None = None
    buffer = b""
    try:
        with open(run.events, "ab+") as fh:
            fh.seek(offset)
            while True:
                finished = proc.poll() is not None
                chunk = fh.read()
                if chunk:
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            last = json.loads(line)
                            show(last)
                elif finished:
                    break
                else:
                    time.sleep(0.05)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    kind = last.get("event") if last else None
    if kind in ("done", "interrupted"):
        return str(kind)
    if kind == "error":
        error = UserError if last and last.get("exit_code") == 2 else GputuiError
        raise error(str(last.get("message") if last else ""))
    if signals["count"]:
        return "interrupted"
    raise GputuiError(f"ddp workers failed (torchrun exit {proc.returncode}): {_last_line(log_path)}; see {log_path}")


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
    tdist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return device


def error_event(exc: GputuiError) -> dict[str, Any]:
    """The `error` event a rank emits before it exits with the error's code."""
    return {"event": "error", "time": round(time.time(), 3), "message": str(exc), "exit_code": exc.exit_code}


def leave_group() -> None:
    """Destroy this process's group if it joined one (after training, or after an error)."""
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()


def worker_main(argv: list[str] | None = None) -> int:
    """One torchrun rank: train the run in --run-dir; rank 0 writes events and checkpoints."""
    parser = argparse.ArgumentParser(prog="gputui-ddp-worker")
    parser.add_argument("--run-dir", required=True, type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)

    from gputui.profiles import load_profile
    from gputui.runs import EventLog, encode
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
        trainer = Trainer(cfg, run, data, device, emit, stop, dist=Dist(rank, world))
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
    raise SystemExit(worker_main())
