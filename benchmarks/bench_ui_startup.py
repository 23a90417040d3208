"""The dashboard's start-up and idle cost.

1. First frame: `python -m gputui --demo` in a pseudo-terminal (120x40) with
   GPUTUI_FIRST_FRAME_FILE set; the app writes time.time() there after its first screen
   refresh. Measured from just before the process is started. The floor, measured in the
   same run: `python -c "import textual.app"` (start a Python, import Textual, exit).
2. Idle CPU: the dashboard on 4 simulated hosts x 8 GPUs (GPUTUI_DEMO_HOSTS=4,
   GPUTUI_DEMO_GPUS=8), refreshing every second, no training: user+system CPU time of
   the dashboard process (psutil cpu_times) over 30 s after a 5 s warm-up, as a
   percentage of one core.
3. torch never loaded: the dashboard process's memory map (/proc/PID/maps, psutil) holds no
   file of torch's, checked after its first frame and at the end of the idle window.
   (benchmarks/bench_dashboard_cpu.py measures idle CPU in tmux too, and CPU with a run
   streaming 1,000 events/s.)

    python benchmarks/bench_ui_startup.py [--runs 5] [--idle-seconds 30]
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
import threading
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
FIRST_FRAME_BUDGET_S = 1.0
IDLE_BUDGET_PCT = 3.0


def start_dashboard(env: dict[str, str]) -> tuple[subprocess.Popen[bytes], int]:
    """`python -m gputui --demo` on a 120x40 pseudo-terminal whose output is drained."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "gputui", "--demo"], stdin=slave, stdout=slave, stderr=slave,
                            env=env, cwd=REPO, start_new_session=True)
    os.close(slave)

    def drain() -> None:
        try:
            while os.read(master, 65536):
                pass
        except OSError:
            pass

    threading.Thread(target=drain, daemon=True).start()
    return proc, master


def stop_dashboard(proc: subprocess.Popen[bytes], master: int) -> None:
    try:
        os.write(master, b"q")
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    os.close(master)


def base_env(home: str) -> dict[str, str]:
    env = dict(os.environ, GPUTUI_HOME=home, TERM="xterm-256color", COLUMNS="120", LINES="40")
    env.pop("GPUTUI_FIRST_FRAME_FILE", None)
    return env


def torch_mapped(pid: int) -> list[str]:
    """torch's files in the process's memory map (there once torch is imported)."""
    try:
        return sorted({m.path for m in psutil.Process(pid).memory_maps() if "/torch/" in m.path or "libtorch" in m.path})
    except (psutil.AccessDenied, psutil.NoSuchProcess):
        return ["(cannot read the memory map)"]


TORCH_SEEN: list[str] = []  # torch files found in any dashboard process measured


def first_frame(home: str) -> float:
    stamp = Path(home) / "first-frame"
    stamp.unlink(missing_ok=True)
    env = dict(base_env(home), GPUTUI_FIRST_FRAME_FILE=str(stamp))
    started = time.time()
    proc, master = start_dashboard(env)
    deadline = time.monotonic() + 30
    while not (stamp.is_file() and stamp.read_text().strip()):
        if time.monotonic() > deadline or proc.poll() is not None:
            stop_dashboard(proc, master)
            raise RuntimeError("the dashboard drew no frame")
        time.sleep(0.005)
    seconds = float(stamp.read_text()) - started
    TORCH_SEEN.extend(torch_mapped(proc.pid))
    stop_dashboard(proc, master)
    return seconds


def textual_floor() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import textual.app"], check=True)
    return time.perf_counter() - started


def idle_cpu(home: str, seconds: float) -> float:
    env = dict(base_env(home), GPUTUI_DEMO_HOSTS="4", GPUTUI_DEMO_GPUS="8")
    proc, master = start_dashboard(env)
    try:
        me = psutil.Process(proc.pid)
        time.sleep(5.0)
        before, t0 = me.cpu_times(), time.monotonic()
        time.sleep(seconds)
        after, t1 = me.cpu_times(), time.monotonic()
        TORCH_SEEN.extend(torch_mapped(proc.pid))
    finally:
        stop_dashboard(proc, master)
    used = (after.user - before.user) + (after.system - before.system)
    return 100.0 * used / (t1 - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description="gputui dashboard: time to first frame, idle CPU")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        first_frame(home)  # warm the file cache (and write the .pyc files) once
        frames = [first_frame(home) for _ in range(args.runs)]
        floors = [textual_floor() for _ in range(args.runs)]
        frame, floor = statistics.median(frames), statistics.median(floors)
        print(f"first frame of gputui --demo: median {frame:.3f} s over {args.runs} runs "
              f"(min {min(frames):.3f}, max {max(frames):.3f}); budget {FIRST_FRAME_BUDGET_S:.1f} s")
        print(f"python -c 'import textual.app': median {floor:.3f} s; first frame / floor = {frame / floor:.2f}")
        cpu = idle_cpu(home, args.idle_seconds)
        print(f"idle CPU, 4 sim hosts x 8 GPUs at 1 s: {cpu:.2f}% of one core over {args.idle_seconds:g} s; "
              f"budget {IDLE_BUDGET_PCT:.0f}% (ratio {cpu / IDLE_BUDGET_PCT:.2f})")
        print("torch in the dashboard process: " + (", ".join(sorted(set(TORCH_SEEN))) if TORCH_SEEN else
                                                    "never loaded (memory map checked after each first frame and idle)"))
    return 1 if TORCH_SEEN else 0


if __name__ == "__main__":
    raise SystemExit(main())
