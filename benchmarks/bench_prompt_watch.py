"""What watching for a prompt (gputui.jobs.prompt: is a process of the program reading the
terminal?) costs `gputui run` while a program runs quietly.

Two sides in one run, interleaved, the order alternating: `gputui run -- python -c "sleep S"`
with stdin, stdout and stderr on a pseudo-terminal (the watch looks at the program's processes
every 0.2 s while its output is quiet) and the same with stdin /dev/null (no watch; stdout and
stderr still on the terminal, so the view is the same live status line). Measured: the CPU
seconds gputui and the program used (the children's rusage of each command), per second of
the run. The program sleeps, so what differs is gputui's. Prints the medians and the ratio
tty/devnull. `--hogs N` runs the same beside N busy-looping processes.

    .venv/bin/python benchmarks/bench_prompt_watch.py [--rounds 6] [--seconds 10] [--hogs 2]
"""

from __future__ import annotations

import argparse
import os
import pty
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from hogs import busy_loops  # beside this script

REPO = Path(__file__).resolve().parent.parent


def _drain(fd: int) -> None:
    while True:
        try:
            if not os.read(fd, 65536):
                return
        except OSError:
            return


def _run(seconds: float, tty_stdin: bool, env: dict[str, str], cwd: str) -> tuple[float, float]:
    """(CPU seconds of the command and its children, wall seconds) of one run on a fresh terminal."""
    master, slave = pty.openpty()
    reader = threading.Thread(target=_drain, args=(master,), daemon=True)
    reader.start()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    try:
        subprocess.run([sys.executable, "-m", "gputui", "run", "--device", "cpu", "--", sys.executable, "-c",
                        f"import time; time.sleep({seconds})"], cwd=cwd, env=env, check=True,
                       stdin=slave if tty_stdin else subprocess.DEVNULL, stdout=slave, stderr=slave, timeout=600)
    finally:
        os.close(slave)
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    reader.join(10)
    os.close(master)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--hogs", type=int, default=0)
    args = parser.parse_args()
    per_s: dict[str, list[float]] = {"tty": [], "devnull": []}
    with busy_loops(args.hogs), tempfile.TemporaryDirectory(prefix="gputui-bench-prompt-") as top:
        env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE")}
        env.update(GPUTUI_HOME=str(Path(top) / "home"), TERM="xterm", COLUMNS="100",
                   PYTHONPATH=str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""))
        for k in range(args.rounds):
            for side in (("tty", "devnull") if k % 2 == 0 else ("devnull", "tty")):
                cpu, wall = _run(args.seconds, side == "tty", env, top)
                per_s[side].append(cpu / wall)
    load = os.getloadavg()[0]
    print(f"{args.rounds} rounds of a {args.seconds:g} s quiet program; {args.hogs} hog(s); load {load:.1f} at the end")
    for side in ("tty", "devnull"):
        print(f"stdin {side:7}: {statistics.median(per_s[side]) * 1000:6.1f} ms of CPU a second of the run (median)")
    tty, devnull = statistics.median(per_s["tty"]), statistics.median(per_s["devnull"])
    print(f"ratio tty/devnull: {tty / devnull:.3f}x; the watch adds {(tty - devnull) * 1000:.2f} ms of CPU a second "
          f"({(tty - devnull) * 100:.3f}% of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
