"""Old and new side by side: another checkout's gputui and this tree's, running at the same time.

On this machine an idle process pays for the memory it touches again after each sleep, and that
price moves 2-5x within minutes; runs one after the other meet different minutes. Here both run
in the same seconds, each its own process, and each one's CPU (user + system, psutil) is read
over the same window; the start order is swapped every round. Two processes share the pages of
libpython, numpy and Textual's native code, so each costs less than it would alone: the ratio
says what differs between the two trees, not what either costs by itself (for that:
bench_monitor_cpu.py, bench_dashboard_cpu.py).

    python benchmarks/bench_side_by_side.py --against OLD_TREE monitor [--sim 256 --sim-gpus 8 --json]
    python benchmarks/bench_side_by_side.py --against OLD_TREE dashboard [--hosts 256 --gpus 8]

(`git worktree add /tmp/old COMMIT` makes OLD_TREE.) Prints each round's % of one core for
both and the median new/old.
"""

from __future__ import annotations

import argparse
import os
import statistics
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIRST_OUTPUT_S = 120.0


def _drain(stream: Any, seen: threading.Event) -> None:
    """Read and drop what the command writes, as it comes (a buffered read would wait for 64 KiB)."""
    while os.read(stream.fileno(), 1 << 16):
        seen.set()


def start_monitor(tree: Path, args: list[str]) -> tuple[Callable[[], None], psutil.Process]:
    """`gputui monitor ARGS --interval 1` of `tree`, its output read and dropped."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "monitor", *args, "--interval", "1"], cwd=tree, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    seen = threading.Event()
    threading.Thread(target=_drain, args=(proc.stdout, seen), daemon=True).start()
    if not seen.wait(FIRST_OUTPUT_S):
        proc.kill()
        raise SystemExit(f"{tree}: gputui monitor printed nothing within {FIRST_OUTPUT_S:.0f} s")

    def stop() -> None:
        proc.kill()
        proc.wait(30)

    return stop, psutil.Process(proc.pid)


def start_dashboard(tree: Path, hosts: int, gpus: int) -> tuple[Callable[[], None], psutil.Process]:
    """The demo dashboard of `tree` in a tmux of 120x40 (bench_dashboard_cpu's)."""
    sys.path.insert(0, str(HERE))
    import bench_dashboard_cpu

    home = Path(tempfile.mkdtemp(prefix="gputui-bench-dashboard-"))
    tmux, proc = bench_dashboard_cpu.start_dashboard(home, hosts, gpus, repo=tree)

    def stop() -> None:
        tmux.kill()
        shutil.rmtree(home, ignore_errors=True)

    return stop, proc


def cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True, metavar="TREE", help="the other checkout (old)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window a round")
    parser.add_argument("--warmup", type=float, default=8.0)
    parser.add_argument("what", choices=("monitor", "dashboard"))
    parser.add_argument("--hosts", type=int, default=256, help="dashboard: simulated hosts")
    parser.add_argument("--gpus", type=int, default=8, help="dashboard: GPUs a host")
    args, rest = parser.parse_known_args()
    trees = {"old": args.against.resolve(), "new": ROOT}
    monitor_args = rest or ["--sim", "256", "--sim-gpus", "8"]
    what = f"gputui monitor {' '.join(monitor_args)}" if args.what == "monitor" else \
        f"dashboard --demo idle, {args.hosts} x {args.gpus}, 120x40"
    print(f"# {what}; old = {trees['old']}, new = {trees['new']}; {args.seconds:g} s windows; "
          f"load at start {os.getloadavg()[0]:.2f}", flush=True)
    ratios = []
    for n in range(args.rounds):
        order = ["old", "new"] if n % 2 == 0 else ["new", "old"]
        running: dict[str, tuple[Callable[[], None], psutil.Process]] = {}
        try:
            for name in order:
                running[name] = (start_monitor(trees[name], monitor_args) if args.what == "monitor"
                                 else start_dashboard(trees[name], args.hosts, args.gpus))
            time.sleep(args.warmup)
            before = {name: cpu_s(proc) for name, (_, proc) in running.items()}
            started = time.monotonic()
            time.sleep(args.seconds)
            window = time.monotonic() - started
            pct = {name: 100.0 * (cpu_s(proc) - before[name]) / window for name, (_, proc) in running.items()}
        finally:
            for stop, _ in running.values():
                stop()
        ratios.append(pct["new"] / pct["old"] if pct["old"] > 0 else float("inf"))
        print(f"round {n + 1} ({order[0]} started first): old {pct['old']:.2f}%  new {pct['new']:.2f}%  "
              f"new/old {ratios[-1]:.2f}  load {os.getloadavg()[0]:.2f}", flush=True)
    print(f"median new/old {statistics.median(ratios):.2f} over {len(ratios)} rounds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
