"""What merging a program's fast reports costs (gputui.jobs.program.Pacer.add), this tree's class
against an older commit's, in one process, interleaved.

Each side adds 100,000 reports of 3 metrics at 100,000 a second (nearly all merged into the
next event); the new class runs twice, without and with an objective (which it counts in each
merged record). Prints the medians in microseconds a report and each one's ratio to the old.

    .venv/bin/python benchmarks/bench_pacer.py [--old 531d054] [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import gputui.jobs.program as new  # noqa: E402
from oldcode import module_at  # noqa: E402 - beside this script


def per_report(module: Any, objective: str | None, n: int = 100_000) -> float:
    pacer = module.Pacer() if objective is None else module.Pacer(objective=objective)
    records = [module.Record({"loss": 1.0 / (i + 1), "acc": 0.5, "lr": 0.01}, step=i) for i in range(n)]
    began, now = time.perf_counter(), 0.0
    for record in records:
        now += 1e-5
        pacer.add(record, now)
    return (time.perf_counter() - began) / n * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", default="531d054", help="the commit whose Pacer is the baseline")
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gputui-bench-pacer-") as top:
        old = module_at(args.old, "gputui/jobs/program.py", Path(top))
        sides = {"old": (old, None), "new": (new, None), "new+objective": (new, "acc")}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for k in range(args.rounds):
            for name in (list(sides) if k % 2 == 0 else list(reversed(sides))):
                times[name].append(per_report(*sides[name]))
    base = statistics.median(times["old"])
    for name in sides:
        median = statistics.median(times[name])
        print(f"{name:14}: {median:.2f} us a report ({median / base:.2f}x old {args.old})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
