"""The curves: series from a run's events, TensorBoard's smoothing, x axes, CSV export, overlays,
and the panel (textual-plotext) with its keys and its redraw throttle."""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from pathlib import Path
from typing import Any

import pytest
from textual.binding import Binding

from gputui.runs import history
from gputui.runs.curves import (Curves, ema, linear_ticks, load_run, log_ticks, read_csv, thin, time_ticks, x_label,
                           xy)
from gputui.runs.history import CSV_NAME, export_csv
from gputui.model.errors import UserError
from gputui.ui.curve_actions import CurveActions
from gputui.ui.curves_panel import REDRAW_S, CurvePlot, CurvesPanel

REFERENCE = Path("/work/shared/reference/h100/run-seed-40-epochs.jsonl")
LOCAL_REFERENCE = Path(__file__).parent / "fixtures" / "h100" / "run-seed-40-epochs.jsonl"


def reference_events() -> list[dict[str, Any]]:
    path = LOCAL_REFERENCE if LOCAL_REFERENCE.is_file() else REFERENCE
    if not path.is_file():
        pytest.skip(f"the H100 reference run is not here ({path})")
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def start(run_id: str = "r1", resumed: int | None = None, spe: int = 100, batch: int = 64) -> dict[str, Any]:
    return {"event": "start", "run_id": run_id, "model": "seed", "device": "cpu", "strategy": "single",
            "world_size": 1, "epochs": 3, "batch_size": batch, "steps_per_epoch": spe, "total_steps": 3 * spe,
            "resumed_from_step": resumed, "run_dir": None}


def step(n: int, loss: float, spe: int = 100) -> dict[str, Any]:
    return {"event": "step", "epoch": (n - 1) // spe + 1, "step": n, "loss": loss, "samples_per_s": 1000.0,
            "lr": 0.01, "elapsed_s": round(n * 0.01, 3)}


def synthetic(n: int = 300, spe: int = 100) -> list[dict[str, Any]]:
    """A run: steps, one evaluation in the middle of each epoch, and the epoch ends."""
    events: list[dict[str, Any]] = [start(spe=spe)]
    for k in range(1, n + 1):
        events.append(step(k, round(2.5 * 0.99 ** k, 5), spe))
        if k % spe == spe // 2:
            events.append({"event": "eval", "epoch": (k - 1) // spe + 1, "step": k, "test_loss": 1.0 / k,
                           "test_acc": 50 + k / 10, "elapsed_s": round(k * 0.01, 3), "eval_s": 0.1})
        if k % spe == 0:
            events.append({"event": "epoch", "epoch": k // spe, "step": k, "train_loss": 2.0 / k, "test_loss": 0.9 / k,
                           "test_acc": 60 + k / 10, "elapsed_s": round(k * 0.01, 3), "eval_s": 0.2})
    return events


# -- smoothing -------------------------------------------------------------------------------------

def test_ema_is_tensorboards_debiased_average_computed_by_hand() -> None:
    # w = 0.5: running 0.5, 1.25, 2.125 over debias 0.5, 0.75, 0.875
    assert ema([1.0, 2.0, 3.0], 0.5) == pytest.approx([1.0, 1.25 / 0.75, 2.125 / 0.875])
    # w = 0.9, two values: (0.1*10 = 1.0)/0.1 = 10; (0.9 + 0.1*20 = 2.9)/0.19
    assert ema([10.0, 20.0], 0.9) == pytest.approx([10.0, 2.9 / 0.19])


@pytest.mark.parametrize("weight", [0.3, 0.6, 0.9, 0.99])
def test_ema_keeps_the_first_value_and_a_constant_series(weight: float) -> None:
    assert ema([7.25, 1.0, 3.0], weight)[0] == pytest.approx(7.25)
    assert ema([0.42] * 200, weight) == pytest.approx([0.42] * 200, rel=1e-12)


def test_ema_weight_zero_is_the_raw_curve_and_a_nan_passes_through() -> None:
    assert ema([3.0, 1.0, 2.0], 0.0) == [3.0, 1.0, 2.0]
    out = ema([1.0, math.nan, 1.0], 0.6)
    assert out[0] == 1.0 and math.isnan(out[1]) and out[2] == pytest.approx(1.0)


# -- series and axes -------------------------------------------------------------------------------

def test_every_point_carries_step_epoch_samples_and_time() -> None:
    curves = Curves.from_events([start(spe=100, batch=64), step(150, 0.5)])
    (point,) = curves.train_loss
    assert (point.step, point.epoch, point.samples, point.time_s) == (150, 1.5, 150 * 64, 1.5)
    for axis, x in (("step", 150.0), ("epoch", 1.5), ("samples", 9600.0), ("time", 1.5)):
        assert xy(curves.train_loss, axis) == ([x], [0.5])


def test_without_a_start_the_epoch_is_the_events_and_there_is_no_samples_axis() -> None:
    curves = Curves.from_events([step(150, 0.5)])
    assert curves.train_loss[0].epoch == 2 and xy(curves.train_loss, "samples") == ([], [])


def test_series_from_a_synthetic_stream() -> None:
    curves = Curves.from_events(synthetic(300, 100))
    assert len(curves.train_loss) == 300 and curves.train_loss[0].value == pytest.approx(2.475)
    assert [p.step for p in curves.epoch_loss] == [100, 200, 300]
    assert [p.value for p in curves.epoch_loss] == pytest.approx([0.02, 0.01, 2.0 / 300])
    # evaluations from eval events (mid-epoch) and the epoch events (end of epoch), in order
    assert [p.step for p in curves.test_acc] == [50, 100, 150, 200, 250, 300]
    assert [p.step for p in curves.test_loss] == [50, 100, 150, 200, 250, 300]
    assert curves.test_acc[0].value == pytest.approx(55.0) and curves.test_acc[1].value == pytest.approx(70.0)


def test_series_from_the_h100_run() -> None:
    events = reference_events()
    curves = Curves.from_events(events)
    epochs = [e for e in events if e["event"] == "epoch"]
    steps = [e for e in events if e["event"] == "step"]
    assert [p.value for p in curves.train_loss] == [e["loss"] for e in steps]  # its 4 step events
    assert [p.value for p in curves.epoch_loss] == [e["train_loss"] for e in epochs]
    assert [p.value for p in curves.test_loss] == [e["test_loss"] for e in epochs]
    assert [p.value for p in curves.test_acc] == [e["test_acc"] for e in epochs]
    assert curves.train_loss[0].value == 2.32125 and curves.train_loss[0].step == 1
    assert [p.epoch for p in curves.test_acc] == pytest.approx(list(range(1, 41)))  # 117 steps an epoch
    assert curves.test_acc[-1].samples == 4680 * 512 and curves.test_acc[-1].time_s == epochs[-1]["elapsed_s"]


def test_a_resume_drops_the_steps_past_its_checkpoint_and_another_run_starts_afresh() -> None:
    first = [start("r1")] + [step(k, 1.0 / k) for k in range(1, 11)]
    resumed = [start("r1", resumed=5)] + [step(k, 2.0 / k) for k in range(6, 9)]
    curves = Curves.from_events(first + resumed)
    assert [p.step for p in curves.train_loss] == [1, 2, 3, 4, 5, 6, 7, 8]
    assert curves.train_loss[5].value == pytest.approx(2.0 / 6)
    other = curves.fold(start("r2"))
    assert other.empty and other.run_id == "r2" and other.version > curves.version


def test_events_without_curves_change_nothing() -> None:
    curves = Curves.from_events(synthetic(10, 10))
    for event in ({"event": "warning", "message": "x"}, {"event": "step", "step": 11, "loss": "nan"},
                  {"event": "step", "step": 12, "loss": math.inf}, {"event": "step", "step": 13, "loss": True},
                  {"event": "eval", "step": 14, "test_acc": "99"}, {"event": "done", "step": 10}):
        assert curves.fold(event) is curves


def test_round_ticks_and_their_labels() -> None:
    assert linear_ticks(1, 4680, 4) == [1000, 2000, 3000, 4000]
    assert linear_ticks(93.52, 98.86, 3) == [94, 96, 98]
    assert log_ticks(0.012, 2.32, 4) == [0.03, 0.1, 0.3, 1.0]
    assert log_ticks(0.05, 0.5, 8) == [0.05, 0.1, 0.2, 0.5]
    assert time_ticks(0, 150, 3) == [0, 60, 120]
    assert [x_label("time", t) for t in (0, 60, 3600)] == ["0s", "1m00s", "1h00m"]
    assert x_label("samples", 2_400_000) == "2.4M" and x_label("epoch", 2.5) == "2.5"


def test_thinning_keeps_each_buckets_lowest_and_highest_point() -> None:
    xs = [float(k) for k in range(1000)]
    ys = [(-1.0) ** k * (k % 7) for k in range(1000)]  # noisy
    ys[500] = 99.0  # a spike
    tx, ty = thin(xs, ys, 50)
    assert len(tx) <= 100 and tx == sorted(tx) and 99.0 in ty
    for b in range(50):  # every bucket of 20 keeps its extremes
        chunk = ys[b * 20:(b + 1) * 20]
        kept = [y for x, y in zip(tx, ty) if b * 20 <= x < (b + 1) * 20]
        assert min(kept) == min(chunk) and max(kept) == max(chunk)
    assert thin(xs[:80], ys[:80], 50) == (xs[:80], ys[:80])  # fits: as it is


# -- files -----------------------------------------------------------------------------------------

def run_dir_with(tmp_path: Path, events: list[dict[str, Any]], name: str = "run-a") -> Path:
    path = tmp_path / name
    path.mkdir()
    (path / "profile.toml").write_text("[run]\n", encoding="utf-8")
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return path


def test_csv_export_round_trip(tmp_path: Path) -> None:
    events = reference_events()
    run = run_dir_with(tmp_path, events)
    path, rows = export_csv(run)
    assert path == run / CSV_NAME and rows == 44  # 4 steps and 40 epochs
    text = path.read_text(encoding="utf-8")
    assert text.splitlines()[0] == ",".join(history.CSV_COLUMNS)  # the format of `gputui runs export --csv`
    with open(path, encoding="utf-8") as fh:
        back = Curves.from_events(read_csv(fh))
    curves = Curves.from_events(events)
    for name in ("train_loss", "epoch_loss", "test_loss", "test_acc"):
        mine, theirs = curves.series(name), back.series(name)
        assert [(p.step, p.time_s, p.value) for p in theirs] == [(p.step, p.time_s, p.value) for p in mine], name
    assert [p.epoch for p in back.test_acc] == [p.epoch for p in curves.test_acc]


def test_export_without_an_events_file_says_so(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no events.jsonl there"):
        export_csv(tmp_path)


def test_overlay_loads_an_earlier_run_from_its_directory(tmp_path: Path) -> None:
    run = run_dir_with(tmp_path, reference_events(), "20260101-000000-abcd")
    curves = load_run(run)
    assert curves.run_id == "bg" and curves.run_dir == str(run)  # the start's id, the directory it was read from
    assert len(curves.test_acc) == 40 and curves.test_acc[-1].value == 98.86
    assert load_run(run / "events.jsonl").test_acc == curves.test_acc
    with pytest.raises(UserError, match="no events.jsonl"):
        load_run(tmp_path / "nope")


# -- the panel -------------------------------------------------------------------------------------

class CurvesApp(CurveActions):
    """The panel alone, with the dashboard's curve keys."""

    BINDINGS = [Binding("x", "curves_axis"), Binding("left_square_bracket", "curves_rougher"),
                Binding("right_square_bracket", "curves_smoother"), Binding("l", "curves_log"),
                Binding("e", "curves_export")]

    def __init__(self, interval: float | None = None) -> None:
        super().__init__()
        self.overlay_runs: list[str] = []
        self.notes: list[str] = []
        self.interval = interval

    def compose(self) -> Any:
        yield CurvesPanel(id="curves") if self.interval is None else CurvesPanel(id="curves", interval=self.interval)

    def notify(self, message: str, **kwargs: Any) -> None:  # type: ignore[override]
        self.notes.append(message)
        super().notify(message, **kwargs)


def drive(app: Any, scenario: Any, size: tuple[int, int] = (100, 24)) -> Any:
    async def main() -> Any:
        async with app.run_test(size=size) as pilot:
            return await scenario(pilot)

    return asyncio.run(main())


async def wait_for(pilot: Any, predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        await pilot.pause(0.05)


def plot_lines(app: Any) -> list[str]:
    return app.query_one(CurvePlot).render().plain.splitlines()


async def drawn(pilot: Any, panel: CurvesPanel) -> None:
    """Wait for the panel to have drawn what it holds now."""
    await wait_for(pilot, lambda: panel._drawn == panel._key(), "the panel to draw its data")
    await pilot.pause()


def test_the_panel_mounts_and_x_changes_the_axis_label() -> None:
    app = CurvesApp()

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        panel.curves = Curves.from_events(reference_events())
        await drawn(pilot, panel)
        lines = plot_lines(app)
        assert lines[-1].split() == ["loss", "(log)", "step", "test", "acc", "(%)"]
        assert "4000" in lines[-2] and re.search(r"├98(\.0)?%", "".join(lines))  # accuracy ticks in %
        for label in ("epoch", "samples", "training time", "step"):
            await pilot.press("x")
            await drawn(pilot, panel)
            assert label in plot_lines(app)[-1], label
        await pilot.press("l")
        await drawn(pilot, panel)
        assert plot_lines(app)[-1].split()[0] == "loss" and "(log)" not in plot_lines(app)[-1]
        legend = str(app.query_one("#curves-legend").render())
        assert "train loss" in legend and "smoothing 0.6" in legend
        await pilot.press("right_square_bracket")
        assert panel.weight == 0.7 and "smoothing 0.7" in app.notes[-1]
        for _ in range(3):
            await pilot.press("left_square_bracket")
        assert panel.weight == 0.3

    drive(app, scenario)


def test_the_redraw_timer_keeps_the_once_a_second_promise() -> None:
    assert CurvesPanel().interval == REDRAW_S and 0 < REDRAW_S < 1.0


def test_a_burst_of_1000_events_costs_a_few_plot_builds_not_one_each() -> None:
    """The redraw timer's ticks are the test's (its own timer is set to an hour): ten ticks over
    1,000 updates build the plot at most ten times, however slow the machine."""
    app = CurvesApp(interval=3600.0)
    events = synthetic(1000, 100)[:1001]  # the start and 1,000 events

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        await drawn(pilot, panel)
        plot = app.query_one(CurvePlot)
        before, builds_before, ticks_before = panel.rebuilds, plot.builds, panel.ticks
        curves = Curves()
        for k, event in enumerate(events):
            curves = curves.fold(event)
            panel.curves = curves  # what the dashboard does on every update
            if k % 100 == 99:
                panel._tick()  # what the redraw timer does
                await pilot.pause()  # the app's loop runs
        rebuilds, builds = panel.rebuilds - before, plot.builds - builds_before
        ticks = panel.ticks - ticks_before  # the ten above, and any the app's own resize gave
        assert ticks >= 10 and rebuilds <= ticks <= 12, (rebuilds, ticks)
        assert builds <= rebuilds + 1, (builds, rebuilds)  # plotext builds once a set-up (and on a resize)
        panel._tick()
        await drawn(pilot, panel)  # and the last data is drawn
        assert panel.curves is curves and len(curves.train_loss) > 900
        settled = panel.rebuilds
        for _ in range(3):
            panel._tick()
            await pilot.pause()
        assert panel.rebuilds == settled  # nothing changed: no build

    drive(app, scenario)


def test_the_redraw_timer_pauses_with_nothing_to_draw_and_new_data_or_overlays_wake_it(tmp_path: Path) -> None:
    """An idle panel (no run, or a run that stopped) stops waking up once a second; new curves,
    and runs picked to lay over, start its timer again."""
    from types import SimpleNamespace

    from gputui.ui.curves_panel import IDLE_TICKS

    run = run_dir_with(tmp_path, reference_events(), "earlier")
    app = CurvesApp(interval=0.05)

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        timer = panel._timer
        assert timer is not None
        await wait_for(pilot, lambda: not timer._active.is_set(), "the idle panel's timer to pause")
        assert panel._idle >= IDLE_TICKS
        ticks = panel.ticks
        await drawn(pilot, panel)
        assert panel.ticks == ticks  # paused: no tick while nothing changes
        panel.curves = Curves().fold(reference_events()[0]).fold(reference_events()[1])  # data
        assert timer._active.is_set()
        await wait_for(pilot, lambda: panel.ticks > ticks and not timer._active.is_set(), "a tick, then a pause again")
        state = SimpleNamespace(curves=panel.curves, program=None)  # the training panel's state, as the app hands it on
        panel.state = state
        await wait_for(pilot, lambda: not timer._active.is_set(), "the timer to pause again")
        app.overlay_runs = [str(run)]
        panel.state = state  # what the app does after the runs screen (show_training): the same state
        assert timer._active.is_set()
        await wait_for(pilot, lambda: len(panel.overlays) == 1, "the overlay loaded by the woken timer")

    drive(app, scenario)


def test_overlays_from_app_overlay_runs_are_drawn_and_named(tmp_path: Path) -> None:
    run = run_dir_with(tmp_path, reference_events(), "earlier")
    app = CurvesApp()

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        panel.curves = Curves.from_events(synthetic(300, 100))
        await drawn(pilot, panel)
        alone = app.query_one(CurvePlot).render().plain
        app.overlay_runs = [str(run), str(tmp_path / "missing")]
        await wait_for(pilot, lambda: panel.overlays, "the overlay to load")
        await drawn(pilot, panel)
        assert [run_id for run_id, _ in panel.overlays] == ["bg"]
        assert "bg" in str(app.query_one("#curves-legend").render())
        assert app.query_one(CurvePlot).render().plain != alone
        assert any("missing" in note and "no events.jsonl" in note for note in app.notes)
        app.overlay_runs = []
        await wait_for(pilot, lambda: not panel.overlays, "the overlay to go")

    drive(app, scenario)


def test_e_exports_the_runs_curves_and_says_where(tmp_path: Path) -> None:
    events = reference_events()
    run = run_dir_with(tmp_path, events)
    app = CurvesApp()

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        await pilot.press("e")
        assert "no run to export" in app.notes[-1]
        panel.curves = Curves.from_events([{**events[0], "run_dir": str(run)}] + events[1:])
        await pilot.press("e")
        await wait_for(pilot, lambda: (run / CSV_NAME).is_file() and "rows written" in app.notes[-1], "the export")
        assert str(run / CSV_NAME) in app.notes[-1] and "44 rows" in app.notes[-1]

    drive(app, scenario)


def test_too_small_a_panel_says_so_instead_of_drawing_axes_alone() -> None:
    app = CurvesApp()

    async def scenario(pilot: Any) -> None:
        panel = app.query_one(CurvesPanel)
        panel.curves = Curves.from_events(synthetic(100, 50))
        await drawn(pilot, panel)
        assert "too small" in str(app.query_one("#curves-legend").render())
        assert not app.query_one(CurvePlot).display

    drive(app, scenario, size=(24, 5))


def test_dashboard_shows_the_first_loss_of_a_burst_in_its_curves() -> None:
    """Once the old chart's loss axis topped at 0.135 when the run's events said 2.552: queued
    updates merged and lost the first points. 300 steps, all posted before the app draws one."""
    from gputui.ui.app import create_app
    from gputui.ui.training_actions import post_events
    from tests.dashboard_support import make_backend

    app = create_app(make_backend())
    losses = [round(2.552 * 0.985 ** k, 5) for k in range(300)]
    events = [start("r-chart", spe=300)] + [step(k + 1, loss, 300) for k, loss in enumerate(losses)]

    async def scenario(pilot: Any) -> None:
        panels = app.query(CurvesPanel)
        assert panels, "the training panel does not hold the curves panel (gputui/ui/training_panel.py)"
        panel = panels.first()
        post_events(events, app.post_message, app.generation)
        await wait_for(pilot, lambda: app.training.step == len(losses), "the last step to reach the app")
        await drawn(pilot, panel)
        assert [p.value for p in panel.curves.train_loss][:2] == [2.552, losses[1]]
        assert len(panel.curves.train_loss) == len(losses)
        lines = plot_lines(app)
        top = lines[1].split("│")[1]  # the plot's first row, inside its frame
        assert top[:2].strip() and not top[-10:].strip(), lines  # the first loss, the highest, is drawn at the top
        await pilot.press("x")
        await drawn(pilot, panel)
        assert panel.axis == "epoch" and "epoch" in plot_lines(app)[-1]
        await pilot.press("q")

    drive(app, scenario, size=(120, 40))
