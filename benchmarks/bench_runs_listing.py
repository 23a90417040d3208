"""`gputui runs` over a run of a million steps (a 168 MB events.jsonl): the whole-file read it
did before against the streamed digest and its cached summary (gputui.runs.summaries).

Writes a run directory with one start event, 1,000,000 step events shaped like the trainer's
(~168 bytes a line: a little more than the 141 MB log of the finding), an epoch event every 100,000 steps and a done
event, then measures, each in a fresh process (wall time and the process's peak RSS):
- before: the events read whole (`Path.read_text`, every line parsed into one list, as
  `runs.read_events` does) and summarised from that list: what every listing cost;
- after, first listing: `gputui runs --json --dir DIR` with no summary.json yet (the file is
  streamed once, in 1 MiB chunks, and the summary cached);
- after, later listings: the same command again (only summary.json is read).
With --old-tree DIR (a checkout of the code before, e.g. `git worktree add DIR 8e60a7c`),
"before" is that code's own `gputui runs --json` instead. Prints the figures and the ratios.
Usage:
    python benchmarks/bench_runs_listing.py [--steps 1000000] [--repeat 3] [--keep DIR] [--old-tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

BEFORE = """
import resource, sys, time
from pathlib import Path
from gputui.runs import history
from gputui.runs import store as runs
t0 = time.perf_counter()
run = runs.RunDir(Path(sys.argv[1]))
events = runs.read_events(run.events)  # the whole file, then a list of every event
s = history.summarize(run, events)
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, s.state, s.epochs_done)
"""

AFTER = """
import contextlib, io, resource, sys, time
from gputui.cli import main
t0 = time.perf_counter()
with contextlib.redirect_stdout(io.StringIO()) as out:
    main(["runs", "--json", "--dir", sys.argv[1]])
(row,) = __import__("json").loads(out.getvalue())["runs"]
print(time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, row["state"], row["epochs_done"])
"""


def write_run(home: Path, steps: int) -> Path:
    run = home / "20260101-000000-long"
    run.mkdir(parents=True)
    (run / "profile.toml").write_text('[run]\nmodel = "fast"\nepochs = 10\n')
    start = {"event": "start", "time": 1_700_000_000.0, "run_id": run.name, "run_dir": str(run), "model": "fast",
             "device": "cuda:0", "strategy": "single", "world_size": 1, "epochs": 10, "batch_size": 128,
             "steps_per_epoch": steps // 10, "total_steps": steps}
    per_epoch = max(1, steps // 10)
    with open(run / "events.jsonl", "wb") as fh:
        fh.write((json.dumps(start) + "\n").encode())
        for first in range(0, steps, 100_000):
            last = min(steps, first + 100_000)
            fh.write(b"".join(
                b'{"event": "step", "time": %d.123, "epoch": %d, "step": %d, "loss": 0.2345678, "l1": 0.0123456, '
                b'"samples_per_s": 123456.7, "lr": 0.001, "elapsed_s": %d.456}\n'
                % (1_700_000_000 + s // 1000, s // per_epoch + 1, s + 1, s // 1000) for s in range(first, last)))
            fh.write((json.dumps({"event": "epoch", "time": 1_700_001_000.0, "epoch": last // per_epoch, "step": last,
                                  "train_loss": 0.3, "test_loss": 0.2, "test_acc": 90.0}) + "\n").encode())
        fh.write((json.dumps({"event": "done", "time": 1_700_002_000.0, "step": steps, "epochs": 10, "test_acc": 91.0,
                              "best_acc": 91.0, "elapsed_s": 1234.5}) + "\n").encode())
    return run


def child(script: str, arg: Path, tree: Path = REPO) -> tuple[float, float, str]:
    """(seconds, peak RSS in MiB, what it listed) of the script in a fresh interpreter, with
    gputui imported from `tree`."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", script, str(arg)], capture_output=True, text=True, cwd=tree, check=True,
                         env=env)
    seconds, rss_kib, state, epochs = out.stdout.split()
    return float(seconds), int(rss_kib) / 1024, f"{state} {epochs}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement (the median is printed)")
    parser.add_argument("--old-tree", type=Path, help="measure 'before' as this checkout's `gputui runs --json`")
    parser.add_argument("--keep", type=Path, help="write the run here and keep it (default: a temporary directory)")
    args = parser.parse_args()
    home = args.keep or Path(tempfile.mkdtemp(prefix="gputui-bench-runs-"))
    try:
        t0 = time.perf_counter()
        run = write_run(home, args.steps)
        size = (run / "events.jsonl").stat().st_size
        print(f"events.jsonl: {args.steps:,} steps, {size / 1e6:.0f} MB (written in {time.perf_counter() - t0:.1f} s)")
        results: dict[str, list[tuple[float, float, str]]] = {"before": [], "first": [], "cached": []}
        for _ in range(args.repeat):  # interleaved, so a busy spell of the machine hits each alike
            results["before"].append(child(AFTER, home, args.old_tree) if args.old_tree else child(BEFORE, run))
            (run / "summary.json").unlink(missing_ok=True)
            results["first"].append(child(AFTER, home))
            results["cached"].append(child(AFTER, home))
        medians = {}
        for name, label in (("before", "before: old tree's gputui runs" if args.old_tree else "before: whole-file read"), ("first", "after: first listing (streamed)"),
                            ("cached", "after: cached summary")):
            seconds = statistics.median(r[0] for r in results[name])
            rss = statistics.median(r[1] for r in results[name])
            medians[name] = (seconds, rss)
            print(f"{label:34s} {seconds:8.3f} s  peak RSS {rss:7.0f} MiB  ({results[name][0][2]}; "
                  f"runs: {', '.join(f'{r[0]:.3f}' for r in results[name])} s)")
        before, first, cached = medians["before"], medians["first"], medians["cached"]
        print(f"ratio, time: before / first listing {before[0] / first[0]:.1f}x, before / cached {before[0] / cached[0]:.0f}x")
        print(f"ratio, peak RSS: before / first listing {before[1] / first[1]:.1f}x, before / cached {before[1] / cached[1]:.1f}x")
    finally:
        if args.keep is None:
            shutil.rmtree(home, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
