"""What gputui costs a program that prints a lot, on a terminal: the program's own time to print
N lines run directly on a pseudo-terminal, and under `gputui run -- PROGRAM` on one (gputui draws
its status line and passes the lines through), in one run, interleaved. With `--to file`, the
same with stdout and stderr sent to one file (`> log 2>&1`: gputui copies the bytes there).

    .venv/bin/python benchmarks/bench_program_output.py [--lines 20000] [--rounds 5] [--vs-tree OLD]
                                                        [--to terminal|file]

--vs-tree runs another checkout of gputui (`git worktree add /tmp/old <commit>`) too. The program
writes its own time (perf_counter around its prints) to a file: gputui's start-up is not in it,
only how much its reading and drawing hold the program back (a full pipe blocks its writes).
Target: under gputui on a terminal, printing takes <= 3x what it takes directly.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

PROGRAM = r'''
import sys, time
n, out = int(sys.argv[1]), sys.argv[2]
t = time.perf_counter()
for i in range(n):
    print(f"step {i} loss 0.{i:05d} lr 0.001 and some words to make a log line", flush=False)
sys.stdout.flush()
open(out, "w").write(str(time.perf_counter() - t))
'''


def on_pty(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """Run argv with a 120x40 pseudo-terminal as its stdin, stdout and stderr; read it all."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True)
    os.close(slave)
    while True:
        try:
            if not os.read(master, 1 << 16):
                break
        except OSError:  # EIO: the terminal's last writer has gone
            break
    os.close(master)
    return proc.wait(timeout=600)


def to_file(argv: list[str], env: dict[str, str], cwd: str) -> int:
    """Run argv with stdout and stderr both on one file (`> log 2>&1`)."""
    with open(Path(cwd) / "log", "wb") as log:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                              cwd=cwd, timeout=600).returncode


def timed(side: str, tree: str | None, lines: int, work: Path, to: str = "terminal") -> float:
    out = work / "took"
    out.unlink(missing_ok=True)
    program = [sys.executable, str(work / "spam.py"), str(lines), str(out)]
    env = {**os.environ, "GPUTUI_HOME": str(work / "home"), "TERM": "xterm-256color"}
    if side == "direct":
        argv = program
    else:
        env["PYTHONPATH"] = str(tree)
        argv = [sys.executable, "-m", "gputui", "run", "--run-dir", str(work / f"run-{side}-{os.urandom(3).hex()}"),
                "--", *program]
    code = (on_pty if to == "terminal" else to_file)(argv, env, str(work))
    if code != 0 or not out.exists():
        raise SystemExit(f"{side}: exit {code}, no time written")
    return float(out.read_text())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--vs-tree", help="another checkout of gputui to run too (interleaved)")
    parser.add_argument("--to", choices=("terminal", "file"), default="terminal",
                        help="where stdout and stderr go: a pseudo-terminal, or one file (> log 2>&1)")
    args = parser.parse_args()
    sides = {"direct": None, "gputui": str(HERE)}
    if args.vs_tree:
        sides["old gputui"] = str(Path(args.vs_tree).resolve())
    print(f"load average {os.getloadavg()[0]:.1f}; {args.lines} lines a run to a {args.to}, "
          f"{args.rounds} rounds (interleaved)")
    with tempfile.TemporaryDirectory(prefix="bench-output-") as tmp:
        work = Path(tmp)
        (work / "spam.py").write_text(PROGRAM)
        took: dict[str, list[float]] = {side: [] for side in sides}
        for _ in range(args.rounds):
            for side, tree in sides.items():
                took[side].append(timed(side, tree, args.lines, work, args.to))
    direct = statistics.median(took["direct"])
    for side, values in took.items():
        median = statistics.median(values)
        print(f"{side:11}: median {median:6.3f} s (min {min(values):.3f}, max {max(values):.3f}) | "
              f"{median / direct:5.2f}x direct | {args.lines / median:8.0f} lines/s")
    ratio = statistics.median(took["gputui"]) / direct
    print(f"target: under gputui <= 3x direct ({args.to}): {'met' if ratio <= 3 else 'MISSED'} ({ratio:.2f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
