"""Per-step cost: the eager step against the CUDA-graph step, for both nets, in one run.

Each round trains `--steps` steps of each (net, step) pair from the same start on the bundled
MNIST resident on the device, rounds interleaved so a busy machine slows both sides alike;
the first `--warmup` steps of each pair (graph capture included) are left out. Prints the
median ms per step and samples/s of each side and the ratio eager/graph per net.

On CUDA the graph side captures one CUDA graph per step (gputui's default there). Elsewhere
it runs the same static-buffer step eagerly (what a failed capture falls back to), so on the
CPU the ratio shows what the buffer logic costs, expected ~1.0. Usage:
    python benchmarks/bench_step.py [--device cuda] [--steps 200] [--rounds 5] [--models seed fast]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from gputui.config.run import RunSettings
from gputui.train import nets
from gputui.train.data import load_dataset
from gputui.train.devices import synchronize
from gputui.train.graphstep import GraphStep, graph_optimizer
from gputui.train.step import make_step, to_device


def one(cfg, x, y, graph: bool, steps: int, warmup: int) -> float:
    """Seconds per step after `warmup` steps."""
    device = x.device
    torch.manual_seed(0)
    model = nets.build(cfg.model, (28, 28), 10).to(device=device, memory_format=torch.channels_last)
    if graph:  # as make_step builds it on CUDA; elsewhere the same step without the capture
        optimizer = graph_optimizer(cfg.optimizer, model.parameters(), cfg.lr, device, cfg.betas, cfg.momentum,
                                    cfg.weight_decay)
        step_fn = GraphStep(model, optimizer, x, y, cfg.batch_size, cfg.l1, capacity=steps + warmup + 1,
                            on_fallback=lambda reason: print("fallback:", reason))
    else:
        _, step_fn = make_step(cfg, model, model, x, y, False, steps + warmup + 1, None)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(1)).to(device)
    b = cfg.batch_size
    t0 = 0.0
    for step in range(warmup + steps):
        if step == warmup:
            step_fn.take()
            synchronize(device)
            t0 = time.perf_counter()
        start = (step * b) % (len(x) - b)
        step_fn(step, perm[start : start + b], cfg.lr)
    step_fn.take()
    synchronize(device)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--models", nargs="+", default=["seed", "fast"])
    args = parser.parse_args()
    device = torch.device(args.device)
    data = load_dataset()
    x, y = to_device(data.train_images, data.train_labels, device)
    print(f"device {device}" + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else
                                f" ({torch.get_num_threads()} threads)"))
    for model in args.models:
        cfg = RunSettings(model=model, device=args.device, cuda_graph=True).resolve()
        times: dict[str, list[float]] = {"eager": [], "graph": []}
        for _ in range(args.rounds):
            times["eager"].append(one(cfg, x, y, False, args.steps, args.warmup))
            times["graph"].append(one(cfg, x, y, True, args.steps, args.warmup))
        eager, graph = (statistics.median(times[k]) for k in ("eager", "graph"))
        label = "graph" if device.type == "cuda" else "static-buffer step, eager (no CUDA)"
        print(f"{model} (batch {cfg.batch_size}): eager {eager * 1e3:.3f} ms/step ({cfg.batch_size / eager:,.0f} samples/s), "
              f"{label} {graph * 1e3:.3f} ms/step ({cfg.batch_size / graph:,.0f} samples/s); eager/graph {eager / graph:.2f}x")


if __name__ == "__main__":
    main()
