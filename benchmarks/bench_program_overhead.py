"""What running a program under gputui costs it, against running the same program directly
(issue 31: under 2% on a one-minute program, and under 1 s added at its start).

The program is CPU-bound pure Python with a fixed amount of work (calibrated once, to take
about `--seconds` run directly) and reports its progress through gputui.report 100 times a
second. Each round runs it directly (`python prog.py N`) and through `gputui run --json -- python
prog.py N`, interleaved, the order alternating. Measured per run:
- wall: from the launch to the end of the command;
- start: from the launch to the program's first line of Python (it prints time.time() first):
  the interpreter's start when direct; gputui's own start, the keeper and the interpreter
  through gputui. "added at start" is the difference.
It prints the medians, the ratio gputui/direct and the overhead in per cent. `--hogs N` runs
the same beside N busy-looping processes (started and stopped by this script).

    .venv/bin/python benchmarks/bench_program_overhead.py [--seconds 60] [--rounds 3] [--hogs 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROGRAM = r"""
import sys, time
print(repr(time.time()), flush=True)
from gputui import report
n = int(sys.argv[1]); every = int(sys.argv[2])
x = 0
for i in range(n):
    x = (x * 1103515245 + 12345) % 2147483648
    if i % every == 0:
        report.log(step=i, x=float(x))
print("done", x, flush=True)
"""
HOG = "while True:\n    pass\n"


def calibrate(prog: Path) -> int:
    """Iterations per second of the work, run directly for about a second."""
    n = 2_000_000
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(prog), str(n), str(n)], check=True, capture_output=True, start_new_session=True)
    return int(n / max(time.perf_counter() - t0, 1e-3))


def one(argv: list[str], cwd: Path) -> tuple[float, float]:
    launched = time.time()
    t0 = time.perf_counter()
    # A session of its own for both: gputui runs the program in one (its keeper calls setsid), and
    # Linux's autogroup scheduler shares the CPU between sessions, so a program run directly from
    # this script's session would get less of a busy machine than the same program under gputui.
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=3600, start_new_session=True)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:6])} failed ({done.returncode}): {done.stderr[-500:]}")
    log = done.stdout
    if argv[1] == "-m":  # through gputui: the program's output is in the run's output.log
        run_dir = Path(argv[argv.index("--run-dir") + 1])
        log = (run_dir / "output.log").read_text()
    first = float(log.splitlines()[0])
    return wall, first - launched


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the program's length run directly (default 60)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hogs", type=int, default=0)
    args = parser.parse_args()
    hogs = [subprocess.Popen([sys.executable, "-c", HOG]) for _ in range(args.hogs)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            prog = work / "prog.py"
            prog.write_text(PROGRAM)
            rate = calibrate(prog)
            n = int(rate * args.seconds)
            every = max(1, rate // 100)  # about 100 reports a second
            direct, through = [], []
            for r in range(args.rounds):
                plain = [sys.executable, str(prog), str(n), str(every)]
                gputui = [sys.executable, "-m", "gputui", "run", "--json", "--run-dir", str(work / f"run{r}"),
                          "--", "python", str(prog), str(n), str(every)]
                pair = [("direct", plain), ("gputui", gputui)]
                for name, argv in (pair if r % 2 == 0 else pair[::-1]):
                    (direct if name == "direct" else through).append(one(argv, work))
                    print(f"round {r + 1} {name:6}: wall {(direct if name == 'direct' else through)[-1][0]:7.2f} s, "
                          f"start {(direct if name == 'direct' else through)[-1][1]:5.3f} s", flush=True)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    d_wall = statistics.median(w for w, _ in direct)
    g_wall = statistics.median(w for w, _ in through)
    d_start = statistics.median(s for _, s in direct)
    g_start = statistics.median(s for _, s in through)
    print(f"\nload average {os.getloadavg()[0]:.2f}, {args.hogs} hogs; {args.rounds} rounds; medians")
    print(f"direct  wall {d_wall:7.2f} s   start {d_start:5.3f} s")
    print(f"gputui  wall {g_wall:7.2f} s   start {g_start:5.3f} s")
    print(f"ratio gputui/direct {g_wall / d_wall:.4f}: overhead {100 * (g_wall / d_wall - 1):+.2f}% (target < 2%)")
    print(f"added at start {g_start - d_start:+.3f} s (target < 1 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
