"""Where sweep workers run: this machine's slots, and `sweep_slots`, every slot of a sweep.

A `Slot` (gputui.sweep.base) is a place for one long-lived worker. The local slots: every GPU
NVML sees (`trials_per_gpu` workers on each), or the CPU when there is none (one worker per
core, or `[sweep] workers`). The master never imports torch for this.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator

from gputui.model.errors import UserError
from gputui.model.paths import private_dir, private_opener
from gputui.sweep import protocol
from gputui.sweep.base import Slot, WorkerGone
from gputui.sweep.space import SweepSpec, default_threads
from gputui.train.rdzv import clean_env


class ProcessHandle:
    """A worker in a local subprocess; stderr goes to a log file (its tail explains a death)."""

    def __init__(self, argv: list[str], env: dict[str, str], log: Path) -> None:
        private_dir(log.parent)
        self.log = log
        self._err: IO[bytes] = open(log, "ab", opener=private_opener)
        try:
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                         env=env, text=True, bufsize=1, start_new_session=True)
        except OSError as exc:
            self._err.close()
            raise UserError(f"cannot start a worker ({argv[0]}): {exc.strerror or exc}") from None
        self.pid: int | None = self.proc.pid

    def send(self, message: dict[str, Any]) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(protocol.encode(message) + "\n")
            self.proc.stdin.flush()
        except (OSError, ValueError) as exc:  # BrokenPipe, or closed
            raise WorkerGone(str(exc)) from None

    def lines(self) -> Iterator[str]:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                yield line
        except (OSError, ValueError):
            return

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.kill()
            except OSError:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL not taking
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        if not self._err.closed:
            self._err.close()

    def close_input(self) -> None:
        """Tell the worker to finish (the end of its stdin)."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exit_code(self) -> int | None:
        return self.proc.poll()

    def last_words(self) -> str:
        try:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, self.log.stat().st_size - 4000))
                tail = fh.read().decode(errors="replace")
        except OSError:
            return ""
        lines = [line for line in tail.splitlines() if line.strip() and not line.startswith("gputui: note:")]
        return lines[-1].strip()[:300] if lines else ""


@dataclass
class LocalSlot:
    """A worker on this machine: `python -m gputui worker --device D` in its own session."""

    name: str
    device: str
    threads: int | None
    data: str | None
    logs: Path
    usd_per_hour: float = 0.0
    env: dict[str, str] = field(default_factory=dict)
    program: bool = False  # a sweep of the user's own program: `gputui worker --program` (no torch, no data)

    def spawn(self) -> ProcessHandle:
        argv = [sys.executable, "-m", "gputui", "worker", "--device", self.device]
        if self.program:
            argv.append("--program")
        env = clean_env(os.environ)  # a trial needs no cloud key, token or SSH agent (as DDP's ranks)
        if self.threads:
            argv += ["--threads", str(self.threads)]
            env["OMP_NUM_THREADS"] = str(self.threads)  # before torch starts its pool
        if self.data:
            argv += ["--data", self.data]
        env.update(self.env)
        return ProcessHandle(argv, env, self.logs / f"{self.name}.log")

    def close(self) -> None:
        pass


def local_gpu_count() -> int:
    """GPUs NVML sees here (0 without a driver or pynvml); torch is not imported."""
    from gputui.sources.nvml import NvmlSource

    source = NvmlSource()
    try:
        return source.gpu_count() or 0
    finally:
        source.close()


def local_slots(spec: SweepSpec, run: Any, logs: Path, workers: int | None = None,
                gpus: int | None = None) -> list[LocalSlot]:
    """This machine's slots for a sweep: `trials_per_gpu` on each GPU, or the CPU's workers.

    `workers` (the --workers flag) overrides `[sweep] workers`; `gpus` stands for the NVML count."""
    count = spec.workers if workers is None else workers
    device = run.device or "auto"
    data = None if spec.of_program else run.data
    if device == "cpu" or device == "mps":
        n_gpus = 0
    elif device.startswith("cuda:"):
        n_gpus = 1
    else:
        n_gpus = local_gpu_count() if gpus is None else gpus
    if n_gpus:
        first = int(device.split(":")[1]) if device.startswith("cuda:") else 0
        places = [f"cuda:{first + g}" for g in range(n_gpus) for _ in range(spec.trials_per_gpu)]
        places = [places[i % len(places)] for i in range(count)] if count is not None else places
        threads = spec.threads or default_threads(len(places))
        return [LocalSlot(name=f"{d.replace(':', '')}-{i}", device=d, threads=threads, data=data, logs=logs,
                          program=spec.of_program) for i, d in enumerate(places)]
    n = (os.cpu_count() or 1) if count is None else count
    threads = spec.threads or default_threads(n)
    place = "mps" if device == "mps" else "cpu"
    return [LocalSlot(name=f"{place}-{i}", device=place, threads=threads, data=data, logs=logs,
                      program=spec.of_program) for i in range(n)]


def sweep_slots(profile: Any, spec: SweepSpec, logs: Path, workers: int | None = None) -> list[Slot]:
    """Every slot of a sweep: this machine's (`local_slots`), the [[hosts]]' (gputui.sweep.remote) and
    the [cloud] slaves' the sweep starts (gputui.sweep.cloudslots; released when their slots close).
    A program sweep with slots elsewhere checks its code's size first (gputui.sweep.hostcode), before
    any slot starts, then sends it to each host as the host is made ready."""
    from gputui.sweep.cloudslots import cloud_slots
    from gputui.sweep.hostcode import program_code
    from gputui.sweep.remote import remote_slots

    code = program_code(profile, spec, logs)
    slots: list[Slot] = list(local_slots(spec, profile.run, logs, workers))
    slots += remote_slots(profile, spec, code)
    slots += cloud_slots(profile, spec, code)
    return slots
