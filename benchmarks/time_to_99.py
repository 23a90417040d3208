"""Time to 99.0% MNIST test accuracy: `gputui run --model fast` vs the public one-epoch recipe.

(a) The public one-epoch speed recipe (tuomaso/train_mnist_fast, final version) as a
    plain PyTorch script: conv 1->24 5x5, conv 24->32 3x3, max-pool before ReLU, fc
    800->256->10, Adam betas (0.7, 0.9), torch's OneCycleLR, batch 128, one epoch,
    whole dataset as tensors. Evaluated at the same points as (b).
(b) `gputui run --model fast --seed S --json` in a subprocess, read from its events.

Both on the same device (`--device cuda` for a GPU; the CPU by default). For each seed:
the training time (evaluation excluded) to the first evaluation at >= 99.0%, the final
accuracy, and for (b) the wall time from the command to its `done` event. Prints the
medians and the ratios: the public recipe's epoch time over gputui's median time to
99.0% (issue 11's figure), and the two medians to 99.0%. Usage:
    python benchmarks/time_to_99.py [--seeds 1 2 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from gputui.train.data import load_dataset
from gputui.train.loop import eval_points, evaluate, to_device
from gputui.config.recipes import RECIPES

TARGET = 99.0


class PublicNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 24, 5, 1)
        self.conv2 = nn.Conv2d(24, 32, 3, 1)
        self.fc1 = nn.Linear(800, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def public_recipe(seed: int, device_name: str = "cpu") -> dict[str, Any]:
    """(a): one epoch of the public recipe, NCHW as published, eager PyTorch on `device_name`."""
    data = load_dataset()
    device = torch.device(device_name)
    x, y = to_device(data.train_images, data.train_labels, device)
    x = x.contiguous()  # the published script uses the default (NCHW) layout
    tx, ty = to_device(data.test_images, data.test_labels, device)
    torch.manual_seed(seed)
    model = PublicNet().to(device)
    batch = 128
    steps = len(x) // batch
    opt = torch.optim.Adam(model.parameters(), lr=0.01, betas=(0.7, 0.9))
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.01, total_steps=steps)
    perm = torch.randperm(len(x)).to(device)
    points = set(eval_points(steps, RECIPES["fast"].evals_per_epoch))
    train_s, first, acc = 0.0, None, 0.0
    _sync(device)
    t0 = time.perf_counter()
    for step in range(steps):
        idx = perm[step * batch : (step + 1) * batch]
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        if step + 1 in points:
            _sync(device)
            train_s += time.perf_counter() - t0
            acc = evaluate(model, tx, ty)[1]
            if first is None and acc >= TARGET:
                first = train_s
            t0 = time.perf_counter()
    return {"seed": seed, "time_to_99_s": first, "final_acc": round(acc, 2), "train_s": round(train_s, 3)}


def gputui_fast(seed: int, device: str = "cpu") -> dict[str, Any]:
    """(b): the real command line, timed by its own events (and its wall time, command to exit)."""
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "gputui", "run", "--model", "fast", "--seed", str(seed), "--json",
               "--device", device, "--run-dir", str(Path(tmp) / "run")]
        t0 = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        wall = time.perf_counter() - t0
    events = [json.loads(line) for line in out.splitlines()]
    evals = [e for e in events if e["event"] in ("eval", "epoch")]
    first = next((e["elapsed_s"] for e in evals if e["test_acc"] >= TARGET), None)
    done = events[-1]
    start = next(e for e in events if e["event"] == "start")
    return {"seed": seed, "time_to_99_s": first, "final_acc": done["test_acc"], "train_s": done["elapsed_s"],
            "wall_s": round(wall, 3), "step_impl": start.get("step_impl", "eager")}


def median_time(rows: list[dict[str, Any]]) -> float:
    """Median time to 99%, counting a seed that never got there at its whole training time (a lower bound)."""
    return statistics.median(r["time_to_99_s"] if r["time_to_99_s"] is not None else r["train_s"] for r in rows)


def reached(rows: list[dict[str, Any]]) -> str:
    return f"{sum(r['time_to_99_s'] is not None for r in rows)}/{len(rows)} seeds reached 99.0%"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", default="cpu", help="cpu or cuda: both sides train there")
    args = parser.parse_args()
    public, ours = [], []
    for seed in args.seeds:  # interleaved: a machine that gets busier slows both sides alike
        public.append(public_recipe(seed, args.device))
        ours.append(gputui_fast(seed, args.device))
    for name, rows in (("(a) public one-epoch recipe", public), ("(b) gputui run --model fast", ours)):
        print(name)
        for r in rows:
            t = "never" if r["time_to_99_s"] is None else f"{r['time_to_99_s']:.2f} s"
            print(f"    seed {r['seed']}: 99.0% after {t}; final {r['final_acc']:.2f}% ({r['train_s']:.2f} s training)")
    a, b = median_time(public), median_time(ours)
    print(f"(a): {reached(public)}; (b): {reached(ours)}")
    print("median time to 99.0% (a seed that never reached it counts its whole training time):")
    print(f"    (a) {a:.2f} s, (b) {b:.2f} s; ratio a/b: {a / b:.2f}x")
    epoch = statistics.median(r["train_s"] for r in public)
    print(f"public recipe's epoch ({epoch:.2f} s) over gputui's median time to 99.0% ({b:.2f} s): {epoch / b:.2f}x")
    print(f"gputui wall, command to done: median {statistics.median(r['wall_s'] for r in ours):.2f} s "
          f"(step: {', '.join(sorted({r['step_impl'] for r in ours}))})")
    print(f"every gputui seed ends >= 99.0%: {all(r['final_acc'] >= TARGET for r in ours)}")
    print(json.dumps({"public": public, "gputui": ours, "median_a_s": a, "median_b_s": b}))


if __name__ == "__main__":
    main()
