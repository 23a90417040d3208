"""Torch's CPU threads: gputui's default (gputui.train.threads, what is free) against fixed counts.

Each measurement is a real `gputui run --model fast --epochs 1 --json` (one epoch of MNIST, about
10-20 s with start-up); samples/s is read from its events between the first step event and the
end of the epoch, as `gputui bench` does. Two conditions in one run: the machine as it is
("quiet"; other work on it is reported with the load average) and beside CPU hogs the script
starts itself (`python -c 'while True: pass'`, two by default, killed at the end whatever
happens). Within a condition the settings run interleaved, round after round, in a rotated
order, so a load that comes and goes touches each alike. Prints, per condition, the median
samples/s of each setting, the threads the default chose and why, and the ratio of the default
to the best fixed setting (the aim: >= 0.90 in both conditions). Usage:
    python benchmarks/bench_threads.py [--rounds 3] [--hogs 2] [--model fast] [--wait-policy PASSIVE]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def measure(threads: int | None, args: argparse.Namespace, home: Path, n: int) -> tuple[float, dict[str, Any]]:
    """samples/s of one run, and its start event."""
    cmd = [sys.executable, "-m", "gputui", "run", "--model", args.model, "--epochs", "1", "--json",
           "--evals-per-epoch", "1", "--run-dir", str(home / "runs" / f"r{n}")]
    if args.data:
        cmd += ["--data", args.data]
    if threads is not None:
        cmd += ["--threads", str(threads)]
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "GPUTUI_THREADS_WHY")}
    env["GPUTUI_HOME"] = str(home)
    if args.wait_policy:
        env["OMP_WAIT_POLICY"] = args.wait_policy
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    steps = [e for e in events if e.get("event") == "step"]
    end = next((e for e in events if e.get("event") == "done"), None)
    start = next((e for e in events if e.get("event") == "start"), {})
    if done.returncode != 0 or end is None or not steps or end["elapsed_s"] <= steps[0]["elapsed_s"]:
        raise SystemExit(f"run failed (exit {done.returncode}): {done.stderr.strip()[-400:]}")
    samples = (end["step"] - steps[0]["step"]) * start["batch_size"]
    return samples / (end["elapsed_s"] - steps[0]["elapsed_s"]), start


def condition(name: str, args: argparse.Namespace, home: Path, counter: list[int]) -> dict[str, Any]:
    n = cores()
    settings: list[tuple[str, int | None]] = [("default", None), ("--threads 1", 1)]
    if n > 1:
        settings.append((f"--threads {n}", n))
    rates: dict[str, list[float]] = {label: [] for label, _t in settings}
    chosen: list[tuple[int, str]] = []
    loads: list[float] = []
    for r in range(args.rounds):
        order = settings[r % len(settings):] + settings[:r % len(settings)]
        for label, threads in order:
            counter[0] += 1
            rate, start = measure(threads, args, home, counter[0])
            rates[label].append(rate)
            loads.append(os.getloadavg()[0])
            if threads is None:
                chosen.append((int(start.get("threads", 0)), str(start.get("threads_why", "?"))))
            print(f"  {name} round {r + 1}: {label:>12}: {rate:8,.0f} samples/s (load {loads[-1]:.1f})", flush=True)
    medians = {label: statistics.median(v) for label, v in rates.items()}
    best_label = max((label for label in medians if label != "default"), key=lambda k: medians[k])
    return {"condition": name, "medians": medians, "best_fixed": best_label,
            "ratio": medians["default"] / medians[best_label], "chosen": chosen,
            "load": (min(loads), max(loads))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs beside the second condition (default 2)")
    parser.add_argument("--model", default="fast")
    parser.add_argument("--data", help="a smaller data set (a directory of the four IDX files) for shorter runs")
    parser.add_argument("--wait-policy", help="OMP_WAIT_POLICY for every run (e.g. PASSIVE, to compare)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a single run may take")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda _s, _f: sys.exit(143))  # the hogs' `finally` runs on a kill too
    print(f"{cores()} cores; load average {', '.join(f'{v:.2f}' for v in os.getloadavg())}; "
          f"OMP_WAIT_POLICY={args.wait_policy or os.environ.get('OMP_WAIT_POLICY', 'unset')}", flush=True)
    results = []
    counter = [0]
    with tempfile.TemporaryDirectory(prefix="gputui-bench-threads-") as tmp:
        home = Path(tmp)
        results.append(condition("quiet", args, home, counter))
        hogs: list[subprocess.Popen[bytes]] = []
        try:
            hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
            results.append(condition(f"{args.hogs} hogs", args, home, counter))
        finally:
            for hog in hogs:
                hog.kill()
            for hog in hogs:
                hog.wait()
    print()
    for res in results:
        cells = ", ".join(f"{label} {rate:,.0f}" for label, rate in res["medians"].items())
        chosen = sorted({t for t, _why in res["chosen"]})
        print(f"{res['condition']:>8}: median samples/s: {cells}; default/best fixed ({res['best_fixed']}) = "
              f"{res['ratio']:.2f}; default chose {chosen} thread(s) (e.g. {res['chosen'][0][1]}); "
              f"load {res['load'][0]:.1f}-{res['load'][1]:.1f}")
    print("aim: default/best fixed >= 0.90 in both conditions:",
          "met" if all(r["ratio"] >= 0.90 for r in results) else "NOT met")


if __name__ == "__main__":
    main()
