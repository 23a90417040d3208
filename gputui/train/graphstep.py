"""A training step that a CUDA graph can capture: everything that changes per step lives on the device.

The eager step does, per step, Python indexing of the batch, a float learning rate written
into the optimizer, forward, loss, backward and the optimizer: on a fast GPU about 2 ms of
Python and kernel launches for about 0.2 ms of GPU work. `GraphStep.body()` does the same
arithmetic with no host value in it:
- the epoch's permutation sits in a static buffer, and a device counter picks the batch
  (`index_select` of the dataset resident on the device, so nothing is copied in);
- the schedule is a device tensor of every step's learning rate, indexed by a device step
  counter and copied into the optimizer's tensor learning rate (Adam or SGD, fused and,
  on CUDA, capturable);
- the cross-entropy and the L1 term are summed into device accumulators, read only when
  an event is due.
On CUDA `body()` runs eagerly for a few warm-up steps on a side stream (real steps), is then
captured once and replayed for every later step. Elsewhere, and after any failure to
capture or replay, `body()` simply runs eagerly: the same arithmetic, so the CPU tests check
the buffer and schedule logic that the graph replays, and a failure costs speed, never the
run. The failure is reported once through `on_fallback`.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gputui.train import nets

WARMUP_STEPS = 3  # eager steps on a side stream before capture (allocator and cuDNN settle)


def graph_optimizer(name: str, params: Any, lr: torch.Tensor, betas: tuple[float, float], momentum: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """The optimizer a graph can replay: fused, with the learning rate as a device tensor."""
    capturable = lr.device.type == "cuda"
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=True,
                                capturable=capturable)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=True)


class GraphStep:
    """One training step of `model` on the device-resident (x, y), driven by device counters.

    `share` samples per step start at `rank * share` within each global batch of `batch`
    (the same split as the eager loop). `lrs` holds the learning rate of every global step.
    """

    name = "graph"

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 lrs: Sequence[float], batch: int, share: int, rank: int, l1: float,
                 on_fallback: Callable[[str], None] = lambda reason: None, capture: bool | None = None) -> None:
        device = x.device
        self.model, self.optimizer, self.x, self.y = model, optimizer, x, y
        self.batch, self.share, self.l1 = batch, share, l1
        self.on_fallback = on_fallback
        self.lrs = torch.tensor(list(lrs), dtype=torch.float32, device=device)
        self.perm = torch.zeros(len(x), dtype=torch.int64, device=device)
        self.offsets = torch.arange(share, dtype=torch.int64, device=device) + rank * share
        self.k = torch.zeros((), dtype=torch.int64, device=device)  # batch within the epoch
        self.gstep = torch.zeros((), dtype=torch.int64, device=device)  # global step
        self.ce_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.l1_sum = torch.zeros((), dtype=torch.float32, device=device)
        self.pending = 0  # steps summed into the accumulators, not read yet
        self.lr = self._tensor_lr()
        self.capture = (device.type == "cuda") if capture is None else capture
        self.graph: Any = None
        self.eager_steps = 0  # steps run eagerly so far (warm-up, or all of them)
        self.failed: str | None = None

    def _tensor_lr(self) -> torch.Tensor:
        lr = self.optimizer.param_groups[0]["lr"]
        if not isinstance(lr, torch.Tensor):
            raise TypeError("GraphStep needs an optimizer whose lr is a tensor (graph_optimizer)")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    # -- the host's side ---------------------------------------------------------------------
    def begin_epoch(self, perm: torch.Tensor, batch: int, step: int) -> None:
        """Load an epoch's permutation and position (also after a resume) before its first step."""
        self.perm.copy_(perm.to(self.perm.device, non_blocking=True))
        self.k.fill_(batch)
        self.gstep.fill_(step)

    def adopt_optimizer_state(self) -> None:
        """After `optimizer.load_state_dict` (a resume): the learning rate is this step's tensor again."""
        for group in self.optimizer.param_groups:
            value = group["lr"]
            if value is not self.lr:
                self.lr.fill_(float(value))
                group["lr"] = self.lr

    def __call__(self) -> None:
        """One training step."""
        if self.graph is not None:
            try:
                self.graph.replay()
            except RuntimeError as exc:
                self._fall_back(f"replay failed: {_line(exc)}")
                self.body()  # the replay did not run (a launch error raises before the kernels)
            self.pending += 1
            return
        if self.capture and self.failed is None and self.eager_steps >= WARMUP_STEPS:
            if self._capture():
                self.graph.replay()
                self.pending += 1
                return
        self._eager()
        self.pending += 1

    def take(self) -> tuple[float, float, int]:
        """(mean cross-entropy, mean L1 term, steps) since the last take: the one host sync."""
        n = self.pending
        if n == 0:
            return 0.0, 0.0, 0
        ce, l1 = (float(v) for v in torch.stack([self.ce_sum, self.l1_sum]).tolist())
        self.ce_sum.zero_()
        self.l1_sum.zero_()
        self.pending = 0
        return ce / n, l1 / n, n

    # -- the device's side -------------------------------------------------------------------
    def body(self) -> None:
        """Forward, loss, backward and optimizer for the batch the counters point at."""
        idx = self.perm.index_select(0, self.k * self.batch + self.offsets)
        self.lr.copy_(self.lrs.index_select(0, self.gstep).squeeze(0))
        out = self.model(self.x.index_select(0, idx))
        ce = F.cross_entropy(out, self.y.index_select(0, idx))
        loss = ce
        if self.l1:
            penalty = self.l1 * nets.l1_penalty(self.model)
            loss = loss + penalty
            self.l1_sum.add_(penalty.detach())
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.ce_sum.add_(ce.detach())
        self.k.add_(1)
        self.gstep.add_(1)

    def _eager(self) -> None:
        if self.capture and self.x.device.type == "cuda" and self.eager_steps < WARMUP_STEPS:
            side = torch.cuda.Stream(self.x.device)
            side.wait_stream(torch.cuda.current_stream(self.x.device))
            with torch.cuda.stream(side):
                self.body()
            torch.cuda.current_stream(self.x.device).wait_stream(side)
        else:
            self.body()
        self.eager_steps += 1

    def _capture(self) -> bool:
        try:
            graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                self.body()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
            self._fall_back(f"capture failed: {_line(exc)}")
            return False
        self.graph = graph
        return True

    def _fall_back(self, reason: str) -> None:
        self.graph = None
        self.failed = reason
        self.capture = False
        self.on_fallback(reason)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"
