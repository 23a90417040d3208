"""Clusters on one machine: bootstrap cost, multi-node overhead, gloo all-reduce on loopback.

Real OpenSSH sshd processes on 127.0.0.2 (tests/cluster_fixture.py) stand in for slaves.

1. Bootstrap of a fresh slave (venv, wheel, dataset) vs an already-bootstrapped one (target
   <= 2 s), connection included, `--repeat` times.
2. Multi-node overhead on the CPU: the seed network, one epoch of `--steps` global batches
   of `--batch-size`, as `gputui run` on 2 nodes x 1 process (the master and one slave,
   gloo over loopback, threads = 1 each) vs 1 process x 2 threads, same global batch.
   The rate is taken between the first step event and the end of the epoch.
3. gloo all-reduce on loopback between 2 processes: time per all-reduce of float32 tensors
   the size of the seed network's parameters, the fast network's, and larger ones; a
   latency + bytes/bandwidth fit for the scaling model in BENCHMARKS.md.

Usage: python benchmarks/bench_cluster.py [--repeat 3] [--steps 60] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import shutil
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gputui.cluster.bootstrap import Bootstrapper, local_dataset  # noqa: E402
from gputui.cluster.sshnode import SlaveConnection  # noqa: E402
from gputui.cluster.wheel import build_wheel  # noqa: E402
from gputui.config.hosts import HostSpec  # noqa: E402
from gputui.model.paths import bundled_mnist  # noqa: E402
from tests.cluster_fixture import ClusterNodes, cluster_profile, trust  # noqa: E402

ALLREDUCE = r"""
import json, os, sys, time, torch, torch.distributed as d
d.init_process_group("gloo")
out = {}
for name, n in json.loads(sys.argv[1]).items():
    t = torch.ones(n)
    for _ in range(5):
        d.all_reduce(t)
    reps = max(10, min(400, int(2e8 // max(n * 4, 1) // 50)))
    d.barrier(); t0 = time.perf_counter()
    for _ in range(reps):
        d.all_reduce(t)
    out[name] = (time.perf_counter() - t0) / reps
if d.get_rank() == 0:
    print("@@" + json.dumps(out), flush=True)
d.destroy_process_group()
"""


def rate(events: list[dict], batch: int) -> float:
    steps = [e for e in events if e["event"] == "step"]
    done = next(e for e in events if e["event"] == "done")
    return (done["step"] - steps[0]["step"]) * batch / (done["elapsed_s"] - steps[0]["elapsed_s"])


def gputui_run(*args: str) -> list[dict]:
    done = subprocess.run([sys.executable, "-m", "gputui", "run", "--json", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ))
    if done.returncode != 0:
        raise SystemExit(f"gputui run failed: {done.stderr[-2000:]}")
    return [json.loads(line) for line in done.stdout.splitlines()]


def param_count(model: str) -> int:
    from gputui.train import nets

    return sum(p.numel() for p in nets.build(model, (28, 28), 10).parameters())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gputui-bench-cluster-"))
    os.environ["GPUTUI_HOME"] = str(root / "home")
    nodes = ClusterNodes(root)
    try:
        node = nodes.node(0)
        trust(root / "home", node)
        wheel = build_wheel(root / "wheels")
        os.environ["GPUTUI_WHEEL"] = str(wheel.path)
        spec = HostSpec("n0", node.address, node.port, "root", nodes.user_key)
        boot = Bootstrapper("~/.gputui-cluster", "python3", wheel, local_dataset(bundled_mnist()))

        # 1. bootstrap: first, then again (each a fresh connection, as a run makes)
        firsts, agains = [], []
        for i in range(args.repeat):
            remote_dir = f"~/.gputui-cluster-{i}"
            boot.remote_dir = remote_dir
            for bucket in (firsts, agains):
                t0 = time.perf_counter()
                conn = SlaveConnection(spec).open_or_raise()
                result = boot.bootstrap(conn)
                conn.close()
                bucket.append(time.perf_counter() - t0)
                assert result.skipped == (bucket is agains), result
        print(f"bootstrap, fresh slave (venv, wheel, MNIST 11 MB md5-checked): median {statistics.median(firsts):.2f} s "
              f"(all: {', '.join(f'{t:.2f}' for t in firsts)})")
        print(f"bootstrap, already bootstrapped: median {statistics.median(agains):.3f} s, worst {max(agains):.3f} s "
              f"(target 2 s: {max(agains) / 2:.2f}x)")

        # 2. 2 nodes x 1 process vs 1 process x 2 threads, same global batch
        from gputui.jobs.bench import slice_dataset

        data = slice_dataset(root / "data", args.steps * args.batch_size)
        common = ["--data", str(data), "--epochs", "1", "--batch-size", str(args.batch_size), "--device", "cpu", "--seed", "0"]
        profile = cluster_profile(root / "cluster.toml", [node], nodes.user_key, {"threads": 1})
        singles, multis = [], []
        for i in range(args.repeat):
            singles.append(rate(gputui_run(*common, "--threads", "2", "--run-dir", str(root / f"s{i}")), args.batch_size))
            multis.append(rate(gputui_run("--profile", str(profile), *common, "--run-dir", str(root / f"m{i}")), args.batch_size))
        s, m = statistics.median(singles), statistics.median(multis)
        print(f"seed net, batch {args.batch_size}, {args.steps} steps: 1 process x 2 threads {s:,.0f} samples/s "
              f"({args.batch_size / s * 1000:.2f} ms/step); 2 nodes x 1 process {m:,.0f} samples/s "
              f"({args.batch_size / m * 1000:.2f} ms/step); ratio {m / s:.2f}")
        print(f"  runs: single {', '.join(f'{v:,.0f}' for v in singles)}; 2 nodes {', '.join(f'{v:,.0f}' for v in multis)}")

        # 3. gloo all-reduce between 2 processes on loopback
        sizes = {"seed params": param_count("seed"), "fast params": param_count("fast"), "1 MiB": 1 << 18, "16 MiB": 1 << 22}
        script = root / "allreduce.py"
        script.write_text(ALLREDUCE)
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                               f"--log-dir={root / 'torchrun'}", str(script), json.dumps(sizes)], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"})
        found = json.loads(next(line[2:] for line in done.stdout.splitlines() if line.startswith("@@")))
        for name, n in sizes.items():
            print(f"  all-reduce {name:<12} {n:>9,} floats ({n * 4 / 1024:>8,.1f} KiB): {found[name] * 1e3:8.3f} ms")
        small, big = found["seed params"], found["16 MiB"]
        bandwidth = (sizes["16 MiB"] - sizes["seed params"]) * 4 / max(big - small, 1e-9)
        latency = small - sizes["seed params"] * 4 / bandwidth
        print(f"  fit: latency {latency * 1e3:.3f} ms + bytes / {bandwidth / 1e6:,.0f} MB/s")
        return 0
    finally:
        nodes.stop()
        shutil.rmtree(root, ignore_errors=True)  # nothing left in the temporary directory


if __name__ == "__main__":
    raise SystemExit(main())
