"""The training loop: whole dataset as tensors on the device, permutation per epoch, slices.

No per-sample Dataset/DataLoader: the images are decoded once into one tensor on
the training device; each epoch shuffles with a seeded permutation and takes
contiguous slices of it as batches; evaluation runs in large batches. The same
loop serves `single`, `dataparallel` and each `ddp` rank (rank r takes its share
of every global batch, so the gradients DDP averages equal the single-process
gradient of the whole batch).
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from gputui.errors import UserError
from gputui.profiles import RunConfig
from gputui.runs import RunDir
from gputui.train import checkpoint, nets
from gputui.train.data import Dataset
from gputui.train.devices import synchronize

Emit = Callable[[dict[str, Any]], None]


def _step_event_interval(default: float = 0.5) -> float:
    """Seconds between step events: `default`, or GPUTUI_STEP_EVENT_INTERVAL (a test hook standing for a faster
    or slower machine: the tests must not depend on how many step events an epoch gets)."""
    text = os.environ.get("GPUTUI_STEP_EVENT_INTERVAL", "").strip()
    try:
        value = float(text) if text else default
    except ValueError:
        return default
    return value if math.isfinite(value) and value >= 0 else default


STEP_EVENT_INTERVAL_S = _step_event_interval()  # read once; by default at most two step events a second
EVAL_BATCH = 1000
MNIST_MEAN, MNIST_STD = 0.1307, 0.3081


@dataclass(frozen=True)
class Dist:
    """This process's place in a torch.distributed group (None when not distributed)."""

    rank: int
    world: int


class StopFlag:
    """Set from a signal handler; the loop checkpoints and stops at the next step."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self.reason = ""

    def set(self, reason: str = "interrupted") -> None:
        self.reason = reason
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


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


def lr_at(cfg: RunConfig, step: int, total: int) -> float:
    """The learning rate for `step` (0-based) of `total`: a pure function, so resume is exact."""
    if cfg.schedule == "constant" or total <= 1:
        return cfg.lr
    frac = step / (total - 1)
    if cfg.schedule == "cosine":
        return cfg.lr * 0.5 * (1 + math.cos(math.pi * frac))
    # onecycle: linear rise from lr/25 to lr, then cosine down to lr/1e4 (as torch's OneCycleLR)
    start, end = cfg.lr / 25, cfg.lr / 25 / 1e4
    if cfg.warmup > 0 and frac < cfg.warmup:
        return start + (cfg.lr - start) * frac / cfg.warmup
    down = (frac - cfg.warmup) / (1 - cfg.warmup)
    return end + (cfg.lr - end) * 0.5 * (1 + math.cos(math.pi * down))


def epoch_permutation(seed: int, epoch: int, n: int) -> torch.Tensor:
    """The shuffle of epoch `epoch`: a function of (seed, epoch) only, the same on every rank."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    return torch.randperm(n, generator=gen)


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


def to_device(images: Any, labels: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 images (N, H, W) -> normalised float32 (N, 1, H, W) on `device`; labels -> int64."""
    x = torch.from_numpy(images).to(device).unsqueeze(1).float()
    x.div_(255.0).sub_(MNIST_MEAN).div_(MNIST_STD)
    # channels_last: oneDNN's convolution and pooling run 2-3x faster on it for 1-channel input.
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.from_numpy(labels).to(device)
    return x, y


def make_optimizer(cfg: RunConfig, params: Any) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


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


class Trainer:
    """Trains one run; emits events; checkpoints at every epoch and when stopped."""

    def __init__(
        self,
        cfg: RunConfig,
        run: RunDir,
        data: Dataset,
        device: torch.device,
        emit: Emit,
        stop: StopFlag,
        dist: Dist | None = None,
        start_info: dict[str, Any] | None = None,
    ) -> None:
        self.cfg, self.run, self.device, self.emit, self.stop, self.dist = cfg, run, device, emit, stop, dist
        self.start_info = start_info or {}
        world = dist.world if dist else 1
        if cfg.batch_size % world:
            raise UserError(f"batch_size {cfg.batch_size} does not split evenly over {world} ddp processes")
        self.n = len(data.train_images)
        self.steps_per_epoch = self.n // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"batch_size {cfg.batch_size} is larger than the {self.n} training images")
        self.total_steps = self.steps_per_epoch * cfg.epochs
        keep_freed_memory()
        torch.manual_seed(cfg.seed)
        model = nets.build(cfg.model, data.image_shape, data.num_classes)
        self.model = model.to(device=device, memory_format=torch.channels_last)
        self.net = self._wrap(self.model)
        self.optimizer = make_optimizer(cfg, self.model.parameters())
        self.x, self.y = to_device(data.train_images, data.train_labels, device)
        self.test_x, self.test_y = to_device(data.test_images, data.test_labels, device)
        self.num_classes = data.num_classes
        # Position and clocks (restored on resume).
        self.epoch = 0  # 0-based epoch in progress
        self.batch = 0  # batches done within it
        self.step = 0  # global optimizer steps done
        self.elapsed_s = 0.0  # training time, evaluation excluded, summed across resumes
        self.eval_s = 0.0
        self.best_acc: float | None = None
        self.last_acc: float | None = None
        self.epoch_loss_sum = 0.0
        self.epoch_loss_count = 0

    def _wrap(self, model: nn.Module) -> nn.Module:
        if self.dist is not None:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids)
        if self.cfg.strategy == "dataparallel":
            ids = list(self.cfg.gpus) if self.cfg.gpus else None
            return nn.DataParallel(model, device_ids=ids)
        return model

    @property
    def is_leader(self) -> bool:
        return self.dist is None or self.dist.rank == 0

    # -- checkpoints -------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "epoch": self.epoch,
            "batch": self.batch,
            "step": self.step,
            "steps_per_epoch": self.steps_per_epoch,
            "elapsed_s": self.elapsed_s,
            "eval_s": self.eval_s,
            "best_acc": self.best_acc,
            "last_acc": self.last_acc,
            "epoch_loss_sum": self.epoch_loss_sum,
            "epoch_loss_count": self.epoch_loss_count,
            "num_classes": self.num_classes,
            "torch_rng": torch.get_rng_state(),
        }

    def save(self) -> None:
        if self.is_leader:
            checkpoint.save(self.run.checkpoint, self.state())

    def restore(self) -> None:
        shapes = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        state = checkpoint.load(self.run.checkpoint, shapes)
        if state.get("steps_per_epoch") != self.steps_per_epoch or state.get("num_classes") != self.num_classes:
            raise UserError(
                f"{self.run.checkpoint}: was written for another dataset or batch size "
                f"({state.get('steps_per_epoch')} steps per epoch, {state.get('num_classes')} classes)"
            )
        try:
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            torch.set_rng_state(state["torch_rng"])
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise UserError(f"{self.run.checkpoint}: does not fit this model ({str(exc).splitlines()[0][:160]})") from None
        for key in ("epoch", "batch", "step", "elapsed_s", "eval_s", "best_acc", "last_acc"):
            setattr(self, key, state[key])
        self.epoch_loss_sum = state["epoch_loss_sum"]
        self.epoch_loss_count = state["epoch_loss_count"]

    # -- the loop ----------------------------------------------------------------------------
    def _stop_requested(self) -> bool:
        if self.dist is None:
            return self.stop.is_set()
        import torch.distributed as tdist

        flag = torch.tensor([1.0 if self.stop.is_set() else 0.0], device=self.device)
        tdist.all_reduce(flag, op=tdist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def _emit(self, event: str, **fields: Any) -> None:
        if self.is_leader:
            self.emit({"event": event, "time": round(time.time(), 3), **fields})

    def _evaluate(self) -> tuple[float, float, float]:
        synchronize(self.device)
        t0 = time.perf_counter()
        test_loss, test_acc = evaluate(self.model, self.test_x, self.test_y)
        eval_time = time.perf_counter() - t0
        self.eval_s += eval_time
        self.last_acc = test_acc
        self.best_acc = test_acc if self.best_acc is None else max(self.best_acc, test_acc)
        return test_loss, test_acc, eval_time

    def _eval_fields(self) -> dict[str, Any]:
        test_loss, test_acc, _ = self._evaluate()
        return dict(
            epoch=self.epoch + 1,
            step=self.step,
            test_loss=round(test_loss, 5),
            test_acc=round(test_acc, 2),
            elapsed_s=round(self.elapsed_s, 3),
            eval_s=round(self.eval_s, 3),
        )

    def train(self, resume: bool = False) -> str:
        """Run to the target epoch; return 'done' or 'interrupted'."""
        cfg = self.cfg
        resumed_from = None
        if resume:
            self.restore()
            resumed_from = self.step
        self._emit(
            "start",
            run_id=self.run.run_id,
            model=cfg.model,
            device=str(self.device),
            strategy=cfg.strategy,
            world_size=self.dist.world if self.dist else 1,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            steps_per_epoch=self.steps_per_epoch,
            total_steps=self.total_steps,
            train_samples=self.n,
            test_samples=len(self.test_x),
            num_classes=self.num_classes,
            params=sum(p.numel() for p in self.model.parameters()),
            seed=cfg.seed,
            resumed_from_step=resumed_from,
            run_dir=str(self.run.path),
            **self.start_info,
        )
        world, rank = (self.dist.world, self.dist.rank) if self.dist else (1, 0)
        share = cfg.batch_size // world
        l1 = cfg.l1
        loss_acc = torch.zeros((), device=self.device)
        loss_n = 0
        last_event = time.perf_counter()
        samples_since = 0
        train_since = 0.0
        first_step_event = True
        synchronize(self.device)
        t0 = time.perf_counter()

        def clock() -> float:
            nonlocal t0
            synchronize(self.device)
            now = time.perf_counter()
            spent = now - t0
            t0 = now
            return spent

        while self.epoch < cfg.epochs:
            perm = epoch_permutation(cfg.seed, self.epoch, self.n).to(self.device)
            points = set(eval_points(self.steps_per_epoch, cfg.evals_per_epoch))
            while self.batch < self.steps_per_epoch:
                if self._stop_requested():
                    spent = clock()
                    self.elapsed_s += spent
                    self.save()
                    self._emit(
                        "interrupted",
                        reason=self.stop.reason,
                        epoch=self.epoch + 1,
                        step=self.step,
                        elapsed_s=round(self.elapsed_s, 3),
                        checkpoint=str(self.run.checkpoint),
                    )
                    return "interrupted"
                start = self.batch * cfg.batch_size + rank * share
                idx = perm[start : start + share]
                lr = lr_at(cfg, self.step, self.total_steps)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                out = self.net(self.x[idx])
                loss = F.cross_entropy(out, self.y[idx])
                if l1:
                    loss = loss + l1 * nets.l1_penalty(self.model)
                self.optimizer.zero_grad(set_to_none=True)
                loss.backward()
                self.optimizer.step()
                loss_acc += loss.detach()
                loss_n += 1
                self.batch += 1
                self.step += 1
                samples_since += cfg.batch_size
                now = time.perf_counter()
                if first_step_event or now - last_event >= STEP_EVENT_INTERVAL_S:
                    spent = clock()
                    self.elapsed_s += spent
                    train_since += spent
                    mean_loss = loss_acc.item() / loss_n
                    self.epoch_loss_sum += mean_loss * loss_n
                    self.epoch_loss_count += loss_n
                    self._emit(
                        "step",
                        epoch=self.epoch + 1,
                        step=self.step,
                        loss=round(mean_loss, 5),
                        samples_per_s=round(samples_since / max(train_since, 1e-9), 1),
                        lr=lr,
                        elapsed_s=round(self.elapsed_s, 3),
                    )
                    loss_acc.zero_()
                    loss_n = 0
                    samples_since = 0
                    train_since = 0.0
                    last_event = time.perf_counter()
                    first_step_event = False
                if self.batch in points and self.batch < self.steps_per_epoch:
                    self.elapsed_s += clock()
                    self._emit("eval", **self._eval_fields())
                    clock()  # evaluation time is not training time
                    last_event = time.perf_counter()
            # End of the epoch: fold the pending losses in, evaluate, checkpoint.
            self.elapsed_s += clock()
            if loss_n:
                self.epoch_loss_sum += loss_acc.item()
                self.epoch_loss_count += loss_n
                loss_acc.zero_()
                loss_n = 0
            fields = self._eval_fields()
            train_loss = self.epoch_loss_sum / max(self.epoch_loss_count, 1)
            self.epoch += 1
            self.batch = 0
            self.epoch_loss_sum, self.epoch_loss_count = 0.0, 0
            self.save()
            self._emit("epoch", train_loss=round(train_loss, 5), **fields)
            clock()
            last_event = time.perf_counter()
        self._emit(
            "done",
            test_acc=None if self.last_acc is None else round(self.last_acc, 2),
            best_acc=None if self.best_acc is None else round(self.best_acc, 2),
            elapsed_s=round(self.elapsed_s, 3),
            eval_s=round(self.eval_s, 3),
            epochs=cfg.epochs,
            step=self.step,
        )
        return "done"
