"""CPU cost of `gputui monitor --serve`: 4 simulated hosts x 8 GPUs, polled and scraped every second.

Starts `gputui monitor --serve 127.0.0.1:0 --sim 4 --sim-gpus 8 --interval 1 --json` (its
JSON to /dev/null), waits for its first rounds, then for `--seconds` scrapes /metrics once a
second (as a Prometheus with `scrape_interval: 1s` would) and reads the monitor's CPU time
(user + system, all its threads) before and after: the share of one core it used. For
comparison it measures the same monitor without --serve (no endpoint, no scrapes), so the
exporter's own share shows. Prints the scrape time and size too. Target: <= 3% of a core.
Usage:
    python benchmarks/bench_exporter.py [--seconds 60] [--hosts 4] [--gpus 8]
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

TARGET_PCT = 3.0
REPO = Path(__file__).resolve().parent.parent


def monitor(hosts: int, gpus: int, serve: bool) -> tuple[subprocess.Popen[str], str | None]:
    argv = [sys.executable, "-m", "gputui", "monitor", "--sim", str(hosts), "--sim-gpus", str(gpus), "--interval", "1", "--json"]
    if serve:
        argv += ["--serve", "127.0.0.1:0"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=REPO)
    url = None
    if serve:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the notice comes before the first round
        found = re.search(r"(http://\S+/metrics)", line)
        if found is None:
            proc.kill()
            raise SystemExit(f"no serving notice: {line!r}")
        url = found.group(1)
    return proc, url


def measure(seconds: float, hosts: int, gpus: int, serve: bool) -> tuple[float, list[float], int]:
    """(% of one core, scrape times, bytes per scrape) over `seconds` after a 3 s warm-up."""
    proc, url = monitor(hosts, gpus, serve)
    try:
        time.sleep(3.0)  # imports and the first rounds are start-up, not steady state
        ps = psutil.Process(proc.pid)
        before, t0 = ps.cpu_times(), time.monotonic()
        scrapes: list[float] = []
        size = 0
        tick = t0
        while time.monotonic() - t0 < seconds:
            if url is not None:
                s0 = time.perf_counter()
                with urllib.request.urlopen(url, timeout=10) as answer:
                    size = len(answer.read())
                scrapes.append(time.perf_counter() - s0)
            tick += 1.0
            time.sleep(max(0.0, tick - time.monotonic()))
        after, wall = ps.cpu_times(), time.monotonic() - t0
        cpu = (after.user + after.system) - (before.user + before.system)
        return 100.0 * cpu / wall, scrapes, size
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--hosts", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8)
    args = parser.parse_args()
    served, scrapes, size = measure(args.seconds, args.hosts, args.gpus, serve=True)
    plain, _, _ = measure(args.seconds, args.hosts, args.gpus, serve=False)
    print(f"{args.hosts} simulated hosts x {args.gpus} GPUs, a round and a scrape every second, {args.seconds:g} s:")
    print(f"  gputui monitor --serve: {served:.2f}% of one core (target {TARGET_PCT:g}%: {served / TARGET_PCT:.2f}x of it)")
    print(f"  gputui monitor without --serve: {plain:.2f}% of one core; the endpoint and its scrapes: {served - plain:.2f}%")
    print(f"  scrape: median {statistics.median(scrapes) * 1000:.1f} ms, worst {max(scrapes) * 1000:.1f} ms, "
          f"{size / 1024:.1f} KiB, {len(scrapes)} scrapes")
    return 0 if served <= TARGET_PCT else 1


if __name__ == "__main__":
    raise SystemExit(main())
