"""CPU of `gputui monitor` at 1 Hz over simulated fleets: is its cost proportional to what it shows?

For H hosts of 8 simulated GPUs (4, 32, 64 and 256 by default) it starts
`gputui monitor --sim H --sim-gpus 8 --interval 1` in four ways:

  pipe   the table (the lab view once the GPU rows do not fit) to a pipe
  pty    the same on a pseudo-terminal of ROWSxCOLS (default 50x160): rich's live view
  json   --json to a pipe (one JSON line per round)
  users  --users to a pipe (the per-account table)

waits for its first output and a warm-up, then reads the process's CPU time (psutil
cpu_times, user + system) over a window, and prints % of one core per case with the ratio to
the target (3% for the table, 5% for --json; --users is held to 3%) and the load average.
The simulation's own cost (about 8 us a GPU a round) is part of every figure. --hogs N runs N
busy loops beside it (killed after). Usage:
    python benchmarks/bench_monitor_cpu.py [--hosts 4,32,64,256] [--cases pipe,pty,json,users]
                                           [--window 20] [--warmup 4] [--hogs 2]
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
TARGETS = {"pipe": 3.0, "pty": 3.0, "json": 5.0, "users": 3.0}  # % of one core at 1 Hz
FIRST_OUTPUT_S = 120.0  # the command's first output, however loaded the machine


def load() -> str:
    return "load " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _drain(fd: int, seen: threading.Event) -> None:
    """Read and drop everything the command writes, as a reader would."""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except OSError:
            return
        if not chunk:
            return
        seen.set()


def measure(hosts: int, case: str, window: float, warmup: float, rows: int, cols: int) -> float:
    """% of one core that `gputui monitor` takes over `window` seconds after warming up."""
    argv = [sys.executable, "-m", "gputui", "monitor", "--sim", str(hosts), "--sim-gpus", "8", "--interval", "1"]
    argv += {"json": ["--json"], "users": ["--users"]}.get(case, [])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("COLUMNS", None)
    env.pop("LINES", None)
    if case == "pty":
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        env["TERM"] = "xterm-256color"
        proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        os.close(slave)
        read_fd = master
    else:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
        assert proc.stdout is not None
        read_fd = proc.stdout.fileno()
    seen = threading.Event()
    reader = threading.Thread(target=_drain, args=(read_fd, seen), daemon=True)
    reader.start()
    try:
        if not seen.wait(FIRST_OUTPUT_S):
            raise SystemExit(f"{case} {hosts}: no output within {FIRST_OUTPUT_S:.0f} s")
        time.sleep(warmup)
        ps = psutil.Process(proc.pid)
        before, t0 = ps.cpu_times(), time.monotonic()
        time.sleep(window)
        after, t1 = ps.cpu_times(), time.monotonic()
        if proc.poll() is not None:
            raise SystemExit(f"{case} {hosts}: the monitor exited ({proc.returncode}) during the window")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if case == "pty":
            os.close(master)
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (t1 - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="4,32,64,256", help="comma-separated host counts (8 GPUs each)")
    parser.add_argument("--cases", default="pipe,pty,json,users", help="comma-separated: pipe, pty, json, users")
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per case (after warm-up)")
    parser.add_argument("--warmup", type=float, default=4.0, help="seconds after the first output before measuring")
    parser.add_argument("--rows", type=int, default=50, help="the pty's height")
    parser.add_argument("--cols", type=int, default=160, help="the pty's width")
    parser.add_argument("--hogs", type=int, default=0, help="busy loops beside it")
    args = parser.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in TARGETS]
    if unknown:
        parser.error(f"unknown case(s) {unknown}: expected some of {', '.join(TARGETS)}")
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hogs)]
    try:
        print(f"# gputui monitor --sim H --sim-gpus 8 --interval 1; window {args.window:g} s; "
              f"pty {args.rows}x{args.cols}; {args.hogs} CPU hog(s); {os.cpu_count()} CPUs")
        print(f"{'hosts':>5} {'GPUs':>5} {'case':<6} {'% core':>7} {'target':>6} {'ratio':>6}  load")
        for hosts in (int(h) for h in args.hosts.split(",") if h):
            for case in cases:
                pct = measure(hosts, case, args.window, args.warmup, args.rows, args.cols)
                target = TARGETS[case]
                print(f"{hosts:>5} {hosts * 8:>5} {case:<6} {pct:>6.2f}% {target:>5.0f}% {pct / target:>6.2f}  {load()}",
                      flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
