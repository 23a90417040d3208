"""A program that knows nothing of gputui: it only prints, in pytorch/examples' MNIST format.

    python examples/print_only.py
    gputui run --profile profiles/print_only.toml       # [run] metrics_regex turns its lines into metrics

It stands for any program you cannot or will not change (a Lua, C++ or Julia trainer, someone
else's script). It does not train anything: its numbers are made up (a loss that falls, an
accuracy that rises), printed as pytorch/examples/mnist/main.py prints them:

    Train Epoch: 1 [640/60000 (1%)]	Loss: 0.812345
    Test set: Average loss: 0.0500, Accuracy: 9850/10000 (98%)

and profiles/print_only.toml has the `metrics_regex` that reads them.
"""

from __future__ import annotations

import argparse
import math
import random
import time

TRAIN, TEST = 60000, 10000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--log-interval", type=int, default=10, help="print a training line every N batches")
    parser.add_argument("--delay", type=float, default=0.02, help="seconds between lines, as if it trained")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    batches = math.ceil(TRAIN / args.batch_size)
    done = 0
    for epoch in range(1, args.epochs + 1):
        for batch_idx in range(0, batches, args.log_interval):
            done += args.log_interval
            loss = 2.3 * math.exp(-done / 150) + 0.03 + 0.02 * rng.random()
            seen = batch_idx * args.batch_size
            print(f"Train Epoch: {epoch} [{seen}/{TRAIN} ({100.0 * batch_idx / batches:.0f}%)]\tLoss: {loss:.6f}",
                  flush=True)
            time.sleep(args.delay)
        correct = int(TEST * (min(0.99, 0.955 + 0.01 * epoch) - 0.005 * rng.random()))
        test_loss = 0.12 / epoch + 0.01 * rng.random()
        print(f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{TEST} "
              f"({100.0 * correct / TEST:.0f}%)\n", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
