"""Start-up: wall time from `gputui run` to its `start` event and to its first `step` event.

Runs `gputui run --model fast --json` (stopped after the first step event) with this
checkout's gputui and, with `--ref REF`, with the gputui of that commit (extracted with
`git archive`), rounds interleaved so a busy machine slows both alike. Prints the medians
and the ratio before/after. Usage:
    python benchmarks/bench_startup.py [--ref HEAD~1] [--rounds 7] [--device cpu]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def extract(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(REPO), "archive", ref, "gputui", "assets"], capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def once(pythonpath: Path, device: str, work: Path) -> tuple[float, float]:
    """(s to the start event, s to the first step event) of one run."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath), GPUTUI_HOME=str(work / "home"))
    argv = [sys.executable, "-m", "gputui", "run", "--model", "fast", "--json", "--device", device,
            "--run-dir", str(work / f"run-{time.monotonic_ns()}")]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=pythonpath)
    start = step = None
    assert proc.stdout is not None
    for line in proc.stdout:
        kind = json.loads(line).get("event")
        now = time.perf_counter() - t0
        if kind == "start":
            start = now
        elif kind == "step":
            step = now
            break
    proc.kill()
    proc.wait()
    if start is None or step is None:
        raise SystemExit(f"{pythonpath}: no start/step event")
    return start, step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ref", help="also time the gputui of this commit (the 'before')")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sides = {"now": REPO}
        if args.ref:
            sides[f"@{args.ref}"] = extract(args.ref, Path(tmp) / "before")
        times: dict[str, list[tuple[float, float]]] = {k: [] for k in sides}
        for _ in range(args.rounds):
            for name, path in sides.items():
                times[name].append(once(path, args.device, Path(tmp)))
        med = {}
        for name, rows in times.items():
            med[name] = (statistics.median(r[0] for r in rows), statistics.median(r[1] for r in rows))
            print(f"{name}: start event {med[name][0]:.2f} s, first step event {med[name][1]:.2f} s "
                  f"(medians of {args.rounds})")
        if args.ref:
            before = med[f"@{args.ref}"]
            print(f"before/now: start {before[0] / med['now'][0]:.2f}x, first step {before[1] / med['now'][1]:.2f}x")


if __name__ == "__main__":
    main()
