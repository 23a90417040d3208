"""NVML utilisation over a long seed run: `gputui run --model seed --epochs N --json` in a child
process, the GPU's utilisation sampled every 50 ms from its first step event to its `done`.

Usage: python benchmarks/gpu_check_nvml.py --device cuda --epochs 60 --run-dir DIR [--data DIR]
Prints one JSON line: {"util_mean_pct", "samples", "elapsed_s", "done", "error"}. On the CPU (a
dry run) the run is made and no utilisation is sampled (util_mean_pct null).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from typing import Any


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--epochs", type=int, default=60)
    parser.add_argument("--run-dir", required=True)
    parser.add_argument("--data", default=None)
    args = parser.parse_args()
    result: dict[str, Any] = {"util_mean_pct": None, "samples": 0, "elapsed_s": None, "done": False, "error": None}
    handle = None
    if args.device.startswith("cuda"):
        try:
            import pynvml

            pynvml.nvmlInit()
            index = int(args.device.split(":")[1]) if ":" in args.device else 0
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:  # noqa: BLE001 - no NVML: the run still goes, the figure says why
            result["error"] = f"NVML: {type(exc).__name__}: {exc}"
    cmd = [sys.executable, "-m", "gputui", "run", "--json", "--model", "seed", "--device", args.device,
           "--epochs", str(args.epochs), "--run-dir", args.run_dir, *(["--data", args.data] if args.data else [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    samples: list[int] = []
    training = threading.Event()
    finished = threading.Event()

    def sample() -> None:
        import pynvml

        while not finished.is_set():
            if training.is_set() and handle is not None:
                samples.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            time.sleep(0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    if handle is not None:
        sampler.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "step":
            training.set()
        if event.get("event") == "done":
            finished.set()
            result.update(done=True, elapsed_s=event.get("elapsed_s"))
    finished.set()
    code = proc.wait()
    err = proc.stderr.read() if proc.stderr is not None else ""
    if code != 0:
        result["error"] = f"exit {code}: {(err.strip().splitlines() or [''])[-1][:300]}"
    if samples:
        result.update(util_mean_pct=round(sum(samples) / len(samples), 1), samples=len(samples))
    print(json.dumps(result))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
