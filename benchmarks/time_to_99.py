"""Time to 99.0% MNIST test accuracy: `gputui run --model fast` vs the public one-epoch recipe.

(a) The public one-epoch speed recipe (tuomaso/train_mnist_fast, final version) as a
    plain PyTorch script: conv 1->24 5x5, conv 24->32 3x3, max-pool before ReLU, fc
    800->256->10, Adam betas (0.7, 0.9), torch's OneCycleLR, batch 128, one epoch,
    whole dataset as tensors. Evaluated at the same points as (b).
(b) `gputui run --model fast --seed S --json` in a subprocess, read from its events.

Both on the same device (`--device cuda` for a GPU; the CPU by default), and both the same
way: each seed in a fresh process. For each seed: the training time (evaluation excluded) to
the first evaluation at >= 99.0%, the final accuracy, and for (b) the wall time from the
command to its `done` event; `cold` (first-use costs included: (a)'s first run in its
process, (b)'s warm-up plus its training) and `warm` ((a) run again in the same process,
(b)'s training clock) apart. Prints the medians and the ratios: the public recipe's warm
epoch over gputui's warm median time to 99.0% (issue 11's figure), and the medians to 99.0%.
A seed that fails is a row saying so; the table still prints, and the exit code is 1. Usage:
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
CHILD_TIMEOUT_S = 900  # one seed's process, either side


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


def public_recipe(seed: int, device_name: str = "cpu", data_dir: str | None = None) -> dict[str, Any]:
    """(a): one epoch of the public recipe, NCHW as published, eager PyTorch on `device_name`."""
    data = load_dataset(None if data_dir is None else Path(data_dir))
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


def _child(cmd: list[str]) -> tuple[int, str, str, float]:
    """A fresh process: (exit code, stdout, stderr's last line, wall seconds). Never raises on a
    failed run: its row says so and the table still prints."""
    t0 = time.perf_counter()
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return 124, "", f"timed out after {CHILD_TIMEOUT_S} s", time.perf_counter() - t0
    tail = (out.stderr.strip().splitlines() or [""])[-1][:300]
    return out.returncode, out.stdout, tail, time.perf_counter() - t0


def public_cold_warm(seed: int, device: str = "cpu", data: str | None = None) -> dict[str, Any]:
    """(a) in a fresh process, as (b) runs: `cold` its first run there (first-use costs inside its
    clock, as the published script has them), `warm` the same seed again in that process."""
    code, out, err, _ = _child([sys.executable, str(Path(__file__).resolve()), "--worker-public", str(seed),
                                "--device", device, *(["--data", data] if data else [])])
    try:
        return {"seed": seed, **json.loads(out.strip().splitlines()[-1])}
    except (IndexError, ValueError):
        return {"seed": seed, "error": f"exit {code}: {err}"}


def gputui_fast(seed: int, device: str = "cpu", data: str | None = None) -> dict[str, Any]:
    """(b): the real command line in a fresh process, timed by its own events (and its wall time,
    command to exit). `cold`: the start-up warm-up (`warmup_s` of its start event, where it reports
    one) plus the training time to 99.0%; `warm`: the training time alone (its clock starts warm)."""
    with tempfile.TemporaryDirectory() as tmp:
        code, out, err, wall = _child([sys.executable, "-m", "gputui", "run", "--model", "fast", "--seed", str(seed),
                                       "--json", "--device", device, "--run-dir", str(Path(tmp) / "run"),
                                       *(["--data", data] if data else [])])
    events = []
    for line in out.splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:
            continue
    done = events[-1] if events else {}
    if code != 0 or done.get("event") != "done":
        return {"seed": seed, "error": f"exit {code}: {err}", "wall_s": round(wall, 3)}
    evals = [e for e in events if e["event"] in ("eval", "epoch")]
    first = next((e["elapsed_s"] for e in evals if e["test_acc"] >= TARGET), None)
    start: dict[str, Any] = next((e for e in events if e["event"] == "start"), {})
    warmup = float(start.get("warmup_s", 0.0))
    warm = {"time_to_99_s": first, "final_acc": done["test_acc"], "train_s": done["elapsed_s"]}
    cold = {"time_to_99_s": None if first is None else round(first + warmup, 3), "final_acc": done["test_acc"],
            "train_s": round(done["elapsed_s"] + warmup, 3)}
    return {"seed": seed, "cold": cold, "warm": warm, "warmup_s": warmup, "wall_s": round(wall, 3),
            "step_impl": start.get("step_impl", "eager")}


def median_time(rows: list[dict[str, Any]]) -> float | None:
    """Median time to 99%, counting a seed that never got there at its whole training time (a lower
    bound); None when no row has a figure."""
    times = [r["time_to_99_s"] if r["time_to_99_s"] is not None else r["train_s"] for r in rows]
    return statistics.median(times) if times else None


def reached(rows: list[dict[str, Any]]) -> str:
    return f"{sum(r['time_to_99_s'] is not None for r in rows)}/{len(rows)} seeds reached 99.0%"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f} s"


def _ratio(a: float | None, b: float | None) -> str:
    return "n/a" if a is None or not b else f"{a / b:.2f}x"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", default="cpu", help="cpu or cuda: both sides train there")
    parser.add_argument("--data", default=None, help="an MNIST directory for both sides (default: the bundled one)")
    parser.add_argument("--worker-public", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker_public is not None:  # one fresh process of (a): a cold run, then a warm one
        cold = public_recipe(args.worker_public, args.device, args.data)
        warm = public_recipe(args.worker_public, args.device, args.data)
        print(json.dumps({"cold": cold, "warm": warm}))
        return 0
    public, ours = [], []
    for seed in args.seeds:  # interleaved: a machine that gets busier slows both sides alike
        public.append(public_cold_warm(seed, args.device, args.data))
        ours.append(gputui_fast(seed, args.device, args.data))
    failed = [(name, r) for name, rows in (("(a)", public), ("(b)", ours)) for r in rows if "error" in r]
    medians: dict[str, float | None] = {}
    for name, rows in (("(a) public one-epoch recipe", public), ("(b) gputui run --model fast", ours)):
        print(f"{name} (each seed in a fresh process)")
        for r in rows:
            if "error" in r:
                print(f"    seed {r['seed']}: FAILED ({r['error']})")
                continue
            for kind in ("cold", "warm"):
                k = r[kind]
                t = "never" if k["time_to_99_s"] is None else f"{k['time_to_99_s']:.2f} s"
                print(f"    seed {r['seed']} {kind}: 99.0% after {t}; final {k['final_acc']:.2f}% "
                      f"({k['train_s']:.2f} s training)")
    for side, rows in (("a", public), ("b", ours)):
        for kind in ("cold", "warm"):
            medians[f"{side}_{kind}"] = median_time([r[kind] for r in rows if "error" not in r])
    good_a = [r["warm"] for r in public if "error" not in r]
    good_b = [r for r in ours if "error" not in r]
    print(f"(a) warm: {reached(good_a)}; (b) warm: {reached([r['warm'] for r in good_b])}")
    print("median time to 99.0% (a seed that never reached it counts its whole training time):")
    for kind in ("cold", "warm"):
        a, b = medians[f"a_{kind}"], medians[f"b_{kind}"]
        print(f"    {kind}: (a) {_fmt(a)}, (b) {_fmt(b)}; ratio a/b: {_ratio(a, b)}")
    epoch = statistics.median(r["train_s"] for r in good_a) if good_a else None
    print(f"public recipe's warm epoch ({_fmt(epoch)}) over gputui's warm median to 99.0% "
          f"({_fmt(medians['b_warm'])}): {_ratio(epoch, medians['b_warm'])}")
    if good_b:
        print(f"gputui wall, command to done: median {statistics.median(r['wall_s'] for r in good_b):.2f} s "
              f"(step: {', '.join(sorted({r['step_impl'] for r in good_b}))})")
        print(f"every gputui seed ends >= 99.0%: {all(r['warm']['final_acc'] >= TARGET for r in good_b)}")
    print(json.dumps({"public": public, "gputui": ours, "medians": medians, "public_epoch_s": epoch,
                      "failed": len(failed)}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
