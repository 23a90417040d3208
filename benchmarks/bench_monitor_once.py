"""`gputui monitor --once --json` against `nvitop --once`, both cold starts, in the same run.

Each command runs as a fresh process (`python -m ...` with this interpreter, so neither
pays for a shim), alternating, `--repeat` times; prints the median and best wall time of
each, their exit codes and the ratio. nvitop is only measured, never a dependency of
gputui: `python -m pip install nvitop` first. Usage:
    python benchmarks/bench_monitor_once.py [--repeat 15]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import time

TARGET_S = 0.3


def timed(argv: list[str]) -> tuple[float, int, str]:
    t0 = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True)
    return time.perf_counter() - t0, out.returncode, out.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    if importlib.util.find_spec("nvitop") is None:
        print("nvitop is not installed: python -m pip install nvitop (for this benchmark only)")
        return 2
    ours = [sys.executable, "-m", "gputui", "monitor", "--once", "--json"]
    theirs = [sys.executable, "-m", "nvitop", "--once"]
    timed(ours), timed(theirs)  # warm the page cache
    walls: dict[str, list[float]] = {"gputui": [], "nvitop": []}
    codes: dict[str, set[int]] = {"gputui": set(), "nvitop": set()}
    for _ in range(args.repeat):
        for name, argv in (("gputui", ours), ("nvitop", theirs)):
            wall, code, stdout = timed(argv)
            walls[name].append(wall)
            codes[name].add(code)
            if name == "gputui":
                states = [h["state"] for h in json.loads(stdout)["hosts"]]
    for name in walls:
        print(f"{name:7s} median {statistics.median(walls[name]):.3f} s, best {min(walls[name]):.3f} s, exit codes {sorted(codes[name])}")
    ratio = statistics.median(walls["gputui"]) / statistics.median(walls["nvitop"])
    print(f"gputui/nvitop (median): {ratio:.2f}; target {TARGET_S} s: gputui median is {statistics.median(walls['gputui']) / TARGET_S:.2f}x of it")
    print(f"gputui saw: {states}")
    return 0 if statistics.median(walls["gputui"]) <= TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
