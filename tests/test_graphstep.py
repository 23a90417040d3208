"""The graph-captured step (gputui.train.graphstep): its static buffers (rows, learning rate,
loss rows at a device counter) give on the CPU what the eager step gives, and a capture or
replay that fails falls back to eager steps with one report. Capture and replay themselves
run only on CUDA."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import pytest
import torch

from gputui.train import nets
from gputui.train.graphstep import WARMUP_STEPS, GraphFault, GraphStep, graph_optimizer
from gputui.train.step import EagerStep

N, BATCH, CLASSES = 1024, 64, 10
STEPS_PER_EPOCH = N // BATCH
L1 = 1e-5


def _data(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 1, 28, 28, generator=gen).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (N,), generator=gen)
    return x.to(device), y.to(device)


def _model(device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(1)
    return nets.build("fast", (28, 28), CLASSES).to(device=device, memory_format=torch.channels_last)


def _lr(step: int) -> float:
    return 1e-3 * (1 + 0.1 * (step % 7))


def _batches(steps: int, share: int = BATCH, rank: int = 0, device: str = "cpu"):
    """(step, rows) as the loop hands them: a seeded permutation per epoch, this rank's share."""
    for step in range(steps):
        epoch, batch = divmod(step, STEPS_PER_EPOCH)
        perm = torch.randperm(N, generator=torch.Generator().manual_seed(100 + epoch)).to(device)
        start = batch * BATCH + rank * share
        yield step, perm[start : start + share]


def _run(step_fn, steps: int, **kw) -> list[list[float]]:
    rows = []
    for step, idx in _batches(steps, **kw):
        step_fn(step, idx, _lr(step))
        if step % 5 == 4:  # takes at irregular points, as step events come
            rows += step_fn.take().tolist()
    return rows + step_fn.take().tolist()


def _eager(steps: int, **kw) -> tuple[torch.nn.Module, list[list[float]]]:
    x, y = _data()
    model = _model()
    step_fn = EagerStep(model, model, torch.optim.Adam(model.parameters(), lr=_lr(0)), x, y, L1)
    return model, _run(step_fn, steps, **kw)


def _graph(steps: int, share: int = BATCH, rank: int = 0, **kw) -> tuple[GraphStep, list[list[float]]]:
    x, y = _data()
    model = _model()
    opt = graph_optimizer("adam", model.parameters(), _lr(0), x.device)
    step_fn = GraphStep(model, opt, x, y, share, L1, capacity=STEPS_PER_EPOCH, **kw)
    return step_fn, _run(step_fn, steps, share=share, rank=rank)


def _max_diff(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((p - q).abs().max().item() for p, q in zip(a.parameters(), b.parameters()))


def test_static_buffers_train_as_the_eager_step_does() -> None:
    """Across an epoch boundary: the same weights and per-step (cross-entropy, L1) rows."""
    steps = STEPS_PER_EPOCH + 5
    ref, ref_rows = _eager(steps)
    gs, rows = _graph(steps)
    assert len(rows) == steps
    assert torch.tensor(rows) == pytest.approx(torch.tensor(ref_rows), rel=1e-5)
    assert _max_diff(ref, gs.model) < 1e-5
    assert float(gs.lr) == pytest.approx(_lr(steps - 1))
    assert gs.impl == "eager"  # no capture on the CPU


def test_a_rank_takes_its_share_of_each_global_batch() -> None:
    ref, ref_rows = _eager(6, share=BATCH // 2, rank=1)
    gs, rows = _graph(6, share=BATCH // 2, rank=1)
    assert torch.tensor(rows) == pytest.approx(torch.tensor(ref_rows), rel=1e-5)
    assert _max_diff(ref, gs.model) < 1e-5


def test_more_steps_than_the_loss_buffer_holds_is_an_error_not_a_wrong_number() -> None:
    x, y = _data()
    model = _model()
    gs = GraphStep(model, graph_optimizer("sgd", model.parameters(), 0.1, x.device), x, y, BATCH, 0.0, capacity=2)
    batches = list(_batches(3))
    gs(*batches[0], 0.1)
    gs(*batches[1], 0.1)
    with pytest.raises(RuntimeError, match="capacity 2"):
        gs(*batches[2], 0.1)
    assert gs.take().shape == (2, 2)


def test_the_nan_hook_poisons_exactly_its_step() -> None:
    gs, rows = _graph(4, nan_at=3)
    finite = [all(v == v for v in row) for row in rows]
    assert finite == [True, True, False, False]  # NaN weights after step 3 poison step 4 too


def test_a_failed_capture_falls_back_to_eager_steps_with_one_report() -> None:
    """On the CPU torch.cuda.CUDAGraph cannot be made: the capture fails after the warm-up,
    the report comes once, and training goes on with the same arithmetic."""
    reports: list[str] = []
    steps = WARMUP_STEPS + 4
    gs, rows = _graph(steps, capture=True, on_fallback=reports.append)
    ref, ref_rows = _eager(steps)
    assert len(reports) == 1 and reports[0].startswith("capture failed: ")
    assert gs.graph is None and gs.failed == reports[0] and gs.impl == "eager"
    assert torch.tensor(rows) == pytest.approx(torch.tensor(ref_rows), rel=1e-5)
    assert _max_diff(ref, gs.model) < 1e-5


def test_a_failed_replay_falls_back_and_the_step_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(monkeypatch)  # torch.cuda.device on the CPU

    class BrokenGraph:
        def replay(self) -> None:
            raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    reports: list[str] = []
    x, y = _data()
    model = _model()
    gs = GraphStep(model, graph_optimizer("adam", model.parameters(), _lr(0), x.device), x, y, BATCH, L1,
                   capacity=8, on_fallback=reports.append)
    gs.graph = BrokenGraph()
    rows = _run(gs, 3)
    assert reports == ["replay failed: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert gs.graph is None and len(rows) == 3
    ref, _ = _eager(3)
    assert _max_diff(ref, gs.model) < 1e-5


class FakeCuda:
    """A stand-in for torch.cuda's graph API on the CPU that records what the step does: the
    current device (entered/left), the current stream, captures and replays. A captured graph's
    replay runs the step's body (what a real graph's kernels do) unless `empty` (a graph captured
    on another device's stream); `end_raises` makes capture_end() raise as torch's does, before
    it restores the stream; `sync_raises` makes the next stream sync raise (a replay's fault)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.log: list[str] = []
        self.device_depth = 0
        self.stream = "default"
        self.graphs: list[Any] = []
        self.empty = self.end_raises = self.sync_raises = False
        self.step_fn: GraphStep | None = None
        fake = self

        class Graph:
            def __init__(self) -> None:
                self.replays = 0
                self.released = False
                fake.graphs.append(self)

            def capture_end(self) -> None:
                if fake.end_raises:
                    raise RuntimeError("CUDA error: operation failed due to a previous error during capture")

            def replay(self) -> None:
                fake.log.append(f"replay on device={fake.device_depth > 0}")
                self.replays += 1
                if not fake.empty:
                    assert fake.step_fn is not None
                    fake.step_fn.body()

            def reset(self) -> None:
                self.released = True

        @contextlib.contextmanager
        def graph(g: Graph) -> Iterator[None]:
            fake.log.append(f"capture on device={fake.device_depth > 0}")
            fake.stream = "capture"
            fake.generator.state["capturing"] = True  # capture_begin's prologue
            yield  # the body runs here (on the CPU its kernels run now; on CUDA they are recorded)
            g.capture_end()  # raises before the stream is put back, as torch.cuda.graph.__exit__
            fake.generator.state["capturing"] = False  # capture_end's epilogue, after it succeeds
            fake.stream = "default"

        @contextlib.contextmanager
        def device(dev: Any) -> Iterator[None]:
            fake.device_depth += 1
            try:
                yield
            finally:
                fake.device_depth -= 1

        class Stream:
            def __init__(self, name: str) -> None:
                self.name = name

            def __eq__(self, other: object) -> bool:
                return isinstance(other, Stream) and other.name == self.name

            def synchronize(self) -> None:
                fake.log.append(f"sync on device={fake.device_depth > 0}")
                if fake.sync_raises:
                    raise RuntimeError("CUDA error: an illegal memory access was encountered")

        def set_stream(stream: Stream) -> None:
            fake.stream = stream.name

        class Generator:
            """The device's default generator: a capture puts its state in capture mode and only
            a capture_end() that succeeds takes it out (as torch's capture_epilogue); a draw in
            capture mode outside a capture raises, as torch's does."""

            def __init__(self, offset: int = 0) -> None:
                self.state = {"offset": offset, "capturing": False}

            def clone_state(self) -> "Generator":
                return Generator(self.state["offset"])

            def graphsafe_set_state(self, other: "Generator") -> None:
                self.state = other.state

            def draw(self) -> None:
                if self.state["capturing"]:
                    raise RuntimeError("Offset increment outside graph capture encountered unexpectedly.")
                self.state["offset"] += 4

        self.generator = Generator()

        monkeypatch.setattr(torch.cuda, "default_generators", (self.generator,))
        monkeypatch.setattr(torch.cuda, "CUDAGraph", Graph)
        monkeypatch.setattr(torch.cuda, "graph", graph)
        monkeypatch.setattr(torch.cuda, "device", device)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda dev=None: Stream(fake.stream))
        monkeypatch.setattr(torch.cuda, "set_stream", set_stream)

    def step(self, reports: list[str] | None = None) -> GraphStep:
        x, y = _data()
        model = _model()
        self.step_fn = GraphStep(model, graph_optimizer("adam", model.parameters(), _lr(0), x.device), x, y, BATCH,
                                 L1, capacity=STEPS_PER_EPOCH, capture=True,
                                 on_fallback=(reports if reports is not None else []).append)
        return self.step_fn


def test_after_the_warm_up_one_step_captures_the_graph_and_replays_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control flow of a capture that works, on the CPU: the step after the warm-up captures
    once and replays what it captured (that is the step); every later step only replays; capture,
    replay and sync all run with the graph's device current (cuda:N, N > 0, captured nothing)."""
    fake = FakeCuda(monkeypatch)
    gs = fake.step()
    for step, idx in _batches(WARMUP_STEPS + 3):
        gs(step, idx, _lr(step))
    rows = gs.take()
    assert len(fake.graphs) == 1 and gs.graph is fake.graphs[0] and gs.impl == "graph" and gs.failed is None
    assert fake.graphs[0].replays == 3 and gs.eager_steps == WARMUP_STEPS
    assert rows.shape == (WARMUP_STEPS + 3, 2)
    assert fake.log == ["capture on device=True"] + ["replay on device=True"] * 3 + ["sync on device=True"]
    assert fake.stream == "default"


def test_a_replay_that_does_not_move_the_weights_falls_back_at_the_capture(monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty graph (captured on another device's stream): the once-per-run check after the first
    replay sees no weight move, reports the fallback with its step, and that step runs eagerly
    (one row for it, not two)."""
    fake = FakeCuda(monkeypatch)
    fake.empty = True
    reports: list[str] = []
    gs = fake.step(reports)
    for step, idx in _batches(WARMUP_STEPS + 3):
        gs(step, idx, _lr(step))
    assert reports == ["capture failed: the first replay did not change the weights (an empty graph)"]
    assert gs.failed_at == WARMUP_STEPS and gs.graph is None and gs.impl == "eager"
    assert fake.graphs[0].released and fake.graphs[0].replays == 1
    assert gs.take().shape == (WARMUP_STEPS + 3, 2)
    assert gs.eager_steps == WARMUP_STEPS + 3


def test_a_capture_that_fails_in_capture_end_puts_the_stream_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.cuda.graph's __exit__ raises in capture_end() before it restores the stream: the step
    puts the stream back, releases the graph's pool and goes on eagerly."""
    fake = FakeCuda(monkeypatch)
    fake.end_raises = True
    reports: list[str] = []
    gs = fake.step(reports)
    for step, idx in _batches(WARMUP_STEPS + 2):
        gs(step, idx, _lr(step))
    assert fake.stream == "default"
    assert reports == ["capture failed: RuntimeError: CUDA error: operation failed due to a previous error during capture"]
    assert gs.failed_at == WARMUP_STEPS and fake.graphs[0].released and gs.impl == "eager"


def test_a_failed_capture_takes_the_random_generator_out_of_capture_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a capture_end() that fails, the device's generator is the copy taken before the
    capture: out of capture mode, at the same offset, so the next random draw works (on an H100
    it raised "Offset increment outside graph capture encountered unexpectedly")."""
    fake = FakeCuda(monkeypatch)
    fake.end_raises = True
    gs = fake.step()
    for step, idx in _batches(WARMUP_STEPS):
        gs(step, idx, _lr(step))
    fake.generator.draw()
    before = fake.generator.state["offset"]
    for step, idx in list(_batches(WARMUP_STEPS + 2))[WARMUP_STEPS:]:
        gs(step, idx, _lr(step))
    assert gs.impl == "eager" and gs.failed_at == WARMUP_STEPS
    assert fake.generator.state == {"offset": before, "capturing": False}
    fake.generator.draw()


def test_a_fault_seen_at_the_sync_falls_back_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay's fault surfaces at the next sync (take): the same fallback, reported once, and a
    GraphFault telling the caller how many steps' rows are lost (it goes back to its last good
    state); the next steps run eagerly and take reads them."""
    fake = FakeCuda(monkeypatch)
    reports: list[str] = []
    gs = fake.step(reports)
    batches = list(_batches(WARMUP_STEPS + 4))
    for step, idx in batches[: WARMUP_STEPS + 2]:
        gs(step, idx, _lr(step))
    fake.sync_raises = True
    with pytest.raises(GraphFault) as caught:
        gs.take()
    assert caught.value.steps == WARMUP_STEPS + 2
    assert reports == ["replay failed at sync: RuntimeError: CUDA error: an illegal memory access was encountered"]
    assert gs.graph is None and gs.impl == "eager"
    for step, idx in batches[WARMUP_STEPS + 2 :]:
        gs(step, idx, _lr(step))
    assert gs.take().shape == (2, 2)


def test_a_resumed_optimizer_gets_the_tensor_learning_rate_back() -> None:
    gs, _ = _graph(3)
    state = gs.optimizer.state_dict()
    state["param_groups"][0]["lr"] = 0.5  # a checkpoint written by the eager path holds a float
    gs.optimizer.load_state_dict(state)
    gs.adopt_optimizer_state()
    assert all(g["lr"] is gs.lr for g in gs.optimizer.param_groups)
    assert float(gs.lr) == 0.5


def test_an_optimizer_with_a_float_rate_is_refused() -> None:
    x, y = _data()
    model = _model()
    with pytest.raises(TypeError, match="lr is a tensor"):
        GraphStep(model, torch.optim.Adam(model.parameters(), lr=0.1), x, y, BATCH, L1, capacity=4)


@pytest.fixture
def no_tf32() -> Iterator[None]:
    """TF32 off for the test, and the global flags as they were after it."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_graph_replays_what_the_eager_body_computes(no_tf32: None) -> None:
    """3 warm-up steps, a capture and 20 replays: the same rows and weights as eager steps, and
    the weights move between the first replay and the last."""
    steps = WARMUP_STEPS + 21
    out = []
    for capture in (False, True):
        x, y = _data("cuda")
        model = _model("cuda")
        gs = GraphStep(model, graph_optimizer("adam", model.parameters(), _lr(0), x.device), x, y, BATCH, L1,
                       capacity=STEPS_PER_EPOCH + 8, capture=capture)
        after_capture: list[torch.Tensor] = []
        for step, idx in _batches(steps, device="cuda"):
            gs(step, idx, _lr(step))
            if step == WARMUP_STEPS:
                after_capture = [p.detach().clone() for p in model.parameters()]
        rows = gs.take().tolist()
        out.append((gs, rows, after_capture))
    (eager, eager_rows, _), (graph, graph_rows, captured) = out
    assert graph.graph is not None and graph.failed is None and graph.impl == "graph"
    assert graph.eager_steps == WARMUP_STEPS and len(graph_rows) == steps
    assert max((p - q).abs().max().item() for p, q in zip(graph.model.parameters(), captured)) > 0, \
        "20 replays left the weights where the capture's step did"
    assert torch.tensor(graph_rows) == pytest.approx(torch.tensor(eager_rows), rel=1e-4)
    assert _max_diff(eager.model, graph.model) < 1e-4


def test_a_checkpoint_keeps_what_the_optimizer_learnt_not_how_it_runs() -> None:
    """An eager run's optimizer state (foreach, not capturable, a float rate) loaded into the
    graph step's optimizer keeps the graph's fused, tensor-rate way of running, and the
    reverse: on CUDA a foreach Adam with a tensor rate cannot even step."""
    from gputui.train.step import load_optimizer_state, portable_state

    eager_model, _ = _eager(3)
    eager_opt = torch.optim.Adam(eager_model.parameters(), lr=0.01, foreach=True)
    eager_model(_data()[0][:4]).sum().backward()
    eager_opt.step()
    gs, _ = _graph(2)
    load_optimizer_state(gs.optimizer, portable_state(eager_opt), gs)
    group = gs.optimizer.param_groups[0]
    assert group["fused"] is True and group["foreach"] in (None, False) and group["lr"] is gs.lr
    assert float(gs.lr) == pytest.approx(0.01)
    back = portable_state(gs.optimizer)
    assert isinstance(back["param_groups"][0]["lr"], float)
    load_optimizer_state(eager_opt, back, object())
    assert eager_opt.param_groups[0]["foreach"] is True and not eager_opt.param_groups[0]["fused"]
