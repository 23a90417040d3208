"""What a run reports, measured honestly: the training clock, throughput and the loss.

- The clock runs only while the run trains: evaluations, epoch ends and checkpoints stop it.
  Samples are counted per step, so they only accrue while it runs; a step event's
  `samples_per_s` is the samples since the previous step event over the training time since
  then, so the events' rates agree with total samples / `elapsed_s`.
- The loss is each step's cross-entropy (and, apart, its L1 term) averaged over the whole
  world: under DDP the ranks' per-step means are all-reduced, so 1 or N processes report
  the same number for the same weights.
- Losses are read (one host sync) only when they are reported. A read adds each step's value
  in step order to the epoch's sums, which a checkpoint keeps: a run interrupted mid-epoch
  and resumed reports the same `train_loss` as one never interrupted.
- `Pace` says when a step event is due: by a timer of training time that evaluations and
  epochs do not reset, and at least MIN_STEP_EVENTS times an epoch however fast it is;
  `eval_points` when the test split is evaluated (`evaluate`).
- `LastGood` keeps the state a run that diverges goes back to (copies taken at the reads, into
  two preallocated snapshots refreshed with one `torch._foreach_copy_`, no allocation and no sync).
- A step event costs one host sync: the read of the losses (`host_values`), after which the
  clock's lap needs no sync of its own (the work still queued then counts in the next window).
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gputui.train.devices import synchronize

MIN_STEP_EVENTS = 8  # per epoch (points for a curve), however fast the epoch
EVAL_BATCH = 1000


def step_event_interval(default: float = 0.5) -> float:
    """Seconds of training between step events: `default`, or GPUTUI_STEP_EVENT_INTERVAL (a test
    hook standing for a faster or slower machine: the tests must not depend on how many step
    events an epoch gets)."""
    text = os.environ.get("GPUTUI_STEP_EVENT_INTERVAL", "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


def eval_points(steps_per_epoch: int, evals: int) -> list[int]:
    """Batch counts within an epoch after which to evaluate (the last is the epoch's end).

    The evaluations are spread over the second half of the epoch (all of it when there is
    one epoch's worth of evaluations or fewer), where accuracy is worth reading.
    """
    evals = max(1, min(evals, steps_per_epoch))
    if evals == 1:
        return [steps_per_epoch]
    first = steps_per_epoch // 2
    points = {first + round((steps_per_epoch - first) * k / evals) for k in range(1, evals + 1)}
    return sorted(p for p in points if p > 0)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy in percent) over the whole split."""
    model.eval()
    loss = torch.zeros((), device=x.device, dtype=torch.float64)
    correct = torch.zeros((), device=x.device, dtype=torch.int64)
    for i in range(0, len(x), EVAL_BATCH):
        out = model(x[i : i + EVAL_BATCH])
        target = y[i : i + EVAL_BATCH]
        loss += F.cross_entropy(out, target, reduction="sum").double()
        correct += (out.argmax(1) == target).sum()
    model.train()
    return loss.item() / len(x), 100.0 * correct.item() / len(x)


def host_values(values: torch.Tensor) -> list[list[float]]:
    """The per-step loss rows read back to the host: a report's one host sync (tests count calls here)."""
    return values.double().tolist()


class Meter:
    """Training time, throughput and loss of one rank (`world` ranks in all)."""

    def __init__(self, device: torch.device, world: int = 1) -> None:
        self.device, self.world = device, world
        self.elapsed_s = 0.0  # training time, summed across resumes
        self.eval_s = 0.0  # evaluation time, likewise
        self._t0: float | None = None  # when the clock (re)started; None while stopped
        self._window_s = 0.0  # training time since the last step event, up to _t0
        self._window_samples = 0
        self._window = [0.0, 0.0, 0]  # cross-entropy sum, L1 sum, steps since the last step event
        self.epoch = [0.0, 0.0, 0]  # the same since the epoch began (kept in checkpoints)

    # -- the clock ---------------------------------------------------------------------------
    def start(self) -> None:
        synchronize(self.device)
        self._t0 = time.perf_counter()

    def stop(self) -> None:
        """Stop the clock (the queued work counts as training first)."""
        if self._t0 is None:
            return
        synchronize(self.device)
        spent = time.perf_counter() - self._t0
        self.elapsed_s += spent
        self._window_s += spent
        self._t0 = None

    def count(self, samples: int) -> None:
        """One step of `samples` (the global batch) was queued while the clock ran."""
        self._window_samples += samples

    def window_s(self) -> float:
        """Training time since the last step event, as far as the host knows (no sync)."""
        running = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        return self._window_s + running

    def add_eval(self, seconds: float) -> None:
        self.eval_s += seconds

    # -- the loss ----------------------------------------------------------------------------
    def collect(self, values: torch.Tensor) -> tuple[int, int | None]:
        """Fold the per-step (cross-entropy, L1) rows a Step took, averaged over the world.
        Returns (rows, index of the first row that is not finite, or None); nothing of a
        window holding a non-finite row is folded."""
        if self.world > 1 and len(values):  # every rank has the same rows: all or none take part
            import torch.distributed as tdist

            values = values.contiguous()
            tdist.all_reduce(values, op=tdist.ReduceOp.SUM)  # every rank reads at the same steps
            values = values / self.world
        rows = host_values(values)  # the host sync
        for i, (ce, l1) in enumerate(rows):
            if not (math.isfinite(ce) and math.isfinite(l1)):
                return len(rows), i
        for ce, l1 in rows:
            for acc in (self._window, self.epoch):
                acc[0] += ce
                acc[1] += l1
                acc[2] += 1
        return len(rows), None

    def lap(self, synced: bool = False) -> tuple[float | None, float | None, float]:
        """(mean loss, mean L1 term, samples/s) since the last step event; starts the next window.
        `synced`: the caller has just waited for the device (a step event's read of its losses),
        so no second sync; what was still queued then is timed in the next window."""
        if not synced:
            synchronize(self.device)
        now = time.perf_counter()
        if self._t0 is not None:
            self._window_s += now - self._t0
            self.elapsed_s += now - self._t0
            self._t0 = now
        ce, l1, n = self._window
        rate = self._window_samples / max(self._window_s, 1e-9)
        self._window, self._window_samples, self._window_s = [0.0, 0.0, 0], 0, 0.0
        return (ce / n, l1 / n, rate) if n else (None, None, rate)

    def end_epoch(self) -> tuple[float | None, float | None]:
        """The epoch's (mean loss, mean L1 term); the next epoch's sums start at zero."""
        ce, l1, n = self.epoch
        self.epoch = [0.0, 0.0, 0]
        return (ce / n, l1 / n) if n else (None, None)

    # -- checkpoints -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        ce, l1, n = self.epoch
        return {"elapsed_s": self.elapsed_s, "eval_s": self.eval_s, "epoch_loss_sum": ce, "epoch_loss_count": n,
                "epoch_l1_sum": l1}

    def load(self, state: dict[str, Any]) -> None:
        self.elapsed_s, self.eval_s = float(state["elapsed_s"]), float(state["eval_s"])
        self.epoch = [float(state["epoch_loss_sum"]), float(state.get("epoch_l1_sum", 0.0)),
                      int(state["epoch_loss_count"])]
        self._window, self._window_samples, self._window_s = [0.0, 0.0, 0], 0, 0.0


class Pace:
    """When the loop emits a step event: the first step of the process; after `interval` s of
    training time since the last one (evaluations and epochs do not reset that timer); and,
    however fast an epoch is, every `every`-th batch of it: at least MIN_STEP_EVENTS an epoch."""

    def __init__(self, steps_per_epoch: int, interval: float) -> None:
        self.every = max(1, steps_per_epoch // MIN_STEP_EVENTS)
        self.interval = interval
        self._first = True

    def timer_due(self, meter: Meter) -> bool:
        return meter.window_s() >= self.interval

    def due(self, batch: int) -> bool:
        """Due by position after `batch` batches of the epoch (the same on every rank)."""
        return self._first or batch % self.every == 0

    def reported(self) -> None:
        self._first = False


def copy_state(tree: Any) -> Any:
    """A deep copy of a state's tensors (dicts, lists and tuples rebuilt, other values shared)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().clone()
    if isinstance(tree, dict):
        return {k: copy_state(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(copy_state(v) for v in tree)
    return tree


def _leaves(tree: Any, out: list[torch.Tensor]) -> None:
    if isinstance(tree, torch.Tensor):
        out.append(tree)
    elif isinstance(tree, dict):
        for v in tree.values():
            _leaves(v, out)
    elif isinstance(tree, (list, tuple)):
        for v in tree:
            _leaves(v, out)


def _same_layout(a: Any, b: Any) -> bool:
    """Whether `a` (a snapshot) can take `b`'s tensors in place: the same keys, lengths and
    tensor shapes, dtypes and devices."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device)
    if isinstance(a, dict) or isinstance(b, dict):
        return (isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys()
                and all(_same_layout(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b) and all(_same_layout(x, y) for x, y in zip(a, b)))
    return True


def _with_values(snap: Any, tree: Any) -> Any:
    """`snap`'s tensors, `tree`'s other values (positions, accuracies, schedule numbers)."""
    if isinstance(snap, torch.Tensor):
        return snap
    if isinstance(tree, dict):
        return {k: _with_values(snap[k], v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_with_values(s, v) for s, v in zip(snap, tree))
    return tree


def refresh_state(snapshot: Any | None, tree: Any) -> Any:
    """A copy of `tree` that reuses `snapshot`'s tensors when their layout matches (one
    `torch._foreach_copy_`, no allocation), or a fresh deep copy when it does not (the first
    time, or the optimizer's state appeared since)."""
    if snapshot is None or not _same_layout(snapshot, tree):
        return copy_state(tree)
    dst: list[torch.Tensor] = []
    src: list[torch.Tensor] = []
    _leaves(snapshot, dst)
    _leaves(tree, src)
    with torch.no_grad():
        if dst:
            torch._foreach_copy_(dst, [t.detach() for t in src])
    return _with_values(snapshot, tree)


class LastGood:
    """The last state known good, for a run whose loss stops being finite.

    Losses are read only at reports, so a state is copied at each read (on the device, no
    sync) and becomes good once a later step's loss, computed from its weights, reads finite.
    The state where the process began training (fresh, or the checkpoint it resumed) counts
    as good."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.good: dict[str, Any] = copy_state(state)
        self.candidate: dict[str, Any] | None = None

    def read(self, rows: int, state: Callable[[], dict[str, Any]]) -> None:
        """A read of `rows` steps, all finite; `state()` is the trainer's state now."""
        if rows:
            spare = None
            if self.candidate is not None:  # the candidate is good now; the old good's tensors are free
                self.good, spare = self.candidate, self.good
            self.candidate = refresh_state(spare, state())

    def moved(self, state: dict[str, Any]) -> None:
        """The state changed without a step (an epoch closed): copy it afresh."""
        self.candidate = refresh_state(self.candidate, state)

    def before(self, bad: int) -> dict[str, Any]:
        """The state to go back to when row `bad` of a read is the first not finite."""
        return self.candidate if bad > 0 and self.candidate is not None else self.good
