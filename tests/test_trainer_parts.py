"""The trainer's parts: what it reports (loss, throughput, step events), how a resume with more
epochs carries the learning rate on, what a loss that is not finite does, and seed bounds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.nn.functional as F

from gputui.runs import store as runs
from gputui.cli import main
from gputui.model.errors import UserError
from gputui.config.run import RunSettings
from gputui.config.profile import parse_profile
from gputui.train import checkpoint, loop, nets
from gputui.train.data import load_dataset
from gputui.train.loop import StopFlag, Trainer, epoch_permutation, to_device
from gputui.train.meter import MIN_STEP_EVENTS
from gputui.train.step import Step, final_lr

from .conftest import cli_env, json_lines, run_cli
from .proc_support import Child


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Bit-exact CPU runs in this process (as --threads 1 gives a subprocess)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make_trainer(data: Path, run_dir: Path, got: list[dict[str, Any]], stop: StopFlag | None = None,
                 **settings: Any) -> Trainer:
    cfg = RunSettings(data=str(data), device="cpu", **settings).resolve()
    run = runs.RunDir(run_dir) if run_dir.exists() else runs.create(run_dir)
    return Trainer(cfg, run, load_dataset(data), torch.device("cpu"), got.append, stop or StopFlag())


class StopAfter:
    """A Step that asks the run to stop once step `at` (1-based) is taken: a fault tied to a step."""

    def __init__(self, inner: Step, at: int, stop: StopFlag) -> None:
        self.inner, self.at, self.stop, self.impl = inner, at, stop, inner.impl

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        self.inner(step, idx, lr)
        if step + 1 == self.at:
            self.stop.set("test")

    def take(self) -> torch.Tensor:
        return self.inner.take()


def of(got: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e for e in got if e["event"] == kind]


# -- what is reported ----------------------------------------------------------------------------

def test_train_loss_is_the_cross_entropy_and_the_l1_term_is_apart(small_data: Path, tmp_path: Path) -> None:
    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=1, batch_size=64, seed=3)
    torch.manual_seed(3)  # the trainer's own initial weights, rebuilt
    model = nets.build("seed", (28, 28), 10).to(memory_format=torch.channels_last)
    data = load_dataset(small_data)
    x, y = to_device(data.train_images, data.train_labels, torch.device("cpu"))
    idx = epoch_permutation(3, 0, len(x))[:64]
    with torch.no_grad():
        ce = F.cross_entropy(model(x[idx]), y[idx]).item()
        l1 = trainer.cfg.l1 * nets.l1_penalty(model).item()
    assert trainer.train() == "done"
    first = of(got, "step")[0]
    assert first["step"] == 1
    assert first["loss"] == pytest.approx(ce, abs=2e-5)  # what test_loss measures, without the penalty
    assert first["l1"] == pytest.approx(l1, rel=1e-3) and l1 > 1e-4
    assert of(got, "start")[0]["step_impl"] == "eager"
    epoch = of(got, "epoch")[0]
    assert epoch["l1"] > 0 and epoch["train_loss"] < 3.0


def test_step_events_are_frequent_and_their_rates_add_up(small_data: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # 32 steps an epoch, each epoch well under 0.5 s, 4 evaluations an epoch (whose time is not training).
    batch = 16
    assert main(["run", "--json", "--data", str(small_data), "--epochs", "6", "--batch-size", str(batch),
                 "--evals-per-epoch", "4", "--device", "cpu", "--run-dir", str(tmp_path / "r")]) == 0
    got = json_lines(capsys.readouterr().out)
    steps, done = of(got, "step"), got[-1]
    assert done["event"] == "done" and len(of(got, "eval")) == 6 * 3
    for epoch in range(1, 7):
        assert sum(e["epoch"] == epoch for e in steps) >= MIN_STEP_EVENTS, [e["step"] for e in steps]
    # Each event's rate covers the training time since the previous one (elapsed_s counts training
    # only), so rate x that time, summed, gives back the samples trained.
    elapsed = [0.0] + [e["elapsed_s"] for e in steps]
    spans = [b - a for a, b in zip(elapsed, elapsed[1:])]
    weighted = sum(e["samples_per_s"] * s for e, s in zip(steps, spans)) / sum(spans)
    overall = done["step"] * batch / done["elapsed_s"]
    assert weighted == pytest.approx(overall, rel=0.10), (weighted, overall)
    assert steps[-1]["step"] > 6 * 32 - 32 / MIN_STEP_EVENTS - 1  # the rates cover (almost) the whole run


def test_an_interrupted_epoch_reports_the_same_train_loss(small_data: Path, tmp_path: Path, one_thread: None,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "STEP_EVENT_INTERVAL_S", 1e9)  # step events by position only: every 4th step
    settings = dict(epochs=1, batch_size=16, seed=5)
    whole: list[dict[str, Any]] = []
    assert make_trainer(small_data, tmp_path / "whole", whole, **settings).train() == "done"

    parts: list[dict[str, Any]] = []
    stop = StopFlag()
    trainer = make_trainer(small_data, tmp_path / "parts", parts, stop, **settings)
    trainer.step_fn = StopAfter(trainer.step_fn, 10, stop)  # steps 9 and 10 are read by no step event
    assert trainer.train() == "interrupted"
    assert of(parts, "interrupted")[0]["step"] == 10 and of(parts, "step")[-1]["step"] == 8
    assert make_trainer(small_data, tmp_path / "parts", parts, **settings).train(resume=True) == "done"
    a, b = of(whole, "epoch")[0], of(parts, "epoch")[0]
    assert (b["train_loss"], b["l1"]) == (a["train_loss"], a["l1"])


# -- schedules that extend smoothly ----------------------------------------------------------------

def test_resume_with_more_epochs_carries_the_learning_rate_on(small_data: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "STEP_EVENT_INTERVAL_S", 0.0)  # a step event (and its lr) every step
    got: list[dict[str, Any]] = []
    stop = StopFlag()
    trainer = make_trainer(small_data, tmp_path / "r", got, stop, epochs=2, batch_size=16)  # 64 steps, onecycle
    trainer.step_fn = StopAfter(trainer.step_fn, 40, stop)
    assert trainer.train() == "interrupted"
    before = {e["step"]: e["lr"] for e in of(got, "step")}

    again: list[dict[str, Any]] = []
    resumed = make_trainer(small_data, tmp_path / "r", again, epochs=4, batch_size=16)  # now 128 steps
    assert resumed.train(resume=True) == "done"
    after = {e["step"]: e["lr"] for e in of(again, "step")}
    assert of(again, "start")[0]["schedule_from_step"] == 40
    assert after[41] == pytest.approx(before[40], rel=0.01)  # no jump at the resume step
    rates = [after[s] for s in sorted(after)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))  # then down, smoothly, to where the schedule ends
    assert rates[-1] == pytest.approx(final_lr(resumed.cfg), rel=1e-6)
    assert max(a - b for a, b in zip(rates, rates[1:])) < 0.03 * before[40]  # a cosine over 88 steps


# -- a loss that is not finite -----------------------------------------------------------------------

def nan_run(data: Path, tmp_path: Path, *extra: str) -> tuple[Child, Path]:
    """A run whose step 44 (in epoch 2 of 32 steps each) has a NaN loss (the test hook)."""
    run_dir = tmp_path / "r"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--data", str(data), "--epochs", "2",
            "--batch-size", "16", "--device", "cpu", "--run-dir", str(run_dir), *extra]
    child = Child(argv, env=cli_env(GPUTUI_TEST_NAN_AT_STEP="44"), name="gputui run (NaN at step 44)")
    return child, run_dir


@pytest.mark.parametrize("strategy", [[], ["--strategy", "ddp", "--nproc", "2"]], ids=["single", "ddp"])
def test_a_nan_loss_ends_the_run_with_an_error_and_a_checkpoint_that_resumes(
        small_data: Path, tmp_path: Path, strategy: list[str]) -> None:
    child, run_dir = nan_run(small_data, tmp_path, *strategy)
    with child:
        code = child.finish(240, "the run to end on its NaN loss")
    err = child.stderr
    assert code == 1, err
    assert len(err.strip().splitlines()) == 1 and "diverged" in err and "Traceback" not in err, err
    error = child.events[-1]
    assert error["event"] == "error" and error["reason"] == "nan" and error["step"] == 44, child.kinds()
    assert error["exit_code"] == 1 and error["checkpoint"] == str(run_dir / "ckpt.pt")
    state = checkpoint.load(run_dir / "ckpt.pt")
    assert 32 <= state["step"] < 44  # the last good state: after epoch 1's checkpoint, before the bad step
    assert all(torch.isfinite(t).all() for t in state["model"].values())

    resumed = run_cli("run", "--json", "--resume", str(run_dir))  # without the hook: it trains on
    assert resumed.returncode == 0, resumed.stderr
    events = json_lines(resumed.stdout)
    assert events[0]["resumed_from_step"] == state["step"] and events[-1]["event"] == "done"
    assert events[-1]["step"] == 64


# -- seeds --------------------------------------------------------------------------------------------

def test_seeds_are_bounded_with_a_one_line_error(small_data: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--data", str(small_data), "--seed", str(2**32), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err == "gputui: error: --seed 4294967296: expected a whole number >= 0 and <= 4294967295\n"
    with pytest.raises(UserError, match=r"p.toml:2: \[run\] seed: expected a whole number >= 0 and <= 4294967295"):
        parse_profile(f"[run]\nseed = {2**62}\n", Path("p.toml"))


@pytest.mark.parametrize("seed", [0, 2**32 - 1, 2**62])
def test_epoch_permutation_takes_any_seed(seed: int) -> None:
    perm = epoch_permutation(seed, 11, 50)
    assert sorted(perm.tolist()) == list(range(50))
    assert torch.equal(perm, epoch_permutation(seed, 11, 50))
    assert not torch.equal(perm, epoch_permutation(seed, 12, 50))


# -- checkpoints by time (issue 29 fix 5) --------------------------------------------------------
@pytest.mark.parametrize(("every", "writes"), [(3600.0, 1), (0.0, 3)])
def test_epoch_end_checkpoints_follow_checkpoint_every_s(small_data: Path, tmp_path: Path, one_thread: None,
                                                         monkeypatch: pytest.MonkeyPatch, every: float,
                                                         writes: int) -> None:
    """checkpoint_every_s large: a 3-epoch run writes one checkpoint (at its end); 0: one per epoch."""
    saved: list[int] = []
    real = checkpoint.save
    monkeypatch.setattr(checkpoint, "save", lambda path, state: (saved.append(state["epoch"]), real(path, state)))
    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=3, checkpoint_every_s=every)
    assert trainer.train() == "done"
    assert len(saved) == writes, saved
    assert saved[-1] == 3  # the last one is the run's end
    assert checkpoint.load(trainer.run.checkpoint)["epoch"] == 3


# -- one host sync per step event (issue 29 fix 4) -----------------------------------------------
def test_a_step_event_costs_one_host_sync(small_data: Path, tmp_path: Path, one_thread: None,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way the loop waits for the device (a device sync, .item(), .tolist(), .cpu()) is
    counted while each step event is made: exactly one each."""
    from gputui.train import devices, meter

    syncs = [0]

    def counting(real: Any) -> Any:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            syncs[0] += 1
            return real(*args, **kwargs)
        return wrapper

    for name in ("item", "tolist", "cpu"):
        monkeypatch.setattr(torch.Tensor, name, counting(getattr(torch.Tensor, name)))
    monkeypatch.setattr(meter, "synchronize", counting(meter.synchronize))
    monkeypatch.setattr(devices, "synchronize", counting(devices.synchronize))
    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=2, batch_size=16)
    per_report: list[int] = []
    real_report = trainer._report_step

    def report(pace: Any) -> None:
        before = syncs[0]
        real_report(pace)
        per_report.append(syncs[0] - before)

    monkeypatch.setattr(trainer, "_report_step", report)
    assert trainer.train() == "done"
    assert len(per_report) == len(of(got, "step")) >= 2 * MIN_STEP_EVENTS
    assert set(per_report) == {1}, per_report


def test_the_last_good_snapshot_is_refreshed_in_place_and_equals_a_copy(small_data: Path, tmp_path: Path,
                                                                        one_thread: None) -> None:
    """LastGood reuses its snapshots' tensors (no allocation per report) and holds what a copy would."""
    from gputui.train.meter import LastGood

    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=1, optimizer="adam")
    good = LastGood(trainer.state())
    idx = torch.arange(16)
    buffers: list[set[int]] = []
    for step in range(4):
        trainer.step_fn(step, idx, 1e-3)
        trainer.step += 1
        good.read(1, trainer.state)
        assert good.candidate is not None
        buffers.append({t.data_ptr() for t in good.candidate["model"].values()})
    assert buffers[3] == buffers[1] and buffers[2] != buffers[3]  # two snapshots, taken in turn
    now = trainer.state()
    assert good.candidate["step"] == now["step"] == 4
    for key, value in now["model"].items():
        assert torch.equal(good.candidate["model"][key], value) and good.candidate["model"][key] is not value
    for pid, saved in now["optimizer"]["state"].items():
        for k, v in saved.items():
            assert torch.equal(good.candidate["optimizer"]["state"][pid][k], v)


# -- the warm-up is not training (issue 29 fix 1) ------------------------------------------------
class SlowFirstCall:
    """A Step whose first call (whatever its number) also sleeps: start-up work that costs time."""

    def __init__(self, inner: Step, pause: float) -> None:
        self.inner, self.pause, self.impl = inner, pause, inner.impl
        self.first_call_s: float | None = None

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        if self.first_call_s is None:
            import time

            t0 = time.perf_counter()
            time.sleep(self.pause)
            self.inner(step, idx, lr)
            self.first_call_s = time.perf_counter() - t0
            return
        self.inner(step, idx, lr)

    def take(self) -> torch.Tensor:
        return self.inner.take()


def test_the_first_step_event_excludes_the_warm_up(small_data: Path, tmp_path: Path, one_thread: None) -> None:
    """The step's first call is the warm-up before the clock: its cost is `warmup_s`, not `elapsed_s`."""
    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=1, batch_size=16)
    slow = SlowFirstCall(trainer.step_fn, 0.5)
    trainer.step_fn = slow
    assert trainer.train() == "done"
    assert slow.first_call_s is not None
    first = of(got, "step")[0]
    assert first["step"] == 1 and first["elapsed_s"] < slow.first_call_s, (first, slow.first_call_s)
    assert of(got, "start")[0]["warmup_s"] >= round(slow.first_call_s, 3) - 0.001


def test_the_warm_up_leaves_the_run_bit_identical(small_data: Path, tmp_path: Path, one_thread: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The same seed with and without the warm-up step: the same weights, optimizer state and losses."""
    def run(name: str) -> tuple[dict[str, Any], list[Any]]:
        got: list[dict[str, Any]] = []
        trainer = make_trainer(small_data, tmp_path / name, got, epochs=2, batch_size=16, optimizer="adam")
        assert trainer.train() == "done"
        return checkpoint.load(trainer.run.checkpoint), [(e["train_loss"], e["test_loss"]) for e in of(got, "epoch")]

    warm, warm_losses = run("warm")
    monkeypatch.setattr(Trainer, "_warm_up", lambda self: 0.0)
    cold, cold_losses = run("cold")
    assert warm_losses == cold_losses
    for key, value in cold["model"].items():
        assert torch.equal(warm["model"][key], value), key
    for pid, saved in cold["optimizer"]["state"].items():
        for k, v in saved.items():
            assert torch.equal(warm["optimizer"]["state"][pid][k], v), (pid, k)


class FaultAtSecondRead:
    """A Step whose take() is a graph replay's fault seen at the sync (GraphFault) once armed
    (the test arms it at the run's second read): the trainer goes back to the state of its
    last read and trains those steps again, eagerly."""

    def __init__(self, inner: Step) -> None:
        self.inner, self.impl, self.armed, self.faulted_at = inner, inner.impl, False, None

    def __call__(self, step: int, idx: torch.Tensor, lr: float) -> None:
        self.inner(step, idx, lr)

    def take(self) -> torch.Tensor:
        from gputui.train.graphstep import GraphFault

        rows = self.inner.take()
        if self.armed:
            self.armed, self.faulted_at = False, len(rows)
            raise GraphFault("replay failed at sync: an illegal memory access (simulated)", len(rows))
        return rows


def test_a_replay_fault_at_the_sync_goes_back_to_the_last_good_state(small_data: Path, tmp_path: Path,
                                                                      one_thread: None) -> None:
    got: list[dict[str, Any]] = []
    trainer = make_trainer(small_data, tmp_path / "r", got, epochs=2, batch_size=16)
    steps_at_reads: list[int] = []
    faulty = FaultAtSecondRead(trainer.step_fn)
    trainer.step_fn = faulty
    real_check = trainer._check

    after_fault: list[int] = []

    def check() -> None:
        steps_at_reads.append(trainer.step)
        faulty.armed = len(steps_at_reads) == 2
        real_check()
        if len(steps_at_reads) == 2:
            after_fault.append(trainer.step)

    trainer._check = check  # type: ignore[method-assign]
    assert trainer.train() == "done"
    assert faulty.faulted_at is not None and faulty.faulted_at > 0
    first, second = steps_at_reads[0], steps_at_reads[1]
    assert second > first and after_fault == [first], "back to the state of the last read: its steps run again"
    assert of(got, "done") and trainer.step == trainer.total_steps
    assert of(got, "step")[-1]["step"] == trainer.total_steps


def test_a_group_of_one_trains_without_ddp_to_the_weights_of_a_single_process(
    small_data: Path, tmp_path: Path, one_thread: None,
) -> None:
    """A cluster of one node and one process (or what is left of one) shares no gradient: no DDP
    wrapper (whose start-up imports torch._dynamo), and the weights a single process reaches."""
    import torch.distributed as tdist

    single: list[dict[str, Any]] = []
    alone = make_trainer(small_data, tmp_path / "single", single, epochs=1, threads=1)
    alone.train()
    tdist.init_process_group("gloo", store=tdist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        cfg = RunSettings(data=str(small_data), device="cpu", epochs=1, threads=1).resolve()
        grouped: list[dict[str, Any]] = []
        one = Trainer(cfg, runs.create(tmp_path / "group"), load_dataset(small_data), torch.device("cpu"),
                      grouped.append, StopFlag(), dist=loop.Dist(rank=0, world=1))
        assert one.net is one.model  # no DistributedDataParallel around it
        one.train()
    finally:
        tdist.destroy_process_group()
    for a, b in zip(alone.model.parameters(), one.model.parameters()):
        assert torch.equal(a, b)
    assert of(grouped, "done") and of(grouped, "done")[0]["step"] == of(single, "done")[0]["step"] > 0
