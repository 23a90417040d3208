"""Sweep scaling: the same 16 fast-net trials on 1 and 2 CPU workers, an in-process Optuna anchor,
and the turnaround between two trials on one warm worker against a `gputui run` process per trial.

- `gputui sweep --workers N` (torch threads 1 per worker), N = 1 and 2: trials per minute over the
  sweep's trial phase (first trial sent to last trial told) and over the whole command;
- the anchor, in the same run: plain `optuna.study.optimize` in one process (in-memory storage, the
  same TPE seed, sampler and objective: gputui's trainer on the same data, 1 thread);
- turnaround: `gputui worker` given trial after trial on its stdin, from a result line read to the
  next trial's start event read (median), and the worker's own share (`startup_ms`: trial message
  to start event); against `gputui run --json` started per trial (process start to start event);
- with CUDA (`--gpu`): the sweep with trials_per_gpu = 1, 2, 4 on GPU 0, and NVML's utilisation.

The data set is cut from the bundled MNIST (--train/--test images) so a CPU run takes minutes.
Pruning is off: each trial does the same work whatever the order. Usage:
    python benchmarks/sweep_scaling.py [--trials 16] [--train 8192] [--test 2000] [--gpu]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def cut_dataset(directory: Path, n_train: int, n_test: int) -> Path:
    """The first images of the bundled MNIST as the four IDX files (gzipped) under `directory`."""
    import numpy as np

    from gputui.train.data import load_dataset

    full = load_dataset()
    directory.mkdir(parents=True, exist_ok=True)
    parts = {"train-images-idx3-ubyte": full.train_images[:n_train],
             "train-labels-idx1-ubyte": full.train_labels[:n_train].astype(np.uint8),
             "t10k-images-idx3-ubyte": full.test_images[:n_test],
             "t10k-labels-idx1-ubyte": full.test_labels[:n_test].astype(np.uint8)}
    for name, array in parts.items():
        header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
        (directory / f"{name}.gz").write_bytes(gzip.compress(header + np.ascontiguousarray(array).tobytes(), 1))
    return directory


def write_profile(path: Path, data: Path, trials: int, device: str, extra: str = "") -> Path:
    path.write_text(f'[run]\nmodel = "fast"\ndevice = "{device}"\ndata = "{data}"\nepochs = 1\n\n'
                    f'[sweep]\ntrials = {trials}\nsampler = "tpe"\nsampler_seed = 0\npruner = "none"\n'
                    f'lr = [1e-3, 3e-2]\nbatch_size = [128]\nthreads = 1\n{extra}\n')
    return path


def sweep(profile: Path, name: str, env: dict[str, str], workers: int | None = None,
          sample_gpu: bool = False) -> dict[str, Any]:
    """Run one sweep; its timings from its JSON lines."""
    argv = [sys.executable, "-m", "gputui", "sweep", str(profile), "--json", "--name", name]
    if workers is not None:
        argv += ["--workers", str(workers)]
    util: list[float] = []
    stop = threading.Event()
    if sample_gpu:
        threading.Thread(target=nvml_sampler, args=(util, stop), daemon=True).start()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    first = last = None
    end: dict[str, Any] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        e = json.loads(line)
        now = time.perf_counter() - t0
        if e.get("sweep") == "trial" and first is None:
            first = now
        elif e.get("sweep") == "trial_done":
            last = now
        elif e.get("sweep") == "end":
            end = e
    total = time.perf_counter() - t0
    err = proc.stderr.read() if proc.stderr else ""
    stop.set()
    if proc.wait() != 0 or first is None or last is None:
        raise SystemExit(f"sweep {name} failed: {err[-2000:]}")
    n = end["done"]
    out = {"trials": n, "trial_phase_s": last - first, "total_s": total,
           "trials_per_min": 60 * n / (last - first), "trials_per_min_total": 60 * n / total,
           "turnaround_ms_median": end.get("turnaround_ms_median"), "startup_ms_median": end.get("startup_ms_median")}
    if sample_gpu:
        busy = [u for u in util if u > 0] or [0.0]
        out["gpu_util_mean_pct"] = statistics.fmean(util) if util else None
        out["gpu_util_busy_mean_pct"] = statistics.fmean(busy)
    return out


def nvml_sampler(into: list[float], stop: threading.Event) -> None:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    while not stop.is_set():
        into.append(float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
        time.sleep(0.2)


ANCHOR = r'''
import json, shutil, sys, time, tempfile
from pathlib import Path
t_start = time.perf_counter()
import optuna, torch
torch.set_num_threads(1)
from gputui.runs import store as runs
from gputui.config.run import RunSettings
from gputui.train.data import load_dataset
from gputui.train.loop import StopFlag, Trainer
data_dir, trials, device = sys.argv[1], int(sys.argv[2]), sys.argv[3]
data = load_dataset(Path(data_dir))
optuna.logging.set_verbosity(optuna.logging.WARNING)
root = Path(tempfile.mkdtemp())
def objective(trial):
    lr = trial.suggest_float("lr", 1e-3, 3e-2, log=True)
    bs = trial.suggest_categorical("batch_size", [128])
    cfg = RunSettings(model="fast", device=device, data=data_dir, epochs=1, lr=lr, batch_size=bs).resolve()
    run = runs.RunDir(root / f"t{trial.number}")
    run.path.mkdir()
    trainer = Trainer(cfg, run, data, torch.device(device), lambda e: None, StopFlag())
    trainer.train()
    return trainer.last_acc
study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0, constant_liar=True))
t0 = time.perf_counter()
try:
    study.optimize(objective, n_trials=trials)
    t1 = time.perf_counter()
finally:
    shutil.rmtree(root, ignore_errors=True)
print(json.dumps({"optimize_s": t1 - t0, "total_s": t1 - t_start, "best": study.best_value}))
'''


def anchor(data: Path, trials: int, env: dict[str, str], device: str = "cpu") -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", ANCHOR, str(data), str(trials), device], capture_output=True,
                          text=True, env=dict(env, OMP_NUM_THREADS="1"))
    if proc.returncode != 0:
        raise SystemExit(f"anchor failed: {proc.stderr[-2000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["process_s"] = time.perf_counter() - t0
    out["trials_per_min"] = 60 * trials / out["optimize_s"]
    out["trials_per_min_total"] = 60 * trials / out["process_s"]
    return out


def turnaround(data: Path, env: dict[str, str], rounds: int, work: Path) -> dict[str, Any]:
    """Median ms from one trial's result to the next trial's start event, on one warm worker."""
    from gputui.config.run import RunSettings

    cfg = RunSettings(model="fast", data=str(data), epochs=1, batch_size=128).resolve()
    argv = [sys.executable, "-m", "gputui", "worker", "--device", "cpu", "--threads", "1", "--data", str(data)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env=dict(env, OMP_NUM_THREADS="1"))
    assert proc.stdin is not None and proc.stdout is not None
    json.loads(proc.stdout.readline())  # ready
    gaps, startups = [], []
    result_at = None
    for n in range(rounds):
        proc.stdin.write(json.dumps({"op": "trial", "trial": n, "profile": cfg.to_toml(),
                                     "run_dir": str(work / f"turn-{n}")}) + "\n")
        proc.stdin.flush()
        for line in proc.stdout:
            m = json.loads(line)
            if m["op"] == "event" and m["data"]["event"] == "start":
                if result_at is not None:
                    gaps.append(1000 * (time.perf_counter() - result_at))
                startups.append(m["startup_ms"])
            elif m["op"] == "result":
                result_at = time.perf_counter()
                break
    proc.stdin.close()
    proc.wait()
    return {"worker_turnaround_ms_median": statistics.median(gaps),
            "worker_turnaround_ms_max": max(gaps), "worker_startup_ms_median": statistics.median(startups[1:])}


def run_per_trial(data: Path, env: dict[str, str], rounds: int, work: Path) -> float:
    """Median s from starting `gputui run` to its start event (imports, data load, model)."""
    times = []
    for n in range(rounds):
        argv = [sys.executable, "-m", "gputui", "run", "--model", "fast", "--json", "--device", "cpu", "--threads",
                "1", "--epochs", "1", "--data", str(data), "--run-dir", str(work / f"run-{n}")]
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=dict(env, OMP_NUM_THREADS="1"))
        assert proc.stdout is not None
        for line in proc.stdout:
            if json.loads(line).get("event") == "start":
                times.append(time.perf_counter() - t0)
                break
        proc.kill()
        proc.wait()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--train", type=int, default=8192, help="training images cut from MNIST")
    parser.add_argument("--test", type=int, default=2000, help="test images cut from MNIST")
    parser.add_argument("--rounds", type=int, default=10, help="trials for the turnaround")
    parser.add_argument("--gpu", action="store_true", help="also trials_per_gpu = 1, 2, 4 on CUDA GPU 0")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gputui-sweep-bench-"))
    env = dict(os.environ, GPUTUI_HOME=str(work / "home"), PYTHONPATH=str(REPO))
    data = cut_dataset(work / "data", args.train, args.test)
    print(f"load at start: {os.getloadavg()}; {os.cpu_count()} CPUs; data {args.train}/{args.test} images",
          flush=True)
    results: dict[str, Any] = {}
    profile = write_profile(work / "cpu.toml", data, args.trials, "cpu")
    results["sweep_1_worker"] = sweep(profile, "w1", env, workers=1)
    print("1 worker:", results["sweep_1_worker"], flush=True)
    results["sweep_2_workers"] = sweep(profile, "w2", env, workers=2)
    print("2 workers:", results["sweep_2_workers"], flush=True)
    results["optuna_optimize_anchor"] = anchor(data, args.trials, env)
    print("anchor:", results["optuna_optimize_anchor"], flush=True)
    one, two = results["sweep_1_worker"], results["sweep_2_workers"]
    results["ratio_2_over_1"] = two["trials_per_min"] / one["trials_per_min"]
    results["ratio_2_over_1_total"] = two["trials_per_min_total"] / one["trials_per_min_total"]
    results["turnaround"] = turnaround(data, env, args.rounds, work)
    print("turnaround:", results["turnaround"], flush=True)
    results["gputui_run_to_start_s_median"] = run_per_trial(data, env, 3, work)
    if args.gpu:
        gpu_profile = write_profile(work / "gpu.toml", data, args.trials, "cuda:0")
        for per in (1, 2, 4):
            text = gpu_profile.read_text().replace("threads = 1", f"threads = 1\ntrials_per_gpu = {per}")
            path = work / f"gpu{per}.toml"
            path.write_text(text)
            results[f"gpu_trials_per_gpu_{per}"] = sweep(path, f"g{per}", env, sample_gpu=True)
            print(f"trials_per_gpu {per}:", results[f"gpu_trials_per_gpu_{per}"], flush=True)
    results["load_at_end"] = os.getloadavg()
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
