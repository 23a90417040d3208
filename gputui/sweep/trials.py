"""The worker's side of a sweep: torch imported once, the data set loaded once, trials one after
another through gputui's own trainer (gputui.train.loop.Trainer), each into its run directory.

The trainer copies the data set to the device in its constructor; a worker keeps that copy for
every trial (the seam below), so the turnaround between two trials is the model's construction,
not a decode or a 190 MB normalisation of MNIST.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from gputui.sweep import protocol

Write = Callable[[dict[str, Any]], None]


def _die_with_parent() -> None:
    """Linux: SIGKILL this worker when its master dies (its stdin's end also stops it)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class DeviceData:
    """Data sets by directory, decoded once, and their device tensors, made once per device."""

    def __init__(self) -> None:
        self._sets: dict[str | None, Any] = {}
        self._tensors: dict[tuple[int, str], Any] = {}

    def dataset(self, directory: str | None) -> Any:
        if directory not in self._sets:
            from gputui.train.data import load_dataset

            self._sets[directory] = load_dataset(Path(directory) if directory else None)
        return self._sets[directory]

    def keep(self, directory: str | None, dataset: Any) -> None:
        self._sets[directory] = dataset

    def install(self) -> None:
        """The seam: the trainer's `to_device` answers from this cache for the arrays it has seen
        (the same numpy arrays of a cached data set), and copies anything else as before."""
        from gputui.train import loop

        original = loop.to_device
        if getattr(original, "_gputui_cached", False):
            return

        def cached(images: Any, labels: Any, device: Any) -> Any:
            key = (id(images), str(device))
            hit = self._tensors.get(key)
            if hit is None or hit[0] is not images:
                hit = (images, original(images, labels, device))
                self._tensors[key] = hit
            return hit[1]

        cached._gputui_cached = True  # type: ignore[attr-defined]
        loop.to_device = cached  # type: ignore[assignment]


class Worker(protocol.CurrentTrial):
    """Runs trials read from `inbox` (decoded messages), writes messages with `write`."""

    def __init__(self, device_spec: str, threads: int | None, data: str | None, write: Write) -> None:
        super().__init__()
        t0 = time.perf_counter()
        from gputui.train.startup import Prefetch

        if data is not None and not Path(data).is_dir():  # said before torch's import, not after
            from gputui.model.errors import UserError

            raise UserError(f"{data}: no such data directory (--data takes a directory of IDX files)")
        prefetch = Prefetch(Path(data) if data else None)  # decodes while torch imports
        import torch

        if threads:
            torch.set_num_threads(threads)
        from gputui.train.devices import resolve_device

        try:
            import torch._dynamo  # noqa: F401  (the first optimizer would import it: 1 s, paid here once)
        except Exception:  # noqa: BLE001 - the optimizer retries and reports
            pass
        self.device, _why = resolve_device(device_spec)
        self.write = write
        self.data = DeviceData()
        self.data.install()
        self.data_dir = data
        from gputui.train import loop

        dataset = prefetch.dataset()
        self.data.keep(data, dataset)
        loop.to_device(dataset.train_images, dataset.train_labels, self.device)  # cached for every trial
        loop.to_device(dataset.test_images, dataset.test_labels, self.device)
        self.torch_version = torch.__version__
        self.threads = torch.get_num_threads()
        self.load_s = time.perf_counter() - t0
        self.last_end: float | None = None

    def ready(self) -> dict[str, Any]:
        return {"op": "ready", "pid": os.getpid(), "device": str(self.device), "torch": self.torch_version,
                "threads": self.threads, "load_s": round(self.load_s, 3)}

    def run_trial(self, message: dict[str, Any]) -> None:
        from gputui.runs import store as runs
        from gputui.model.errors import GputuiError
        from gputui.config.profile import parse_profile
        from gputui.cloud.heartbeat import beat
        from gputui.train.loop import Diverged, StopFlag, Trainer
        from gputui.train.meter import eval_points

        number = protocol.integer(message.get("trial"))
        if number is None:
            return
        got = time.perf_counter()
        result: dict[str, Any] = {"op": "result", "trial": number}
        if self.last_end is not None:
            result["idle_ms"] = round(1000 * (got - self.last_end), 2)  # waiting for the master since the last result
        stop = StopFlag()
        with self.lock:
            self.current = (number, stop)
        log = None
        try:
            cfg = parse_profile(str(message.get("profile", ""))).run.merged(_device_only(self.device)).resolve()
            run = runs.RunDir(Path(str(message.get("run_dir"))))
            run.path.mkdir(parents=True, exist_ok=True)
            resume = bool(message.get("resume")) and run.checkpoint.is_file()
            if not resume:
                run.profile.write_text(cfg.to_toml(), encoding="utf-8")
            log = runs.EventLog(run.events)
            data = self.data.dataset(cfg.data)
            spe = max(1, len(data.train_images) // cfg.batch_size)
            points = eval_points(spe, cfg.evals_per_epoch)
            start_at = time.perf_counter()

            def emit(event: dict[str, Any]) -> None:
                beat()  # training moves: the slave's watchdog ([cloud] stalled_minutes) sees it
                out: dict[str, Any] = {"op": "event", "trial": number, "data": event}
                if event.get("event") in ("eval", "epoch"):
                    batch = event["step"] - (event["epoch"] - 1) * spe
                    k = points.index(batch) + 1 if batch in points else len(points)
                    out["eval"] = (event["epoch"] - 1) * len(points) + k
                elif event.get("event") == "start":
                    out["startup_ms"] = round(1000 * (time.perf_counter() - start_at), 2)
                log.write(runs.encode(event))  # type: ignore[union-attr]
                self.write(out)

            if self.threads:
                import torch

                torch.set_num_threads(self.threads)
            trainer = Trainer(cfg, run, data, self.device, emit, stop)
            outcome = trainer.train(resume=resume)
            result.update(outcome="done" if outcome == "done" else "stopped", reason=stop.reason or None,
                          test_acc=trainer.last_acc, best_acc=trainer.best_acc,
                          elapsed_s=round(trainer.meter.elapsed_s, 3))
        except Diverged as exc:
            result.update(outcome="error", reason="nan", error=str(exc))
        except GputuiError as exc:
            result.update(outcome="error", reason="error", error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a trial's failure is the trial's, the worker goes on
            result.update(outcome="error", reason="crash", error=f"{type(exc).__name__}: {exc}"[:2000])
        finally:
            if log is not None:
                log.close()
            with self.lock:
                self.current = None
        self.write({k: v for k, v in result.items() if v is not None})
        self.last_end = time.perf_counter()


def _device_only(device: Any) -> Any:
    from gputui.config.run import RunSettings

    return RunSettings(device=str(device), strategy="single")


def read_stdin(stream: TextIO, inbox: "queue.Queue[dict[str, Any] | None]", worker_ref: list[Any]) -> None:
    """The stdin reader thread: a stop goes to the running trial at once; the rest is queued."""
    for line in stream:
        message = protocol.decode(line)
        if message is None:
            continue
        if message["op"] == "stop":
            if worker_ref:
                worker_ref[0].stop(message.get("trial"), str(message.get("reason") or "stopped")[:40])
            continue
        if message["op"] == "exit":
            break
        inbox.put(message)
    if worker_ref:
        worker_ref[0].stop_all("master gone")
    inbox.put(None)


def serve(device: str, threads: int | None, data: str | None, stdin: TextIO = sys.stdin,
          stdout: TextIO = sys.stdout, make: Callable[[Write], Any] | None = None) -> int:
    """The worker's life: start, say ready, run trials until the end of stdin. `make` builds
    another kind of worker from `write` (gputui.sweep.programs: a program's trials)."""
    _die_with_parent()
    out_lock = threading.Lock()

    def write(message: dict[str, Any]) -> None:
        line = protocol.encode(message)
        with out_lock:
            stdout.write(line + "\n")
            stdout.flush()

    inbox: "queue.Queue[dict[str, Any] | None]" = queue.Queue()
    worker_ref: list[Any] = []
    reader = threading.Thread(target=read_stdin, args=(stdin, inbox, worker_ref), name="gputui-worker-stdin",
                              daemon=True)
    try:
        worker = make(write) if make is not None else Worker(device, threads, data, write)
    except Exception as exc:  # noqa: BLE001 - said on the protocol, and the process ends
        write({"op": "fatal", "error": str(exc).splitlines()[0][:2000] if str(exc) else type(exc).__name__})
        return 2
    worker_ref.append(worker)
    reader.start()
    write(worker.ready())
    while True:
        message = inbox.get()
        if message is None:
            return 0
        if message.get("op") == "trial":
            worker.run_trial(message)
