"""SIGTERM to exit: how long `gputui run` takes to checkpoint and leave once signalled mid-epoch.

`gputui run --json` on a 4096-image slice of the bundled MNIST (batch 4, one thread, 1024
steps an epoch, as tests/test_resume.py runs it) is signalled at the first evaluation of
epoch 2; timed from the signal to the process's exit, the `interrupted` event and the
checkpoint included. tests/test_resume.py checks what happens; this measures how long it
takes. Prints the median and worst of `--repeat` runs against the 5 s target; exits 1 if
the worst passes it. Usage:
    python benchmarks/bench_stop.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import make_dataset  # noqa: E402
from tests.proc_support import Child  # noqa: E402

TARGET_S = 5.0
TRAIN = ["--epochs", "3", "--batch-size", "4", "--seed", "7", "--threads", "1", "--evals-per-epoch", "4"]


def runs(repeat: int, root: Path, data: Path, env: dict[str, str], took: list[float]) -> None:
    for i in range(repeat):
        argv = [sys.executable, "-m", "gputui", "run", "--json", "--data", str(data), *TRAIN, "--run-dir", str(root / f"r{i}")]
        with Child(argv, env=env, name="gputui run") as child:
            child.wait_for(lambda e: e["event"] == "eval" and e["epoch"] == 2, 300, "an evaluation inside epoch 2")
            t0 = time.perf_counter()
            child.proc.send_signal(signal.SIGTERM)
            code = child.finish(120, "the exit after SIGTERM")
            took.append(time.perf_counter() - t0)
        last = child.events[-1]
        assert code == 0 and last["event"] == "interrupted", (code, child.kinds(), child.stderr[-500:])
        print(f"run {i + 1}: stopped at step {last['step']}, exit {took[-1]:.3f} s after SIGTERM")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-stop-"))
    data = make_dataset(root / "data", 4096, 1000)
    env = {**os.environ, "GPUTUI_HOME": str(root / "home")}
    took: list[float] = []
    try:
        runs(args.repeat, root, data, env, took)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    median, worst = statistics.median(took), max(took)
    print(f"SIGTERM to exit (checkpoint included): median {median:.3f} s, worst {worst:.3f} s over {len(took)} runs "
          f"(target < {TARGET_S:g} s: worst {worst / TARGET_S:.2f}x)")
    return 0 if worst < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
