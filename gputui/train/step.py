"""One training step behind a small seam, and the learning-rate schedule it follows.

The loop hands a `Step` the rows of one batch and the learning rate; the step queues the
forward pass, the loss, the backward pass and the optimizer update, and keeps that step's
loss on the device. Nothing in it reads a value back to the host: the loop collects the
losses with `take` only when it reports them (a step event, an evaluation, an epoch's end).

`EagerStep` is plain PyTorch, on every device. A graph-captured step (CUDA graphs, issue 11)
fits the same seam: it copies `idx` into a static index buffer and `lr` into a device tensor
before each replay, writes each step's losses into a device buffer at a device counter, and
`take` hands back that buffer's filled rows and resets the counter.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass, replace
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from gputui.config.run import RunConfig
from gputui.train import nets, optim

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


class Step(Protocol):
    """One optimizer step on one batch; queues device work and never waits for it."""

    impl: str  # what the `start` event names: "eager" (or "graph")

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        """Train global step `step` (0-based) on the training rows `idx` at learning rate `lr`."""
        ...

    def take(self) -> torch.Tensor:
        """The losses of the steps since the last take, oldest first, still on the device:
        float32 of shape (steps, 2), columns (cross-entropy, L1 term). Forgets them. The loop
        takes at least every max(1, steps_per_epoch // 8) steps (meter.Pace), and at every
        evaluation, epoch end and stop: a fixed-size device buffer of that many rows is enough."""
        ...


def nan_test_step() -> int | None:
    """GPUTUI_TEST_NAN_AT_STEP=N (a test hook): the loss of step N (1-based, as in the step
    events) is NaN, as a diverging run's would be; unset, None."""
    text = os.environ.get("GPUTUI_TEST_NAN_AT_STEP", "").strip()
    return int(text) if text.isdigit() else None


class EagerStep:
    """Today's step in plain PyTorch: `net` (the model, or its DDP/DataParallel wrapper)
    on rows of the device-resident `x`, `y`; cross-entropy plus `l1` times the L1 penalty."""

    impl = "eager"

    def __init__(self, model: nn.Module, net: nn.Module, optimizer: torch.optim.Optimizer,
                 x: torch.Tensor, y: torch.Tensor, l1: float) -> None:
        self.model, self.net, self.optimizer, self.x, self.y, self.l1 = model, net, optimizer, x, y, l1
        self.nan_at = nan_test_step()
        self._ce: list[torch.Tensor] = []  # one 0-d tensor a step: appending costs no device work
        self._l1: list[torch.Tensor] = []

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        out = self.net(self.x[idx])
        ce = F.cross_entropy(out, self.y[idx])
        if self.nan_at == step + 1:
            ce = ce * float("nan")
        loss = ce
        if self.l1:
            reg = self.l1 * nets.l1_penalty(self.model)
            loss = loss + reg
            self._l1.append(reg.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self._ce.append(ce.detach())

    def take(self) -> torch.Tensor:
        if not self._ce:
            return torch.zeros((0, 2), device=self.x.device)
        ce = torch.stack(self._ce)
        reg = torch.stack(self._l1) if self._l1 else torch.zeros_like(ce)
        self._ce, self._l1 = [], []
        return torch.stack((ce, reg), dim=1).float()


def keep_freed_memory() -> None:
    """Ask glibc to keep freed blocks instead of unmapping them after every step.

    The batch tensors here are a few MB each: above glibc's mmap threshold, so every
    step would map fresh pages and fault them in (kernel time, worse in a VM). Keeping
    them in the heap makes steps ~30% faster on a 2-core VM. A no-op off glibc.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 1 << 28)  # M_MMAP_THRESHOLD: 256 MiB
        libc.mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: 1 GiB
    except (OSError, AttributeError):
        pass


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The shuffle of epoch `epoch`: a function of (seed, epoch) only, the same on every rank.
    (The schema bounds seeds to 32 bits; the modulo keeps any integer a valid generator seed.)"""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + epoch) % (1 << 63))
    return torch.randperm(n, generator=gen)


def to_device(images: Any, labels: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, H, W) -> normalised float32 (N, 1, H, W) on `device`; labels -> int64."""
    x = torch.from_numpy(images).to(device).unsqueeze(1).float()
    x.div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)
    # channels_last: oneDNN's convolution and pooling run 2-3x faster on it for 1-channel input.
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(labels).to(device)
    return x, y


IMPL_FLAGS = ("fused", "capturable", "foreach", "differentiable")  # how an optimizer runs, not what it learnt


def make_step(cfg: RunConfig, model: nn.Module, net: nn.Module, x: torch.Tensor, y: torch.Tensor, graph: bool,
              steps_per_epoch: int, on_fallback: Any) -> tuple[torch.optim.Optimizer, "Step"]:
    """The optimizer and the step: one CUDA graph per step where `graph` allows it (one process)
    on CUDA and cfg.cuda_graph is on; the eager step everywhere else."""
    # GPUTUI_TEST_GRAPH_ANYWHERE=1 (a test hook): the graph step on any device; off CUDA its capture
    # fails, which is how the CPU tests reach the fallback.
    anywhere = os.environ.get("GPUTUI_TEST_GRAPH_ANYWHERE") == "1"
    if graph and cfg.cuda_graph and (x.device.type == "cuda" or anywhere):
        from gputui.train.graphstep import GraphStep, graph_optimizer

        optimizer = graph_optimizer(cfg.optimizer, model.parameters(), cfg.lr, x.device, cfg.betas, cfg.momentum,
                                    cfg.weight_decay)
        return optimizer, GraphStep(model, optimizer, x, y, cfg.batch_size, cfg.l1, capacity=steps_per_epoch + 1,
                                    on_fallback=on_fallback, capture=True, nan_at=nan_test_step())
    optimizer = make_optimizer(cfg, model.parameters())
    return optimizer, EagerStep(model, net, optimizer, x, y, cfg.l1)


def portable_state(optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's state with a plain learning rate (the graph step's is a device tensor), so a
    checkpoint resumes on either step."""
    state = optimizer.state_dict()
    for group in state["param_groups"]:
        if isinstance(group.get("lr"), torch.Tensor):
            group["lr"] = float(group["lr"])
    return state


def load_optimizer_state(optimizer: torch.optim.Optimizer, saved: dict[str, Any], step: Any) -> None:
    """Load a checkpoint's optimizer state; how the optimizer runs (fused, capturable, foreach)
    stays this process's choice, and a graph step gets its tensor learning rate back."""
    own = {k: v for k, v in optimizer.param_groups[0].items() if k in IMPL_FLAGS}
    optimizer.load_state_dict({**saved, "param_groups": [{**g, **own} for g in saved["param_groups"]]})
    adopt = getattr(step, "adopt_optimizer_state", None)
    if adopt is not None:
        adopt()


def make_optimizer(cfg: RunConfig, params: Any) -> torch.optim.Optimizer:
    return optim.build(cfg.optimizer, params, cfg.lr, cfg.betas, cfg.momentum, cfg.weight_decay)


def lr_at(cfg: RunConfig, step: int, total: int) -> float:
    """The learning rate for `step` (0-based) of `total`: a pure function, so resume is exact.
    Past the last step it stays at the schedule's final value."""
    if cfg.schedule == "constant" or total <= 1:
        return cfg.lr
    frac = min(step / (total - 1), 1.0)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))
    # onecycle: linear rise from lr/25 to lr, then cosine down to lr/1e4 (as torch's OneCycleLR)
    start, end = cfg.lr / 25, cfg.lr / 25 / 1e4
    if cfg.warmup > 0 and frac < cfg.warmup:
        return start + (cfg.lr - start) * frac / cfg.warmup
    down = (frac - cfg.warmup) / (1 - cfg.warmup)
    return end + (cfg.lr - end) * 0.5 * (1 + math.cos(math.pi * down))


def final_lr(cfg: RunConfig) -> float:
    """Where the schedule ends: lr/25/1e4 for onecycle, 0 for cosine, lr when constant."""
    return {"onecycle": cfg.lr / 25 / 1e4, "cosine": 0.0}.get(cfg.schedule, cfg.lr)


@dataclass(frozen=True)
class Schedule:
    """The run's learning rate at every step: `lr_at` over `total` steps, and, once a resume
    changed the number of epochs, from `from_step` on a cosine from `from_lr` down to the
    schedule's final value at step `last` (so the rate never jumps)."""

    cfg: RunConfig
    total: int  # the steps the base curve spans (the run's length before any change of epochs)
    last: int  # the run's last step, 0-based
    from_step: int | None = None
    from_lr: float = 0.0

    def at(self, step: int) -> float:
        if self.from_step is None or step < self.from_step:
            return lr_at(self.cfg, step, self.total)
        frac = min(1.0, (step - self.from_step) / max(1, self.last - self.from_step))
        end = final_lr(self.cfg)
        return end + (self.from_lr - end) * 0.5 * (1 + math.cos(math.pi * frac))

    def extended(self, step: int, last: int) -> "Schedule":
        """This schedule for a run resumed at `step` that now ends at `last`: unchanged when the
        length is; otherwise the steps from `step` (or, still warming up, from the end of the
        warm-up) follow a new cosine from the rate of the step before down to the final rate
        at `last`, so the rate never jumps."""
        if last == self.last or self.cfg.schedule == "constant":
            return replace(self, last=last)
        peak = math.ceil(self.cfg.warmup * (self.total - 1)) if self.cfg.schedule == "onecycle" else 0
        start = max(step, peak) if max(step, peak) < last else step
        return replace(self, last=last, from_step=start, from_lr=self.at(max(start - 1, 0)))
