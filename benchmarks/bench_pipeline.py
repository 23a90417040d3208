"""Input pipeline: torchvision-style per-sample DataLoader vs gputui's trainer, same `seed` network.

(a) What pytorch/examples' mnist does through torchvision: a Dataset whose
    __getitem__ makes a PIL image per item, then ToTensor and Normalize, batched by
    a DataLoader (batch 64, shuffled, no workers on a CPU), training the seed
    network with the same optimizer and L1 term. torchvision cannot be imported
    here, so its MNIST + ToTensor + Normalize are reproduced step for step.
(b) gputui's trainer with the default profile (profiles/local.toml): two epochs, timed
    by the trainer's own epoch events; the second epoch is the steady-state figure, as
    (a) skips its first 20 batches.

Both run in alternating rounds (a, b, a, b, ...) so that a noisy neighbour hits both;
prints each round, the medians and the ratio of the medians b/a. Usage:
    python benchmarks/bench_pipeline.py [--rounds 3] [--batches 400] [--threads N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader
from torch.utils.data import Dataset as TorchDataset

from gputui.views.progress import CollectView
from gputui.config.run import RunSettings
from gputui.config.profile import load_profile
from gputui.jobs.run import RunRequest, default_profile, execute, prepare
from gputui.train import nets
from gputui.train.data import load_dataset
from gputui.train.loop import make_optimizer


class TorchvisionStyleMNIST(TorchDataset):  # type: ignore[type-arg]
    """torchvision.datasets.MNIST.__getitem__ with ToTensor() and Normalize((0.1307,), (0.3081,))."""

    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.data = torch.from_numpy(images)  # torchvision keeps uint8 tensors
        self.targets = torch.from_numpy(labels)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        img, target = self.data[index], int(self.targets[index])
        pil = Image.fromarray(img.numpy(), mode="L")  # as torchvision's MNIST does
        # ToTensor: PIL -> (C, H, W) float in [0, 1]
        arr = np.array(pil, dtype=np.uint8, copy=True)
        x = torch.from_numpy(arr).view(pil.size[1], pil.size[0], 1).permute(2, 0, 1).contiguous()
        x = x.to(torch.get_default_dtype()).div(255)
        # Normalize
        x = (x - 0.1307) / 0.3081
        return x, target


def baseline(batches: int) -> float:
    """Samples/s of (a) over `batches` batches of 64 (after a short warm-up)."""
    data = load_dataset()
    cfg = load_profile(default_profile()).run.merged(RunSettings(batch_size=64)).resolve()  # type: ignore[arg-type]
    torch.manual_seed(0)
    model = nets.build("seed", (28, 28), 10)
    opt = make_optimizer(cfg, model.parameters())
    loader = DataLoader(TorchvisionStyleMNIST(data.train_images, data.train_labels), batch_size=64, shuffle=True)
    seen, t0 = 0, 0.0
    for i, (x, y) in enumerate(loader):
        if i == 20:
            seen, t0 = 0, time.perf_counter()
        loss = F.cross_entropy(model(x), y) + cfg.l1 * nets.l1_penalty(model)
        opt.zero_grad()
        loss.backward()
        opt.step()
        seen += len(x)
        if i == 20 + batches:
            break
    return seen / (time.perf_counter() - t0)


def gputui_trainer() -> float:
    """Samples/s of (b): the second of two epochs with the default profile, timed by the trainer."""
    with tempfile.TemporaryDirectory() as tmp:
        req = RunRequest(profile=None, overrides=RunSettings(epochs=2), run_dir=Path(tmp) / "run")
        run, cfg, resume = prepare(req)
        view = CollectView()
        execute(run, cfg, resume, view)  # type: ignore[arg-type]
    start = view.events[0]
    first, second = [e for e in view.events if e["event"] == "epoch"]
    samples = int(start["steps_per_epoch"]) * int(start["batch_size"])  # type: ignore[call-overload]
    return samples / (float(second["elapsed_s"]) - float(first["elapsed_s"]))  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of (a) and (b)")
    parser.add_argument("--batches", type=int, default=400, help="batches of 64 to time for the baseline")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = []
    for i in range(args.rounds):
        a, b = baseline(args.batches), gputui_trainer()
        rounds.append((a, b))
        print(f"round {i + 1}: (a) {a:9,.0f} samples/s   (b) {b:9,.0f} samples/s   b/a {b / a:.2f}x")
    a = statistics.median(r[0] for r in rounds)
    b = statistics.median(r[1] for r in rounds)
    print(f"(a) per-sample Dataset + DataLoader, batch 64: {a:10,.0f} samples/s (median)")
    print(f"(b) gputui trainer, default profile:           {b:10,.0f} samples/s (median)")
    print(f"ratio b/a: {b / a:.2f}x")
    print(json.dumps({
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "rounds": [{"a": round(x, 1), "b": round(y, 1)} for x, y in rounds],
        "baseline_dataloader_samples_per_s": round(a, 1),
        "gputui_trainer_samples_per_s": round(b, 1),
        "ratio": round(b / a, 2),
    }))


if __name__ == "__main__":
    main()
