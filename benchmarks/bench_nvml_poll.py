"""Poll cost per local GPU with NVML: `NvmlSource.poll()` timed over many polls.

Reads every GPU in one pass per poll (utilisation, memory, temperature, power and limit,
fan, clocks, PCIe, P-state, ECC, processes) and prints the median poll time and the cost
per GPU. Needs an NVIDIA driver and GPU; elsewhere it says so and exits 2. Usage:
    python benchmarks/bench_nvml_poll.py [--polls 200] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.model.telemetry import HostState  # noqa: E402
from gputui.sources.nvml import NvmlSource  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the last snapshot here (what NVML read)")
    args = parser.parse_args()
    source = NvmlSource()
    first = source.poll()[0]  # initialises NVML and probes the optional calls
    if first.state != HostState.OK or not first.gpus:
        print(f"no GPU to measure here: {first.state.value}: {first.message}")
        return 2
    walls = []
    for _ in range(args.polls):
        t0 = time.perf_counter()
        snap = source.poll()[0]
        walls.append(time.perf_counter() - t0)
    source.close()
    n = len(snap.gpus)
    median = statistics.median(walls)
    print(f"{n} GPU(s) ({', '.join(sorted({g.name or 'n/a' for g in snap.gpus}))}), driver {snap.driver}")
    print(f"poll: median {median * 1000:.2f} ms, p90 {sorted(walls)[int(0.9 * len(walls))] * 1000:.2f} ms over {args.polls} polls")
    print(f"per GPU: {median / n * 1000:.2f} ms")
    missing = sorted({k for g in snap.gpus for k, v in g.to_dict().items() if v is None})
    print(f"metrics this driver does not give: {', '.join(missing) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(snap.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
