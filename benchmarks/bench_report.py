"""What one `gputui.report.log` call costs a training program (issue 31: <= 20 us a call).

Both sides run in one fresh process each, interleaved, `--rounds` times:
- report: `report.log(step=i, epoch=0, loss=..., acc=...)` with GPUTUI_EVENTS set (what a
  program under gputui does: a JSON line built, appended and flushed);
- baseline: the least any reporter can do, the same line pre-built, `write` + `flush` on an
  open file (what is left is the syscall).
It prints microseconds per call for each (the median of the rounds) and their ratio, and exits
1 when report.log is over the target.

    .venv/bin/python benchmarks/bench_report.py [--calls 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

TARGET_US = 20.0
REPORT = """
import sys, time
from gputui import report
n = int(sys.argv[1])
t0 = time.perf_counter()
for i in range(n):
    report.log(step=i, epoch=0, loss=1.0 / (i + 1), acc=0.5)
print((time.perf_counter() - t0) / n * 1e6)
"""
BASELINE = """
import json, os, sys, time
n = int(sys.argv[1])
line = json.dumps({"values": {"loss": 0.5, "acc": 0.5}, "time": time.time(), "step": 1, "epoch": 0}) + "\\n"
fh = open(os.environ["GPUTUI_EVENTS"], "a")
t0 = time.perf_counter()
for i in range(n):
    fh.write(line)
    fh.flush()
print((time.perf_counter() - t0) / n * 1e6)
"""


def one(code: str, calls: int, path: Path) -> float:
    path.unlink(missing_ok=True)
    env = {**os.environ, "GPUTUI_EVENTS": str(path)}
    done = subprocess.run([sys.executable, "-c", code, str(calls)], env=env, capture_output=True, text=True,
                          check=True, timeout=600)
    return float(done.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    report, baseline = [], []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reported.jsonl"
        for _ in range(args.rounds):
            report.append(one(REPORT, args.calls, path))
            baseline.append(one(BASELINE, args.calls, path))
    r, b = statistics.median(report), statistics.median(baseline)
    print(f"load average {os.getloadavg()[0]:.2f}; {args.calls} calls x {args.rounds} rounds (median)")
    print(f"report.log          {r:7.2f} us/call   (rounds: {', '.join(f'{x:.2f}' for x in report)})")
    print(f"write+flush (floor) {b:7.2f} us/call   (rounds: {', '.join(f'{x:.2f}' for x in baseline)})")
    print(f"ratio report/floor  {r / b:7.2f}")
    print(f"target <= {TARGET_US:g} us/call: {'met' if r <= TARGET_US else 'MISSED'}")
    return 0 if r <= TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
