"""examples/mnist_plain.py with DistributedDataParallel: one process per GPU (or CPU worker).

    torchrun --nproc-per-node 2 examples/mnist_ddp.py                     # with torchrun alone
    gputui run --strategy ddp --nproc 2 -- python examples/mnist_ddp.py   # under gputui
    python examples/mnist_ddp.py                                          # one process, no group

torchrun (or gputui, which starts torchrun) gives each process RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT; the group is "nccl" on CUDA, "gloo" on the CPU. Each rank trains
its own shard of every epoch's shuffled order (what DistributedSampler does, by hand) and DDP
averages the gradients. What changes for gputui against the plain example:
- every rank calls `report.log` (gputui keeps rank 0's lines; `all_ranks=True` keeps them all);
- rank 0 alone writes the checkpoint; every rank reads it on a resume;
- `report.should_stop()` may turn True on one rank a step before another, so the ranks agree
  (an all_reduce of the flag each step) and all stop at the same step: none is left waiting in
  a collective that the others never join;
- a rank that was in a group ends with os._exit once everything is written (see the end of main).
"""

from __future__ import annotations

import math
import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from gputui import report
from mnist_plain import Net, arguments, load, save  # the same data, net and checkpoint as the plain example


def agree_to_stop(asked: bool, device: torch.device) -> bool:
    """True on every rank when gputui asked any rank to stop."""
    if not dist.is_initialized():
        return asked
    flag = torch.tensor([1.0 if asked else 0.0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def mean_over_ranks(value: float, device: torch.device) -> float:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return float(t.item()) / dist.get_world_size()


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, rank: int,
             world: int) -> tuple[float, float]:
    """Validation loss and accuracy over the whole test set, each rank taking every world-th image."""
    model.eval()
    sums = torch.zeros(2, dtype=torch.float64, device=device)  # loss, correct
    xs, ys = x[rank::world], y[rank::world]
    for i in range(0, len(xs), 1000):
        out = model(xs[i:i + 1000].to(device))
        target = ys[i:i + 1000].to(device)
        sums[0] += F.cross_entropy(out, target, reduction="sum")
        sums[1] += (out.argmax(1) == target).sum()
    if dist.is_initialized():
        dist.all_reduce(sums)
    model.train()
    return float(sums[0]) / len(x), float(sums[1]) / len(x)


def main() -> int:
    args = arguments(__doc__.splitlines()[0]).parse_args()
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if "RANK" in os.environ:  # started by torchrun: MASTER_ADDR and MASTER_PORT say where the group meets
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")

    lr = float(report.trial().get("lr", args.lr))
    torch.manual_seed(args.seed)  # the same initial weights on every rank (DDP also broadcasts rank 0's)
    train_x, train_y, test_x, test_y = load(args.data, args.limit, args.test_limit)
    net = Net().to(device)
    model: nn.Module = DistributedDataParallel(net, device_ids=[local_rank] if device.type == "cuda" else None) \
        if dist.is_initialized() else net
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    per_rank = math.ceil(len(train_x) / world)
    steps_per_epoch = math.ceil(per_rank / args.batch_size)

    checkpoint = report.checkpoint_dir() / "last.pt"
    epoch, batch, step = 0, 0, 0
    if report.resuming() and checkpoint.is_file():
        state = torch.load(checkpoint, map_location=device, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        epoch, batch, step = state["epoch"], state["batch"], state["step"]
        if rank == 0:
            print(f"resumed from {checkpoint}: epoch {epoch}, step {step}")

    def save_and_wait() -> None:
        if rank == 0:
            save(checkpoint, net, optimizer, epoch, batch, step)
        if dist.is_initialized():
            dist.barrier()  # nobody goes on (or exits) before the checkpoint is whole

    stopped = False
    while epoch < args.epochs and not stopped:
        # Every rank draws the same order; padded to a multiple of the world (as DistributedSampler
        # does), rank r takes every world-th index from r.
        order = torch.randperm(len(train_x), generator=torch.Generator().manual_seed(args.seed * 1000 + epoch))
        order = torch.cat([order, order[:per_rank * world - len(order)]])[rank::world]
        while batch < steps_per_epoch and not stopped:
            index = order[batch * args.batch_size:(batch + 1) * args.batch_size]
            x, y = train_x[index].to(device), train_y[index].to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            batch += 1
            step += 1
            if step % args.log_every == 0:
                report.log(step=step, epoch=epoch, loss=mean_over_ranks(loss.item(), device), lr=lr)
            stopped = agree_to_stop(report.should_stop(), device)
        if stopped:
            save_and_wait()
            if rank == 0:
                print(f"stopped at epoch {epoch}, step {step}: checkpoint in {checkpoint}")
            break
        val_loss, val_acc = evaluate(model, test_x, test_y, device, rank, world)
        report.log(step=step, epoch=epoch, val_loss=val_loss, val_acc=val_acc)
        if rank == 0:
            print(f"epoch {epoch}: step {step}, val_loss {val_loss:.4f}, val_acc {val_acc:.4f}")
        epoch, batch = epoch + 1, 0
        save_and_wait()
        stopped = agree_to_stop(report.should_stop(), device)
        if stopped and rank == 0:  # asked during the evaluation: the epoch's checkpoint is the one
            print(f"stopped at epoch {epoch}, step {step}: checkpoint in {checkpoint}")
    if dist.is_initialized():
        dist.destroy_process_group()
        # torch's gloo threads outlive the group (DDP keeps it), and one may still be releasing the
        # last all_reduce's tensors as Python shuts down: the process then aborts with SIGABRT,
        # "terminate called without an active exception" (pytorch/pytorch#190489). Everything is
        # written by now (the checkpoint behind a barrier): leave without Python's teardown.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
