"""Wall time of the test suite's tiers, quiet and beside CPU hogs (issue 28).

    .venv/bin/python benchmarks/suite_time.py                    # the fast tier, quiet
    .venv/bin/python benchmarks/suite_time.py --tiers fast,integration --hogs 2
    .venv/bin/python benchmarks/suite_time.py --tiers fast,all --hogs 2 --json out.json

Tiers (the marker is set by tests/conftest.py):
  fast         pytest -q -n auto -m "not integration"   (the developer loop)
  integration  pytest -q -n auto -m integration
  all          pytest -q -n auto                          (README's and .ci/run's command)

Each tier runs once quiet; with `--hogs N` once more beside N busy-looping processes this
script starts itself (and kills in `finally`, whatever happens). It prints a table: tier,
load, wall seconds, the 1-minute load average before the run, pytest's summary line and exit
status. The targets (issue 28, 2 quiet cores): fast tier under 3 minutes, the whole suite
under 10. A run on a machine that is not quiet says so (its load average is in the table):
compare only rows measured alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hogs import busy_loops  # beside this script

REPO = Path(__file__).resolve().parent.parent
PYTHON = REPO / ".venv" / "bin" / "python"
TIERS: dict[str, list[str]] = {
    "fast": ["-m", "not integration"],
    "integration": ["-m", "integration"],
    "all": [],
}


@dataclass
class Row:
    tier: str
    load: str  # "quiet" or "N hogs"
    wall_s: float
    loadavg_before: float
    summary: str
    exit_status: int


def pytest_command(tier: str, workers: str, extra: list[str]) -> list[str]:
    python = str(PYTHON if PYTHON.exists() else Path(sys.executable))
    return [python, "-m", "pytest", "-q", "-n", workers, *TIERS[tier], *extra]


def summary_line(output: str) -> str:
    """pytest's last line ('812 passed, 2 skipped, 335 deselected in 101.2s'), without the time."""
    lines = [line.strip("= ") for line in output.splitlines() if re.search(r"\b(passed|failed|error|deselected)\b", line)]
    return re.sub(r" in [\d.]+s.*$", "", lines[-1]) if lines else "(no summary)"


def run_tier(tier: str, workers: str, extra: list[str], load: str, timeout: float, log: Path | None) -> Row:
    before = os.getloadavg()[0]
    command = pytest_command(tier, workers, extra)
    began = time.monotonic()
    try:
        done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        output, status = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as exc:
        output = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status = -1
        output += f"\n(timed out after {timeout:g} s)"
    wall = time.monotonic() - began
    if log is not None:
        (log / f"{tier}-{load.replace(' ', '')}.log").write_text(output, encoding="utf-8")
    return Row(tier, load, round(wall, 1), round(before, 2), summary_line(output), status)


def table(rows: list[Row]) -> str:
    head = f"{'tier':<12} {'load':<8} {'wall':>8} {'loadavg':>8}  exit  summary"
    lines = [head, "-" * len(head)]
    for r in rows:
        minutes = f"{int(r.wall_s // 60)}:{r.wall_s % 60:04.1f}"
        lines.append(f"{r.tier:<12} {r.load:<8} {minutes:>8} {r.loadavg_before:>8.2f}  {r.exit_status:>4}  {r.summary}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiers", default="fast", help="comma-separated: fast, integration, all (default: fast)")
    parser.add_argument("--hogs", type=int, default=0, help="also run each tier beside this many CPU hogs")
    parser.add_argument("--workers", default="auto", help="pytest-xdist's -n (default: auto)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds one pytest run may take")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    parser.add_argument("--logs", type=Path, help="keep each run's pytest output in this directory")
    parser.add_argument("--repeat", type=int, default=1, help="run each tier this many times under each load (issue 28: three in a row)")
    parser.add_argument("--busy-only", action="store_true", help="with --hogs: skip the quiet runs")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    unknown = [t for t in tiers if t not in TIERS]
    if unknown or not tiers:
        parser.error(f"--tiers: {', '.join(unknown) or 'none given'}; choose from {', '.join(TIERS)}")
    if args.hogs < 0:
        parser.error("--hogs must be >= 0")
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.busy_only and not args.hogs:
        parser.error("--busy-only needs --hogs N")
    if args.logs is not None:
        args.logs.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    print(f"{cores} CPUs, 1-minute load average now {os.getloadavg()[0]:.2f}", flush=True)
    rows: list[Row] = []
    loads = ([] if args.busy_only else [0]) + ([args.hogs] if args.hogs else [])
    for hogs_n in loads:
        label = "quiet" if hogs_n == 0 else f"{hogs_n} hogs"
        with busy_loops(hogs_n):
            for attempt in range(1, args.repeat + 1):
                for tier in tiers:
                    run_label = label if args.repeat == 1 else f"{label} #{attempt}"
                    print(f"running the {tier} tier ({run_label}) ...", flush=True)
                    rows.append(run_tier(tier, args.workers, args.pytest_args, run_label, args.timeout, args.logs))
                    print(table(rows[-1:]).splitlines()[-1], flush=True)
    print()
    print(table(rows))
    if any(r.loadavg_before > 0.5 * cores for r in rows if r.load == "quiet"):
        print(f"note: a 'quiet' run started with a load average over {0.5 * cores:g}: the machine was not quiet")
    if args.json is not None:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n", encoding="utf-8")
    return 0 if all(r.exit_status == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
