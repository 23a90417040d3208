"""The training loop: whole dataset as tensors on the device, permutation per epoch, slices.

No per-sample Dataset/DataLoader: the images are decoded once into one tensor on
the training device; each epoch shuffles with a seeded permutation and takes
contiguous slices of it as batches; evaluation runs in large batches. The same
loop serves `single`, `dataparallel` and each `ddp` rank (rank r takes its share
of every global batch, so the gradients DDP averages equal the single-process
gradient of the whole batch).

The loop only sequences: a `Step` (gputui.train.step) trains one batch, a `Meter`
(gputui.train.meter) keeps the clock and the loss, gputui.model.events builds the events.
A loss that is not finite ends the run: the last good state is put back and
checkpointed (see `Trainer._check`), and `Diverged` is raised for the caller to report.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from gputui.model import events
from gputui.model.supervisor import StopFlag
from gputui.model.errors import GputuiError, UserError
from gputui.config.run import RunConfig, uneven_batch
from gputui.runs.store import RunDir
from gputui.train import checkpoint, nets
from gputui.train.data import Dataset
from gputui.train.devices import synchronize
from gputui.train.graphstep import GraphFault
from gputui.train.meter import LastGood, Meter, Pace, copy_state, eval_points, evaluate, step_event_interval
from gputui.train.step import (Schedule, Step, epoch_permutation, keep_freed_memory, load_optimizer_state,  # noqa: F401
                               lr_at, make_optimizer, make_step, portable_state, to_device)  # (lr_at: a public name)

__all__ = ["Diverged", "Dist", "StopFlag", "Trainer", "eval_points", "evaluate", "lr_at", "make_optimizer", "to_device",
           "epoch_permutation", "STEP_EVENT_INTERVAL_S"]

Emit = Callable[[dict[str, Any]], None]
STEP_EVENT_INTERVAL_S = step_event_interval()  # read once; by default a step event per 0.5 s of training


def pause_test_step() -> int | None:
    """GPUTUI_TEST_PAUSE_AT_STEP=N (a test hook, as GPUTUI_TEST_NAN_AT_STEP): after step N (1-based,
    as in the step events) the run reports the step and waits, its clock stopped, until it is
    asked to stop; a test then signals a run that is at a known step however fast the machine.
    Unset, None."""
    text = os.environ.get("GPUTUI_TEST_PAUSE_AT_STEP", "").strip()
    return int(text) if text.isdigit() else None


PAUSE_AT_STEP = pause_test_step()
POLL_EVERY = 8  # ddp: steps between the ranks' agreement on a stop request (8 steps: well under 5 s)


@dataclass(frozen=True)
class Dist:
    """This process's place in a torch.distributed group (None when not distributed)."""

    rank: int
    world: int


class Diverged(GputuiError):
    """The loss stopped being finite; the last good state is checkpointed. `fields` go into
    the `error` event (gputui.train.distributed.error_event)."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.fields = fields


class Trainer:
    """Trains one run; emits events; checkpoints at every epoch and when stopped."""

    def __init__(self, cfg: RunConfig, run: RunDir, data: Dataset, device: torch.device, emit: Emit,
                 stop: StopFlag, dist: Dist | None = None, start_info: dict[str, Any] | None = None) -> None:
        self.cfg, self.run, self.device, self.emit, self.stop, self.dist = cfg, run, device, emit, stop, dist
        self.start_info = start_info or {}
        self.governor: Any = None  # gputui.train.threads.Governor: the thread count follows what is free
        world = dist.world if dist else 1
        uneven = uneven_batch(cfg.batch_size, world)
        if uneven is not None:
            raise UserError(uneven)
        self.n = len(data.train_images)
        self.steps_per_epoch = self.n // cfg.batch_size
        if self.steps_per_epoch == 0:
            raise UserError(f"batch_size {cfg.batch_size} is larger than the {self.n} training images")
        self.total_steps = self.steps_per_epoch * cfg.epochs
        keep_freed_memory()
        torch.manual_seed(cfg.seed)
        model = nets.build(cfg.model, data.image_shape, data.num_classes)
        # A library stub gap: Module.to takes memory_format (documented), its overloads do not say so.
        self.model = model.to(device=device, memory_format=torch.channels_last)  # type: ignore[call-overload]
        self.net = self._wrap(self.model)
        self.x, self.y = to_device(data.train_images, data.train_labels, device)
        self.test_x, self.test_y = to_device(data.test_images, data.test_labels, device)
        self.num_classes = data.num_classes
        self.step_fn: Step
        self.optimizer, self.step_fn = make_step(cfg, self.model, self.net, self.x, self.y, dist is None and
                                                 cfg.strategy == "single", self.steps_per_epoch, self._fell_back)
        self.meter = Meter(device, world)
        self.schedule = Schedule(cfg, self.total_steps, self.total_steps - 1)
        # Position (restored on resume).
        self.epoch = 0  # 0-based epoch in progress
        self.batch = 0  # batches done within it
        self.step = 0  # global optimizer steps done
        self.best_acc: float | None = None
        self.last_acc: float | None = None
        self.last_good = LastGood(self.state())  # where training begins is good (train() takes it again)
        self._saved_at = time.monotonic()  # when a checkpoint was last written (cfg.checkpoint_every_s)

    def _fell_back(self, reason: str) -> None:
        self._emit("fallback", from_impl="graph", to_impl="eager", reason=reason, step=self.step,
                   message=f"CUDA graph step off ({reason}); training goes on with the eager step")

    def _wrap(self, model: nn.Module) -> nn.Module:
        # A group of one (a cluster of one node and one process, or what is left of one) has no
        # gradient to share: DDP would only add its start-up (it imports torch._dynamo, 1-2 s).
        if self.dist is not None and self.dist.world > 1:
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
        s = self.schedule
        return {"model": self.model.state_dict(), "optimizer": portable_state(self.optimizer), "epoch": self.epoch,
                "batch": self.batch, "step": self.step, "steps_per_epoch": self.steps_per_epoch,
                "total_steps": self.total_steps, "best_acc": self.best_acc, "last_acc": self.last_acc,
                **self.meter.state(), "num_classes": self.num_classes, "torch_rng": torch.get_rng_state(),
                "schedule_total": s.total, "schedule_from_step": s.from_step, "schedule_from_lr": s.from_lr}

    def save(self) -> None:
        if self.is_leader:
            checkpoint.save(self.run.checkpoint, self.state())
        self._saved_at = time.monotonic()

    def _checkpoint_due(self) -> bool:
        """At an epoch's end: checkpoint when `checkpoint_every_s` has passed since the last one (0:
        at every epoch), and always at the last epoch (a stop, a spot notice's SIGTERM and a
        divergence checkpoint on their own). DDP and cluster runs checkpoint at every epoch: an
        elastic restart redoes at most one epoch (docs/clusters.md)."""
        every = self.cfg.checkpoint_every_s
        if every <= 0 or self.epoch >= self.cfg.epochs or self.dist is not None:
            return True
        return time.monotonic() - self._saved_at >= every

    def _apply(self, state: dict[str, Any]) -> None:
        """Put a state (a checkpoint's, or a copy kept in memory) back into this trainer."""
        self.model.load_state_dict(state["model"])
        load_optimizer_state(self.optimizer, state["optimizer"], self.step_fn)
        torch.set_rng_state(state["torch_rng"])
        for key in ("epoch", "batch", "step", "best_acc", "last_acc"):
            setattr(self, key, state[key])
        self.meter.load(state)

    def restore(self) -> None:
        shapes = {name: tuple(t.shape) for name, t in self.model.state_dict().items()}
        state = checkpoint.load(self.run.checkpoint, shapes)
        if state.get("steps_per_epoch") != self.steps_per_epoch or state.get("num_classes") != self.num_classes:
            raise UserError(
                f"{self.run.checkpoint}: was written for another dataset or batch size "
                f"({state.get('steps_per_epoch')} steps per epoch, {state.get('num_classes')} classes)"
            )
        try:
            self._apply(state)
        except (RuntimeError, KeyError, ValueError, TypeError) as exc:
            raise UserError(f"{self.run.checkpoint}: does not fit this model ({str(exc).splitlines()[0][:160]})") from None
        last = int(state.get("total_steps", self.total_steps)) - 1  # the run's last step when it was saved
        self.schedule = Schedule(self.cfg, int(state.get("schedule_total", last + 1)), last,
                                 state.get("schedule_from_step"), float(state.get("schedule_from_lr", 0.0)))
        self.schedule = self.schedule.extended(self.step, self.total_steps - 1)

    # -- the loop ----------------------------------------------------------------------------
    def _poll(self, pace: Pace) -> tuple[bool, bool]:
        """(stop requested, step event due by the timer), agreed by every rank: one collective every
        POLL_EVERY steps under DDP (the batch count is the same on every rank)."""
        stop, due = self.stop.is_set(), pace.timer_due(self.meter)
        if self.dist is None:
            return stop, due
        if self.batch % POLL_EVERY:
            return False, False  # the ranks agree every few steps, not at every one (a host sync each)
        import torch.distributed as tdist

        flags = torch.tensor([float(stop), float(due)], device=self.device)
        tdist.all_reduce(flags, op=tdist.ReduceOp.MAX)
        stop_f, due_f = flags.tolist()
        return stop_f > 0, due_f > 0

    def _emit(self, event: str, **fields: Any) -> None:
        if self.is_leader:
            self.emit(events.make(event, **fields))

    def _check(self) -> None:
        """Read the losses of the steps since the last read (the only host sync for them). One that
        is not finite puts the last good state back, checkpoints it and raises Diverged."""
        try:
            taken = self.step_fn.take()
        except GraphFault:  # a replay's fault, seen at this sync: the step has fallen back to eager
            self._apply(self.last_good.before(1))  # back to the state of the last read; its steps run again
            return
        rows, bad = self.meter.collect(taken)
        if bad is not None:
            self._diverge(self.step - rows + 1 + bad, self.last_good.before(bad))
        self.last_good.read(rows, self.state)

    def _diverge(self, bad_step: int, keep: dict[str, Any]) -> None:
        epoch = self.epoch + 1
        self._apply(keep)
        self.save()
        if self.dist is not None:
            import torch.distributed as tdist

            tdist.barrier()  # no rank leaves before the checkpoint is written
        raise Diverged(f"training diverged: the loss is not finite at step {bad_step} (epoch {epoch}); the last "
                       f"good state (step {self.step}) is checkpointed in {self.run.checkpoint}",
                       reason="nan", step=bad_step, epoch=epoch, checkpoint=str(self.run.checkpoint))

    def _evaluate(self) -> dict[str, Any]:
        """Evaluate on the test split (the clock is stopped) and the eval/epoch event's fields."""
        t0 = time.perf_counter()  # the stopped clock has synchronized the device
        test_loss, test_acc = evaluate(self.model, self.test_x, self.test_y)
        self.meter.add_eval(time.perf_counter() - t0)
        if not math.isfinite(test_loss):
            self._diverge(self.step, self.last_good.before(0))
        self.last_acc = test_acc
        self.best_acc = test_acc if self.best_acc is None else max(self.best_acc, test_acc)
        return dict(epoch=self.epoch + 1, step=self.step, test_loss=round(test_loss, 5), test_acc=round(test_acc, 2),
                    elapsed_s=round(self.meter.elapsed_s, 3), eval_s=round(self.meter.eval_s, 3))

    def _report_step(self, pace: Pace) -> None:
        self._check()
        loss, l1, rate = self.meter.lap(synced=True)  # _check's read of the losses was the report's one sync
        self._emit("step", epoch=self.epoch + 1, step=self.step, loss=None if loss is None else round(loss, 5),
                   l1=None if l1 is None else round(l1, 6), samples_per_s=round(rate, 1),
                   lr=self.schedule.at(self.step - 1), elapsed_s=round(self.meter.elapsed_s, 3))
        pace.reported()
        if self.governor is not None and (threads := self.governor.tick()) is not None:
            torch.set_num_threads(threads)  # the machine got busier (or freer) since the start

    def _end_epoch(self) -> None:
        """Fold the epoch's losses, evaluate, checkpoint: none of it training time."""
        self._check()
        self.meter.stop()
        fields = self._evaluate()
        train_loss, l1 = self.meter.end_epoch()
        self.epoch += 1
        self.batch = 0
        if self._checkpoint_due():
            self.save()
        self.last_good.moved(self.state())
        self._emit("epoch", train_loss=None if train_loss is None else round(train_loss, 5),
                   l1=None if l1 is None else round(l1, 6), **fields)
        self.meter.start()

    def _warm_up(self) -> float:
        """One throwaway step before the training clock starts, so that one-time start-up work
        (library set-up, first-use kernel loads and allocations, the graph step's first warm-up
        step) is not timed as training; then the weights, optimizer state, RNG and position are
        put back exactly as they were, so the run's results are those of a run without it.
        Its duration goes into the `start` event (`warmup_s`). Skipped under DDP (0.0): a step
        there is a collective every rank would have to take together. The step is numbered -1:
        no test hook (a NaN or a stop at step N >= 1) fires on it."""
        if self.dist is not None:
            return 0.0
        synchronize(self.device)
        t0 = time.perf_counter()
        keep = copy_state(self.state())  # the live tensors change in the step: a copy
        idx = torch.arange(self.cfg.batch_size, device=self.device)
        self.step_fn(-1, idx, self.schedule.at(self.step))
        self.step_fn.take()  # its losses are no run's
        if isinstance(getattr(self.step_fn, "eager_steps", None), int):
            setattr(self.step_fn, "eager_steps", 0)  # the graph step still takes its warm-up steps in the run
        self._apply(keep)
        synchronize(self.device)
        return time.perf_counter() - t0

    def _pause_for_test(self) -> None:
        """The GPUTUI_TEST_PAUSE_AT_STEP hook: wait, the clock stopped, until a stop is asked."""
        self.meter.stop()
        while not self.stop.is_set():
            time.sleep(0.02)
        self.meter.start()

    def _interrupt(self) -> str:
        self._check()  # the pending losses go into the checkpoint
        self.meter.stop()
        self.save()
        self._emit("interrupted", reason=self.stop.reason, epoch=self.epoch + 1, step=self.step,
                   elapsed_s=round(self.meter.elapsed_s, 3), checkpoint=str(self.run.checkpoint))
        return "interrupted"

    def train(self, resume: bool = False) -> str:
        """Run to the target epoch; return 'done' or 'interrupted'. A loss that is not finite
        raises Diverged once the last good state is checkpointed."""
        cfg = self.cfg
        resumed_from = None
        if resume:
            self.restore()
            resumed_from = self.step
        warmup_s = self._warm_up()
        self._emit("start", run_id=self.run.run_id, model=cfg.model, device=str(self.device), strategy=cfg.strategy,
                   world_size=self.dist.world if self.dist else 1, epochs=cfg.epochs, batch_size=cfg.batch_size,
                   steps_per_epoch=self.steps_per_epoch, total_steps=self.total_steps, train_samples=self.n,
                   test_samples=len(self.test_x), num_classes=self.num_classes,
                   params=sum(p.numel() for p in self.model.parameters()), seed=cfg.seed,
                   resumed_from_step=resumed_from, run_dir=str(self.run.path), step_impl=self.step_fn.impl,
                   schedule_from_step=self.schedule.from_step, warmup_s=round(warmup_s, 3), **self.start_info)
        world, rank = (self.dist.world, self.dist.rank) if self.dist else (1, 0)
        share = cfg.batch_size // world
        pace = Pace(self.steps_per_epoch, STEP_EVENT_INTERVAL_S)
        self.last_good = LastGood(self.state())  # where this process began is good
        self.meter.start()
        while self.epoch < cfg.epochs:
            perm = epoch_permutation(cfg.seed, self.epoch, self.n).to(self.device)
            points = set(eval_points(self.steps_per_epoch, cfg.evals_per_epoch))
            while self.batch < self.steps_per_epoch:
                stop, due = self._poll(pace)
                if stop:
                    return self._interrupt()
                start = self.batch * cfg.batch_size + rank * share
                self.step_fn(self.step, perm[start : start + share], self.schedule.at(self.step))
                self.batch += 1
                self.step += 1
                self.meter.count(cfg.batch_size)
                paused = self.step == PAUSE_AT_STEP
                if due or pace.due(self.batch) or paused:
                    self._report_step(pace)
                if paused:
                    self._pause_for_test()
                if self.batch in points and self.batch < self.steps_per_epoch:
                    self._check()  # a diverged run stops before its evaluation reads NaN
                    self.meter.stop()
                    self._emit("eval", **self._evaluate())
                    self.meter.start()
            self._end_epoch()
        self.meter.stop()
        self._emit("done", test_acc=None if self.last_acc is None else round(self.last_acc, 2),
                   best_acc=None if self.best_acc is None else round(self.best_acc, 2),
                   elapsed_s=round(self.meter.elapsed_s, 3), eval_s=round(self.meter.eval_s, 3), epochs=cfg.epochs,
                   step=self.step)
        return "done"
