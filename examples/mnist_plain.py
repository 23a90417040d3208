"""A small conv net on MNIST in plain PyTorch, reporting to gputui.

    python examples/mnist_plain.py                         # on its own
    gputui run -- python examples/mnist_plain.py           # under gputui: curves, GPUs, Ctrl-C and --resume
    gputui run --profile profiles/program.toml             # the same from a profile

It reads the bundled MNIST (assets/mnist, the four IDX files, gzipped or not) with numpy, so it
needs torch and numpy only. What gputui adds is five calls of `gputui.report`, all harmless when
gputui is not running it:
- `report.log(...)`: the numbers for the curves (training loss every --log-every steps,
  validation loss and accuracy at each epoch's end);
- `report.checkpoint_dir()`: where the checkpoint goes (it survives `gputui run --resume`);
- `report.resuming()`: load that checkpoint and go on from its epoch and step;
- `report.should_stop()`: gputui asked the run to stop (Ctrl-C, `s` in the dashboard, a sweep's
  pruner): save and exit 0;
- `report.trial()`: a sweep's parameters (here `lr`).
About a minute on two CPU cores with the defaults.
"""

from __future__ import annotations

import argparse
import gzip
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from gputui import report

DATA = Path(__file__).resolve().parent.parent / "assets" / "mnist"
FILES = {"train_x": "train-images-idx3-ubyte", "train_y": "train-labels-idx1-ubyte",
         "test_x": "t10k-images-idx3-ubyte", "test_y": "t10k-labels-idx1-ubyte"}
MEAN, STD = 0.1307, 0.3081


def read_idx(directory: Path, stem: str) -> np.ndarray:
    """One IDX file (gzipped or not): zero, zero, type 0x08, ndim, one big-endian size per dim, data."""
    for name in (stem + ".gz", stem):
        path = directory / name
        if path.is_file():
            raw = path.read_bytes()
            if raw[:2] == b"\x1f\x8b":
                raw = gzip.decompress(raw)
            ndim = raw[3]
            dims = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(ndim)]
            return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)
    raise SystemExit(f"{directory}: no {stem}[.gz] (give --data, a directory with the four MNIST IDX files)")


def load(directory: Path, limit: int | None, test_limit: int | None) -> tuple[torch.Tensor, ...]:
    """Train and test images (N, 1, 28, 28) as normalised floats, labels as int64."""
    arrays = {key: read_idx(directory, stem) for key, stem in FILES.items()}
    out = []
    for x, y, n in ((arrays["train_x"], arrays["train_y"], limit), (arrays["test_x"], arrays["test_y"], test_limit)):
        x, y = x[:n], y[:n]
        out.append((torch.from_numpy(x.astype(np.float32)).unsqueeze(1) / 255.0 - MEAN) / STD)
        out.append(torch.from_numpy(y.astype(np.int64)))
    return tuple(out)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        logits: torch.Tensor = self.fc2(F.relu(self.fc1(x.flatten(1))))
        return logits


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> tuple[float, float]:
    model.eval()
    loss, correct = 0.0, 0
    for i in range(0, len(x), 1000):
        out = model(x[i:i + 1000].to(device))
        target = y[i:i + 1000].to(device)
        loss += F.cross_entropy(out, target, reduction="sum").item()
        correct += int((out.argmax(1) == target).sum().item())
    model.train()
    return loss / len(x), correct / len(x)


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epoch: int, batch: int, step: int) -> None:
    """The state to go on from: epoch, the next batch in it, the global step. Written then renamed,
    so a stop in the middle never leaves half a checkpoint."""
    part = path.with_suffix(".part")
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "epoch": epoch, "batch": batch, "step": step}, part)
    os.replace(part, path)


def arguments(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--limit", type=int, default=None, help="train on the first N images only (quick tries, tests)")
    parser.add_argument("--test-limit", type=int, default=None, help="validate on the first N test images only")
    parser.add_argument("--log-every", type=int, default=20, help="report the training loss every N steps")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=DATA, help="a directory with the four MNIST IDX files")
    return parser


def main() -> int:
    args = arguments(__doc__.splitlines()[0]).parse_args()

    lr = float(report.trial().get("lr", args.lr))  # a sweep's value wins over --lr
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # gputui sets CUDA_VISIBLE_DEVICES
    torch.manual_seed(args.seed)
    train_x, train_y, test_x, test_y = load(args.data, args.limit, args.test_limit)
    model = Net().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    steps_per_epoch = math.ceil(len(train_x) / args.batch_size)

    checkpoint = report.checkpoint_dir() / "last.pt"
    epoch, batch, step = 0, 0, 0
    if report.resuming() and checkpoint.is_file():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, batch, step = state["epoch"], state["batch"], state["step"]
        print(f"resumed from {checkpoint}: epoch {epoch}, step {step}")

    while epoch < args.epochs:
        # The same order on a resume (seeded by epoch), so the batches already trained are skipped.
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        while batch < steps_per_epoch:
            index = order[batch * args.batch_size:(batch + 1) * args.batch_size]
            x, y = train_x[index].to(device), train_y[index].to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            batch += 1
            step += 1
            if step % args.log_every == 0:
                report.log(step=step, epoch=epoch, loss=loss.item(), lr=lr)
            if report.should_stop():
                save(checkpoint, model, optimizer, epoch, batch, step)
                print(f"stopped at epoch {epoch}, step {step}: checkpoint in {checkpoint}")
                return 0
        val_loss, val_acc = evaluate(model, test_x, test_y, device)
        report.log(step=step, epoch=epoch, val_loss=val_loss, val_acc=val_acc)
        print(f"epoch {epoch}: step {step}, val_loss {val_loss:.4f}, val_acc {val_acc:.4f}")
        epoch, batch = epoch + 1, 0
        save(checkpoint, model, optimizer, epoch, batch, step)
        if report.should_stop():  # asked during the evaluation: the epoch's checkpoint is the one
            print(f"stopped at epoch {epoch}, step {step}: checkpoint in {checkpoint}")
            return 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
