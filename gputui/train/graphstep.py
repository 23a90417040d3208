"""A training step that one CUDA graph captures and replays (the `Step` seam of gputui.train.step).

The eager step costs, per step, about 2 ms of Python and kernel launches on a fast GPU for
about 0.2 ms of GPU work. `GraphStep.body()` does the same arithmetic with every value that
changes from step to step in a static device buffer:
- the batch's rows: `idx` is copied into a static index buffer and the rows are gathered
  from the device-resident dataset inside the step (`index_select`);
- the learning rate: a device tensor, the optimizer's own (fused Adam or SGD, capturable
  on CUDA), filled before the step;
- the losses: the step's cross-entropy and L1 term are written into a device buffer at a
  device counter; `take` hands back the filled rows (read only when an event is due).
On CUDA, `body()` runs eagerly for a few warm-up steps on a side stream (real steps), is then
captured once, and every later step is two small copies and one replay. Elsewhere, and after
a capture or replay that fails, `body()` runs eagerly: the same arithmetic, so the CPU tests
check the buffer logic the graph replays, and a failure costs speed, never the run. The
failure is reported once through `on_fallback` (the trainer emits a `fallback` event).
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gputui.train import nets

WARMUP_STEPS = 3  # eager steps on a side stream before capture (the allocator and cuDNN settle)


def graph_optimizer(name: str, params: Any, lr: float, device: torch.device, betas: tuple[float, float] = (0.9, 0.999),
                    momentum: float = 0.0, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer a graph can replay: fused, with the learning rate as a tensor on `device`."""
    rate = torch.tensor(float(lr), dtype=torch.float32, device=device)
    if name == "adam":
        return torch.optim.Adam(params, lr=rate, betas=betas, weight_decay=weight_decay, fused=True,
                                capturable=device.type == "cuda")
    return torch.optim.SGD(params, lr=rate, momentum=momentum, weight_decay=weight_decay, fused=True)


class GraphStep:
    """Steps of `model` on rows of the device-resident (x, y); up to `capacity` steps between takes."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor,
                 share: int, l1: float, capacity: int, on_fallback: Callable[[str], None] = lambda reason: None,
                 capture: bool | None = None, nan_at: int | None = None) -> None:
        device = x.device
        self.model, self.optimizer, self.x, self.y, self.l1 = model, optimizer, x, y, l1
        self.on_fallback = on_fallback
        self.nan_at = nan_at  # a test hook: the 1-based step whose loss is NaN
        self.idx = torch.zeros(share, dtype=torch.int64, device=device)
        self.losses = torch.zeros(capacity, 2, dtype=torch.float32, device=device)
        self.pos = torch.zeros(1, dtype=torch.int64, device=device)  # the next row of `losses`
        self.scale = torch.ones((), dtype=torch.float32, device=device)  # NaN at the hook's step
        self.pending = 0  # rows written since the last take (the host counts them)
        self.lr = self._tensor_lr()
        self.capture = (device.type == "cuda") if capture is None else capture
        self.impl = "graph" if self.capture else "eager"
        self.graph: torch.cuda.CUDAGraph | None = None
        self.eager_steps = 0
        self.failed: str | None = None

    def _tensor_lr(self) -> torch.Tensor:
        lr = self.optimizer.param_groups[0]["lr"]
        if not isinstance(lr, torch.Tensor):
            raise TypeError("GraphStep needs an optimizer whose lr is a tensor (see graph_optimizer)")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def adopt_optimizer_state(self) -> None:
        """After `optimizer.load_state_dict` (a resume): the learning rate is this step's tensor again."""
        for group in self.optimizer.param_groups:
            if group["lr"] is not self.lr:
                self.lr.fill_(float(group["lr"]))
                group["lr"] = self.lr

    # -- the Step seam -----------------------------------------------------------------------
    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        if self.pending >= len(self.losses):
            raise RuntimeError(f"GraphStep: {self.pending} steps without a take (capacity {len(self.losses)})")
        self.idx.copy_(idx, non_blocking=True)
        self.lr.fill_(lr)
        if self.nan_at is not None:
            self.scale.fill_(float("nan") if step + 1 == self.nan_at else 1.0)
        self.pending += 1
        if self.graph is not None:
            try:
                self.graph.replay()
                return
            except RuntimeError as exc:  # a launch error raises before the kernels run
                self._fall_back(f"replay failed: {_line(exc)}")
        elif self.capture and self.eager_steps >= WARMUP_STEPS:
            graph = self._capture()
            if graph is not None:
                graph.replay()
                return
        self._eager()

    def take(self) -> torch.Tensor:
        n = self.pending
        rows = self.losses[:n].clone()
        self.pos.zero_()
        self.pending = 0
        return rows

    # -- the device's side -------------------------------------------------------------------
    def body(self) -> None:
        """Forward, loss, backward and optimizer for the rows in the index buffer."""
        out = self.model(self.x.index_select(0, self.idx))
        ce = F.cross_entropy(out, self.y.index_select(0, self.idx))
        if self.nan_at is not None:
            ce = ce * self.scale
        loss = ce
        reg = torch.zeros((), dtype=torch.float32, device=ce.device)
        if self.l1:
            reg = self.l1 * nets.l1_penalty(self.model)
            loss = loss + reg
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        row = torch.stack((ce.detach(), reg.detach())).float().unsqueeze(0)
        self.losses.index_copy_(0, self.pos, row)
        self.pos.add_(1)

    def _eager(self) -> None:
        if self.capture and self.x.device.type == "cuda":  # warm-up before capture: on a side stream
            side = torch.cuda.Stream(self.x.device)
            side.wait_stream(torch.cuda.current_stream(self.x.device))
            with torch.cuda.stream(side):
                self.body()
            torch.cuda.current_stream(self.x.device).wait_stream(side)
        else:
            self.body()
        self.eager_steps += 1

    def _capture(self) -> torch.cuda.CUDAGraph | None:
        """The captured graph (kept in self.graph), or None after falling back to eager steps."""
        try:
            graph = torch.cuda.CUDAGraph()
            self.optimizer.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):
                self.body()
        except Exception as exc:  # noqa: BLE001 - any capture failure means: go on eagerly
            self._fall_back(f"capture failed: {_line(exc)}")
            return None
        self.graph = graph
        return graph

    def _fall_back(self, reason: str) -> None:
        self.graph = None
        self.failed = reason
        self.capture = False
        self.impl = "eager"
        self.on_fallback(reason)


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"
