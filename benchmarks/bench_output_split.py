"""How fast a program's output is split into lines: `LineSplitter` as the program's pump uses it
(`redraws=True`: a carriage return ends a progress bar's frame too) against the plain newline
splitter it replaced, on the same bytes in one run; and the whole pump (`_Pump`: output.log,
the split, what shows of a frame not yet ended) on the same bytes.

    .venv/bin/python benchmarks/bench_output_split.py [--mb 32] [--vs-tree OLD_CHECKOUT]

With --vs-tree, the whole pump of another checkout of gputui (an older commit: `git worktree
add /tmp/old <commit>`) runs on the same bytes too, each side in a fresh process, interleaved.

Two kinds of output: log lines (80 bytes, "\\n") and a tqdm-style bar (100-byte frames, "\\r",
a newline every 1,000 frames). Prints MB/s of each side and the ratio new/plain (1.0: as fast).
Target: the pump reads >= 40 MB/s of log lines on a quiet machine (thousands of times what a
training program prints: gputui never slows a program that prints), and no slower than the pump
it replaced (judge by --vs-tree, both sides interleaved in one run).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import threading
import time

TREE = os.environ.get("BENCH_TREE") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, TREE)

from gputui.jobs.program import _Pump  # noqa: E402
from gputui.model.lines import OUTPUT_LINE, LineSplitter  # noqa: E402

CHUNK = 65536


def data_of(kind: str, mb: int) -> bytes:
    if kind == "lines":
        unit = b"".join(b"step %07d loss 0.%06d lr 0.001 some more words to make eighty bytes.\n" % (i, i)
                        for i in range(1000))
    else:
        unit = b"".join(b"\rEpoch 1: %3d%%|##########          | %7d/1000000 [01:02<03:04, 123.45it/s, loss=0.%04d]"
                        % (i // 10, i, i) for i in range(1000)) + b"\n"
    return unit * max(1, mb * 1024 * 1024 // len(unit))


def split_rate(data: bytes, redraws: bool) -> float:
    splitter = LineSplitter(OUTPUT_LINE, b" [...]", redraws=redraws)
    t = time.perf_counter()
    for at in range(0, len(data), CHUNK):
        splitter.feed(data[at:at + CHUNK])
    return len(data) / (time.perf_counter() - t) / 1e6


def pump_rate(data: bytes) -> float:
    log = open(os.devnull, "wb", buffering=0)
    pump = _Pump(io.BytesIO(data), "stdout", log, threading.Lock(), lambda *seen: None)  # any commit's callback
    t = time.perf_counter()
    pump.run()
    rate = len(data) / (time.perf_counter() - t) / 1e6
    log.close()
    return rate


def pump_in(tree: str, kind: str, mb: int) -> float:
    """The whole pump's MB/s of `tree`'s gputui, in a fresh process."""
    import subprocess

    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--pump-only", kind, "--mb", str(mb)],
                         env={**os.environ, "BENCH_TREE": tree}, capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vs-tree", help="another checkout of gputui whose pump runs too (interleaved)")
    parser.add_argument("--pump-only", choices=("lines", "bar"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.pump_only:
        print(pump_rate(data_of(args.pump_only, args.mb)))
        return 0
    print(f"load average {os.getloadavg()[0]:.1f}; {args.mb} MB each, best of {args.rounds} rounds (interleaved)")
    worst_pump = float("inf")
    for kind in ("lines", "bar"):
        data = data_of(kind, args.mb)
        plain, new, pump, old = [], [], [], []
        for _ in range(args.rounds):  # interleaved: both sides see the same load
            plain.append(split_rate(data, False))
            new.append(split_rate(data, True))
            if args.vs_tree:
                pump.append(pump_in(TREE, kind, args.mb))
                old.append(pump_in(args.vs_tree, kind, args.mb))
            else:
                pump.append(pump_rate(data))
        p, n, w = max(plain), max(new), max(pump)
        if kind == "lines":
            worst_pump = w
        versus = f" | {args.vs_tree}'s pump {max(old):6.0f} MB/s, ratio {w / max(old):4.2f}" if old else ""
        if old and kind == "bar":
            versus += " (a pump without redraws cut the bar at 64 KiB and skipped the rest: no like for like)"
        print(f"{kind:5}: plain split {p:7.0f} MB/s | redraws split {n:7.0f} MB/s | ratio {n / p:4.2f} | "
              f"whole pump {w:6.0f} MB/s{versus}")
    print(f"target: the pump >= 40 MB/s of log lines: {'met' if worst_pump >= 40 else 'MISSED'} ({worst_pump:.0f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
