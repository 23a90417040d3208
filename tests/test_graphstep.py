"""The graph-capturable step (gputui.train.graphstep): its device-side batch and schedule logic
runs on the CPU exactly as the eager loop does, and a capture or replay that fails falls back
to eager steps with one report. Capture and replay themselves run only on CUDA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from gputui.train import nets
from gputui.train.graphstep import WARMUP_STEPS, GraphStep, graph_optimizer

N, BATCH, CLASSES = 1024, 64, 10
STEPS_PER_EPOCH = N // BATCH


def _data(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 28, 28, generator=gen).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (N,), generator=gen)
    return x.to(device), y.to(device)


def _model(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(1)
    return nets.build("fast", (28, 28), CLASSES).to(device=device, memory_format=torch.channels_last)


def _perm(epoch: int) -> torch.Tensor:
    return torch.randperm(N, generator=torch.Generator().manual_seed(100 + epoch))


LRS = [1e-3 * (1 + 0.1 * (i % 7)) for i in range(2 * STEPS_PER_EPOCH)]
L1 = 1e-5


def _reference(steps: int, share: int = BATCH, rank: int = 0) -> tuple[torch.nn.Module, list[float]]:
    """The eager loop's arithmetic, written out: python indices, a float lr per step."""
    x, y = _data()
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=LRS[0])
    losses = []
    for step in range(steps):
        epoch, batch = divmod(step, STEPS_PER_EPOCH)
        start = batch * BATCH + rank * share
        idx = _perm(epoch)[start : start + share]
        for group in opt.param_groups:
            group["lr"] = LRS[step]
        out = model(x[idx])
        ce = F.cross_entropy(out, y[idx])
        loss = ce + L1 * nets.l1_penalty(model)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(ce.item())
    return model, losses


def _graph_step(steps: int, share: int = BATCH, rank: int = 0, **kw) -> tuple[GraphStep, list[float]]:
    x, y = _data()
    model = _model()
    opt = graph_optimizer("adam", model.parameters(), torch.tensor(LRS[0]), (0.9, 0.999), 0.0, 0.0)
    gs = GraphStep(model, opt, x, y, LRS, BATCH, share, rank, L1, **kw)
    losses = []
    for step in range(steps):
        epoch, batch = divmod(step, STEPS_PER_EPOCH)
        if batch == 0:
            gs.begin_epoch(_perm(epoch), 0, step)
        gs()
        ce, _, n = gs.take()
        assert n == 1
        losses.append(ce)
    return gs, losses


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_device_counters_pick_the_same_batches_and_rates_as_the_eager_loop() -> None:
    """Across an epoch boundary: the same weights and losses as python indexing and float rates."""
    steps = STEPS_PER_EPOCH + 5
    ref, ref_losses = _reference(steps)
    gs, losses = _graph_step(steps)
    assert _max_diff(ref, gs.model) < 1e-5
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert int(gs.gstep) == steps and int(gs.k) == 5
    assert float(gs.lr) == pytest.approx(LRS[steps - 1])


def test_a_rank_takes_its_share_of_each_global_batch() -> None:
    ref, ref_losses = _reference(6, share=BATCH // 2, rank=1)
    gs, losses = _graph_step(6, share=BATCH // 2, rank=1)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert _max_diff(ref, gs.model) < 1e-5


def test_losses_are_summed_on_the_device_and_read_once() -> None:
    x, y = _data()
    model = _model()
    opt = graph_optimizer("adam", model.parameters(), torch.tensor(LRS[0]), (0.9, 0.999), 0.0, 0.0)
    gs = GraphStep(model, opt, x, y, LRS, BATCH, BATCH, 0, L1)
    gs.begin_epoch(_perm(0), 0, 0)
    for _ in range(4):
        gs()
    ce, l1, n = gs.take()
    _, ref_losses = _reference(4)
    assert n == 4
    assert ce == pytest.approx(sum(ref_losses) / 4, rel=1e-5)
    assert l1 > 0
    assert gs.take() == (0.0, 0.0, 0)


def test_a_failed_capture_falls_back_to_eager_steps_with_one_report() -> None:
    """On the CPU torch.cuda.CUDAGraph cannot be made: the capture fails after the warm-up,
    the report comes once, and training goes on with the same arithmetic."""
    reports: list[str] = []
    steps = WARMUP_STEPS + 4
    gs, losses = _graph_step(steps, capture=True, on_fallback=reports.append)
    ref, ref_losses = _reference(steps)
    assert len(reports) == 1 and reports[0].startswith("capture failed: ")
    assert gs.graph is None and gs.failed == reports[0]
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    assert _max_diff(ref, gs.model) < 1e-5


def test_a_failed_replay_falls_back_and_the_step_still_runs() -> None:
    class BrokenGraph:
        def replay(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    reports: list[str] = []
    x, y = _data()
    model = _model()
    opt = graph_optimizer("adam", model.parameters(), torch.tensor(LRS[0]), (0.9, 0.999), 0.0, 0.0)
    gs = GraphStep(model, opt, x, y, LRS, BATCH, BATCH, 0, L1, on_fallback=reports.append)
    gs.begin_epoch(_perm(0), 0, 0)
    gs.graph = BrokenGraph()
    for _ in range(3):
        gs()
    assert reports == ["replay failed: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert gs.graph is None
    ref, _ = _reference(3)
    assert _max_diff(ref, gs.model) < 1e-5


def test_a_resumed_optimizer_gets_the_tensor_learning_rate_back() -> None:
    gs, _ = _graph_step(3)
    state = gs.optimizer.state_dict()
    state["param_groups"][0]["lr"] = 0.5  # a checkpoint written by the eager path holds a float
    gs.optimizer.load_state_dict(state)
    gs.adopt_optimizer_state()
    assert all(g["lr"] is gs.lr for g in gs.optimizer.param_groups)


def test_an_optimizer_with_a_float_rate_is_refused() -> None:
    x, y = _data()
    model = _model()
    with pytest.raises(TypeError, match="lr is a tensor"):
        GraphStep(model, torch.optim.Adam(model.parameters(), lr=0.1), x, y, LRS, BATCH, BATCH, 0, L1)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replays_what_the_eager_body_computes() -> None:
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    results = []
    for capture in (False, True):
        x, y = _data("cuda")
        model = _model("cuda")
        opt = graph_optimizer("adam", model.parameters(), torch.tensor(LRS[0], device="cuda"), (0.9, 0.999), 0.0, 0.0)
        gs = GraphStep(model, opt, x, y, LRS, BATCH, BATCH, 0, L1, capture=capture)
        gs.begin_epoch(_perm(0), 0, 0)
        for _ in range(WARMUP_STEPS + 6):
            gs()
        results.append((gs, gs.take()))
    (eager, (ce_e, _, _)), (graph, (ce_g, _, _)) = results
    assert graph.graph is not None and graph.failed is None
    assert ce_g == pytest.approx(ce_e, rel=1e-4)
    assert _max_diff(eager.model, graph.model) < 1e-4
