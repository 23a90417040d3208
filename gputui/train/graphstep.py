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

Capture and replay run under `torch.cuda.device(x.device)`: without it a run on `cuda:N`
(N > 0) captures on device 0's stream while its kernels go to device N, an empty graph. The
first replay is checked once (some weight must move): a replay that moves nothing falls
back. A capture that fails part-way (`torch.cuda.graph.__exit__` raises in `capture_end()`
before it restores the stream) has its stream put back here, and the device's random generator
taken out of capture mode (`_rng_spare`). A fault inside a replay surfaces
at the next sync: `take()` syncs in a `try` and turns it into the same fallback, raising
`GraphFault` so the caller goes back to its last good state (the weights after a faulted
replay are not to be trusted).
"""

from __future__ import annotations

from typing import Any, Callable

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from gputui.train import nets, optim

WARMUP_STEPS = 3  # eager steps on a side stream before capture (the allocator and cuDNN settle)


def graph_optimizer(name: str, params: Any, lr: float, device: torch.device, betas: tuple[float, float] = (0.9, 0.999),
                    momentum: float = 0.0, weight_decay: float = 0.0) -> torch.optim.Optimizer:
    """The optimizer a graph can replay: fused, with the learning rate as a tensor on `device`."""
    rate = torch.tensor(float(lr), dtype=torch.float32, device=device)
    impl = {"capturable": device.type == "cuda"} if name == "adam" else {}
    return optim.build(name, params, rate, betas, momentum, weight_decay, fused=True, **impl)


class GraphFault(RuntimeError):
    """A replay's fault seen at the sync after it: the step has fallen back to eager; the caller
    puts its last good state back (`reason` as the fallback reported it, `steps` the rows lost)."""

    def __init__(self, reason: str, steps: int) -> None:
        super().__init__(reason)
        self.reason, self.steps = reason, steps


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
        self.failed_at: int | None = None  # the 0-based step whose capture or replay failed

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
                with self._on_device():
                    self.graph.replay()
                return
            except RuntimeError as exc:  # a launch error raises before the kernels run
                self._fall_back(f"replay failed: {_line(exc)}", step)
        elif self.capture and self.eager_steps >= WARMUP_STEPS:
            if self._capture(step):
                return
        self._eager()

    def take(self) -> torch.Tensor:
        n = self.pending
        if self.graph is not None:  # a replay's fault surfaces at the sync: here, inside the try
            try:
                with self._on_device():
                    torch.cuda.current_stream(self.x.device).synchronize()
            except RuntimeError as exc:
                reason = f"replay failed at sync: {_line(exc)}"
                self.pos.zero_()
                self.pending = 0
                self._fall_back(reason, None)
                raise GraphFault(reason, n) from exc
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

    def _on_device(self) -> contextlib.AbstractContextManager[Any]:
        """The graph's device made current (capture and replay): see the module's docstring."""
        return torch.cuda.device(self.x.device)

    def _capture(self, step: int) -> bool:
        """Capture, then replay once (this step) and check that it moved the weights. False after
        falling back to eager steps (the step is then still to run)."""
        graph: Any = None
        rng_back = _rng_spare(self.x.device)
        try:
            graph = torch.cuda.CUDAGraph()
            with self._on_device():
                stream = torch.cuda.current_stream(self.x.device)
                try:
                    self.optimizer.zero_grad(set_to_none=True)
                    with torch.cuda.graph(graph):
                        self.body()
                finally:  # a capture_end() that raises leaves the capture stream current
                    if torch.cuda.current_stream(self.x.device) != stream:
                        torch.cuda.set_stream(stream)
                params = [p for p in self.model.parameters() if p.requires_grad]
                before = [p.detach().clone() for p in params]
                graph.replay()
                moved = any(not torch.equal(a, p) for a, p in zip(before, params))  # once per run
        except Exception as exc:  # noqa: BLE001 - any capture failure means: go on eagerly
            _release(graph)
            rng_back()
            self._fall_back(f"capture failed: {_line(exc)}", step)
            return False
        if not moved and float(self.lr) != 0.0:
            _release(graph)
            self.pos.fill_(self.pending - 1)  # the eager step writes this step's row, once
            self._fall_back("capture failed: the first replay did not change the weights (an empty graph)", step)
            return False
        self.graph = graph
        return True

    def _fall_back(self, reason: str, step: int | None) -> None:
        self.graph = None
        self.failed = reason
        self.failed_at = step
        self.capture = False
        self.impl = "eager"
        self.on_fallback(reason)


def _rng_spare(device: torch.device) -> Callable[[], None]:
    """A copy of `device`'s default random generator taken before a capture, and how to put it
    back. A capture registers that generator (its `capture_prologue`) and only a `capture_end()`
    that succeeds takes it out of capture mode: after one that fails, every later random draw
    on the device raises "Offset increment outside graph capture encountered unexpectedly", and
    an eager fallback would crash at its first one (seen on an H100 with torch 2.11). The copy
    is not in capture mode and holds the seed and offset of before the capture (a capture's
    draws only count inside the graph), so putting it back is exact. Best effort: a torch
    without graph-safe generator states keeps what it has."""
    try:
        gen = torch.cuda.default_generators[device.index or 0]
        spare = gen.clone_state()
    except Exception:  # noqa: BLE001 - no such API or generator: nothing to put back
        return lambda: None

    def back() -> None:
        with contextlib.suppress(Exception):
            gen.graphsafe_set_state(spare)

    return back


def _release(graph: Any) -> None:
    """Give a failed graph's memory pool back (best effort: the failure may have left it unusable)."""
    reset = getattr(graph, "reset", None)
    if reset is not None:
        with contextlib.suppress(Exception):
            reset()


def _line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:200] if text else ''}"
