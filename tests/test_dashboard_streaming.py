"""What keeps the dashboard cheap while a run streams a thousand events a second, checked for
sameness with the plain way: a read's events folded together give the state and curves that
folding them one by one gives; the curves thin evenly over a long run and are smoothed from
where they were; the plot is read from plotext's matrix into the Text its ANSI output gives;
the events log follows its newest line without laying the screen out for each; a followed
file is read once a poll, not again at once for what came in meanwhile."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest
from rich.text import Text
from textual.app import App, ComposeResult

from gputui.runs import store as runs
from gputui.runs.curves import MAX_POINTS, Curves, SeriesCache, ema, xy
from gputui.runs.follow import Follower
from gputui.dashboard.training import TrainingState
from gputui.model.events import finite, make, typed
from gputui.ui.events_panel import EventsLog
from gputui.monitor.watches import RunFacts, fold, fold_all

from tests.dashboard_support import wait_for
from tests.test_dashboard_batching import burst


def noisy_stream(seed: int, n: int = 3000) -> list[dict[str, Any]]:
    """A run's events with what a hostile or broken writer may put in them: text, NaN, bools,
    huge integers, a missing step, evaluations, a resume of the same run half way."""
    rnd = random.Random(seed)
    out: list[dict[str, Any]] = burst(n // 2, steps_per_epoch=97)
    for event in out[1:]:
        roll = rnd.random()
        if roll < 0.02:
            event["loss"] = rnd.choice(["nan", float("nan"), float("inf"), True, 10**40, None])
        elif roll < 0.03:
            event["step"] = rnd.choice([None, "7", 10**30, 3.5])
        elif roll < 0.04:
            event["elapsed_s"] = rnd.choice([None, -1.0, float("nan")])
        elif roll < 0.05 and event["event"] == "step":
            out.append({**event, "event": "eval", "test_loss": 0.3, "test_acc": rnd.choice([50.0, "x", 101.0])})
    resumed = dict(out[0], resumed_from_step=n // 4)
    later = burst(n // 2, steps_per_epoch=97)[1:]
    return out + [resumed] + later + [make("done", step=n, epochs=10, test_acc=97.5, best_acc=97.6, elapsed_s=9.0)]


@pytest.mark.parametrize("seed", range(6))
def test_folding_a_read_whole_is_folding_it_event_by_event(seed: int) -> None:
    events = noisy_stream(seed)
    cut = random.Random(seed).sample(range(1, len(events)), 12)  # reads of any size, cut anywhere
    by_event = [one_by_one := TrainingState()]
    for event in events:
        one_by_one = one_by_one.fold(event)
        by_event.append(one_by_one)
    whole = TrainingState()
    for a, b in zip([0] + sorted(cut), sorted(cut) + [len(events)]):
        whole = whole.fold_all(events[a:b])
        assert whole == by_event[b], f"after event {b}"  # every field, the points and the curves included
    assert whole.curves.every == one_by_one.curves.every and whole.curves.version == one_by_one.curves.version
    assert whole.status == "done" and whole.loss_points and whole.curves.train_loss


@pytest.mark.parametrize("seed", range(4))
def test_the_watched_facts_fold_a_read_whole_as_event_by_event(seed: int) -> None:
    events = noisy_stream(seed)[:-1]  # running still: no `done`
    one_by_one = RunFacts()
    for event in events:
        one_by_one = fold(one_by_one, event)
    assert fold_all(RunFacts(), events) == one_by_one
    first = events[: events.index(next(e for e in events[1:] if e["event"] == "start"))]  # before the resume
    assert fold_all(RunFacts(), first).non_finite  # NaN losses there: the alert's fact, both ways
    assert fold_all(RunFacts(), first) == fold_all(fold_all(RunFacts(), first[:500]), first[500:])


def test_a_hostile_number_is_no_number_and_breaks_nothing() -> None:
    """JSON has no bound on integers: one too large for a float used to raise OverflowError in
    the reader of a run's events (`math.isfinite`), and end the dashboard's follow worker."""
    assert [finite(v) for v in (1.5, 3, float("nan"), float("inf"), True, "1", None, 10**40, -(10**40))] == \
        [1.5, 3, None, None, None, None, None, None, None]
    event = {"event": "step", "step": 10**40, "loss": 10**400, "elapsed_s": 1.0}
    assert typed(event)["step"] is None and typed(event)["loss"] is None
    state = TrainingState().fold_all([burst(1)[0], event, {"event": "step", "step": 5, "loss": 10**400}])
    assert state.step == 5 and state.loss is None
    assert fold(RunFacts(), {"event": "step", "step": 1, "loss": 10**400}).loss is None


def test_a_long_run_keeps_its_curve_evenly_from_first_step_to_last() -> None:
    """30,000 steps in a series capped at MAX_POINTS: the points left are spread evenly over the
    run (the old thinning halved the older half each time, until the first 80% of a long run
    was a handful of points), and the newest step is one of them."""
    short = burst(1_500)
    assert len(Curves().fold_all(short).train_loss) == sum(e["event"] == "step" for e in short)  # all, under the cap
    events = burst(30_000, steps_per_epoch=1_000)
    curves = Curves().fold_all(events)
    steps = [p.step for p in curves.train_loss]
    assert MAX_POINTS // 2 <= len(steps) <= MAX_POINTS
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    assert max(gaps) <= 2 * min(gaps), (min(gaps), max(gaps))
    assert steps[0] <= 2 * max(gaps)  # the start of the run is drawn too
    assert 30_000 - steps[-1] <= 2 * max(gaps)  # and its end, to within a gap
    assert Curves().fold_all(events[:1] + events[1:15_000]).fold_all(events[15_000:]) == curves


def test_the_smoothed_series_goes_on_from_where_it_was() -> None:
    """The series cache gives what smoothing the whole series gives, as the run grows and when
    its series is thinned (then it starts again)."""
    cache = SeriesCache()
    curves = Curves()
    events = burst(6_000, steps_per_epoch=500)
    for a in range(0, len(events), 700):
        curves = curves.fold_all(events[a:a + 700])
        for name in ("train_loss", "test_acc"):
            points = curves.series(name)
            xs, raw, smooth = cache.get(name, points, "step", 0.6)
            want_xs, want_raw = xy(points, "step")
            assert (xs, raw) == (want_xs, want_raw)
            assert smooth == pytest.approx(ema(want_raw, 0.6), rel=1e-12)


def test_the_plot_read_from_plotexts_matrix_is_the_text_of_its_ansi_output() -> None:
    pytest.importorskip("textual_plotext")
    from gputui.ui.curves_panel import CurvePlot, CurvesPanel

    state = TrainingState().fold_all(burst(4_000, steps_per_epoch=400))

    class One(App[None]):
        def compose(self) -> ComposeResult:
            yield CurvesPanel(id="panel", interval=1000)

    async def run() -> None:
        app = One()
        async with app.run_test(size=(90, 24)) as pilot:
            panel = app.query_one(CurvesPanel)
            panel.state = state
            await wait_for(pilot, lambda: app.query(CurvePlot), 60, "the plot widget to mount (plotext loads then)")
            plot = app.query_one(CurvePlot)
            panel.redraw()
            await pilot.pause()
            legend = panel._legend_shown.plain if panel._legend_shown else ""
            assert "train loss" in legend and "epoch mean" not in legend  # dense step losses: the means left out
            direct = plot.render_direct()
            assert direct.plain.count("⠀") + sum(c in direct.plain for c in "⠁⠂⠄⡀⢀⣀") > 0  # curves drawn
            assert direct == Text.from_ansi(plot._plot.build())  # same characters, same styles, same spans
            painted = plot.builds

            def broken() -> Text:
                raise AttributeError("a plotext without _build_matrix")

            plot.render_direct = broken  # the vendored plotext changed: the ANSI way, said once
            plot.refresh()
            await pilot.pause()
            assert plot.builds == painted + 1 and plot.direct is False
            assert plot.render() == Text.from_ansi(plot._plot.build())

    import asyncio

    asyncio.run(run())


class LogApp(App[None]):
    def compose(self) -> ComposeResult:
        yield EventsLog(id="log")


def test_the_events_log_follows_its_newest_line_without_a_layout_per_line() -> None:
    """Past its first screenful the log takes a line with its scrollbar updated in place (no
    layout of the whole screen), still scrolled to the newest line, the scrollbar's range the
    log's rows; scrolled up by the reader, it stays where it was."""
    import asyncio

    async def run() -> None:
        app = LogApp()
        async with app.run_test(size=(60, 8)) as pilot:
            log = app.query_one(EventsLog)
            layouts = 0
            original = log.refresh

            def counting(*args: Any, **kwargs: Any) -> Any:
                nonlocal layouts
                layouts += bool(kwargs.get("layout"))
                return original(*args, **kwargs)

            log.refresh = counting  # type: ignore[method-assign]
            for i in range(40):
                log.add("12:00:00", f"line {i}")
                await pilot.pause()
                assert log.scroll_y == log.max_scroll_y, f"line {i}: not at the newest line"
            assert log.max_scroll_y > 20 and log.show_vertical_scrollbar
            assert log.vertical_scrollbar.window_virtual_size == len(log.lines) == 40
            screenful = log.scrollable_content_region.height
            assert layouts <= screenful + 5, f"{layouts} layouts for 40 lines"  # the first screenful's, not one a line
            log.scroll_to(y=3, animate=False, immediate=True)
            log.add("12:00:01", "one more")
            await pilot.pause()
            assert log.scroll_y == 3  # the reader's place is kept
            assert log.vertical_scrollbar.window_virtual_size == 41

    asyncio.run(run())


def test_a_followed_file_is_read_once_a_poll_however_fast_it_grows(tmp_path: Path) -> None:
    """A run that writes while the reader works must not keep the reader from its wait: the
    old follower read again at once whenever the last read found anything, so a fast run kept
    it reading tiny slices (and the screen redrawing) without pause."""
    path = tmp_path / runs.EVENTS
    lines = [json.dumps(e) + "\n" for e in burst(50)]
    path.write_text(lines[0])
    follower = Follower(path, alive=lambda: True, interval_s=0)
    waits = 0
    wait = follower._stop.wait

    def counted(timeout: float | None = None) -> bool:
        nonlocal waits
        waits += 1
        return wait(0)

    follower._stop.wait = counted  # type: ignore[method-assign]
    read = follower.read

    def growing() -> list[tuple[dict[str, Any], bool]]:
        got = read()
        with open(path, "a", encoding="utf-8") as out:  # the run writes while the reader reads
            out.write(lines[len(got) and min(len(lines) - 1, 1 + waits)])
        return got

    follower.read = growing  # type: ignore[method-assign]
    batches = follower.batches()
    taken = [next(batches) for _ in range(6)]
    assert all(taken) and waits >= 5, f"{waits} waits for 6 reads"
    assert math.isfinite(follower.offset)
