"""Poll cost per local GPU with NVML: `NvmlSource.poll()` timed over many polls.

Reads every GPU in one pass per poll (utilisation, memory, temperature, power, fan, clocks,
PCIe counters, P-state, ECC, throttle reasons, processes) and prints the median poll time
and the cost per GPU against the 2 ms target; `--process-sm` also reads each process's SM %
(what a process table costs). Needs an NVIDIA driver and GPU; elsewhere it says so and exits
2, unless `--fake N`: N simulated GPUs, each running one process (this one), whose every
NVML call takes the latency measured on an H100 (tests/fake_pynvml.py, from
shared/reference/h100/README.md). Usage:
    python benchmarks/bench_nvml_poll.py [--polls 200] [--json FILE] [--process-sm]
    python benchmarks/bench_nvml_poll.py --fake 8 [--process-sm]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.model.telemetry import HostState  # noqa: E402
from gputui.sources.nvml import NvmlSource  # noqa: E402

TARGET_S_PER_GPU = 2e-3


def fake_source(gpus: int, process_sm: bool) -> tuple[NvmlSource, object, list[subprocess.Popen[bytes]]]:
    """N fake GPUs with the H100's latencies, each running its own (sleeping) process, as a DDP run has."""
    from tests.fake_pynvml import H100_LATENCY_S, FakeDevice, make_pynvml

    workers = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"]) for _ in range(gpus)]
    devices = [FakeDevice(uuid=f"GPU-{i}", processes=[(w.pid, 2**30)], process_sm={w.pid: 90}, reasons=0x4)
               for i, w in enumerate(workers)]
    nv = make_pynvml(devices, driver="580.159.04 (fake, H100 latencies)", latency=H100_LATENCY_S)
    return NvmlSource(name="fake-h100", module=nv, process_sm=process_sm), nv, workers  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=200)
    parser.add_argument("--json", type=Path, help="also write the last snapshot here (what NVML read)")
    parser.add_argument("--process-sm", action="store_true", help="also read per-process SM %% (as a process table does)")
    parser.add_argument("--fake", type=int, metavar="N", help="N fake GPUs with the H100's measured call latencies")
    args = parser.parse_args()
    nv, workers = None, []
    if args.fake:
        source, nv, workers = fake_source(args.fake, args.process_sm)
    else:
        source = NvmlSource(process_sm=args.process_sm)
    first = source.poll()[0]  # initialises NVML and probes the optional calls
    if first.state != HostState.OK or not first.gpus:
        print(f"no GPU to measure here: {first.state.value}: {first.message}")
        return 2
    walls = []
    devices = [] if nv is None else [nv.nvmlDeviceGetHandleByIndex(i) for i in range(args.fake)]  # type: ignore[attr-defined]
    for _ in range(args.polls):
        for device in devices:  # time passes on the fake GPUs: their PCIe counters move
            device.advance(0.01, tx_bytes_s=2e9, rx_bytes_s=5e8)
        t0 = time.perf_counter()
        snap = source.poll()[0]
        walls.append(time.perf_counter() - t0)
    source.close()
    for worker in workers:
        worker.kill()
        worker.wait()
    n = len(snap.gpus)
    median = statistics.median(walls)
    print(f"{n} GPU(s) ({', '.join(sorted({g.name or 'n/a' for g in snap.gpus}))}), driver {snap.driver}")
    print(f"poll: median {median * 1000:.2f} ms, p90 {sorted(walls)[int(0.9 * len(walls))] * 1000:.2f} ms over {args.polls} polls")
    per_gpu = median / n
    print(f"per GPU: {per_gpu * 1000:.2f} ms (target {TARGET_S_PER_GPU * 1000:.0f} ms: {per_gpu / TARGET_S_PER_GPU:.2f}x of it)"
          f"{' with per-process SM %' if args.process_sm else ''}")
    if nv is not None:
        calls = {k: v // (args.polls + 1) for k, v in nv.calls.items()  # type: ignore[attr-defined]
                 if v >= args.polls and k != "nvmlDeviceGetHandleByIndex"}
        print("NVML calls per poll: " + ", ".join(f"{k.removeprefix('nvmlDevice')} x{v}" for k, v in sorted(calls.items())))
    missing = sorted({k for g in snap.gpus for k, v in g.to_dict().items() if v is None})
    print(f"metrics this driver does not give: {', '.join(missing) or 'none'}")
    if args.json:
        args.json.write_text(json.dumps(snap.to_dict(), indent=2))
    return 0 if per_gpu <= TARGET_S_PER_GPU or args.process_sm else 1


if __name__ == "__main__":
    raise SystemExit(main())
