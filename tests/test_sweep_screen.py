"""The dashboard's sweep screen (key W) on a small study: the trials table, best-so-far against
time, which slot runs which trial, and a trial that ends while the screen is open."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.widgets import Static

from gputui.dashboard.sweep import read_sweep
from gputui.sweep import study as studies
from gputui.sweep.space import parse_text
from gputui.ui.sweep_actions import SweepActions
from gputui.ui.sweep_screen import BestPlot, SweepScreen
from gputui.ui.tables import KeyedTable
from tests.dashboard_support import drive, screen_text, wait_for


class Host(SweepActions):
    """The smallest app with the mixin (the dashboard adds it to its bases)."""

    BINDINGS = [Binding("W", "sweep", "Sweep")]

    def compose(self) -> ComposeResult:
        yield Static("main")


def small_study(tmp_path: Path) -> Any:
    import optuna
    from optuna.trial import TrialState

    text = '[run]\nmodel = "fast"\n[sweep]\nname = "small"\ntrials = 6\nlr = [1e-3, 1e-1]\n'
    _profile, spec = parse_text(text, tmp_path / "small.toml")
    study = studies.create(spec)
    for value, slot in ((90.0, "cpu-0"), (95.5, "cpu-1"), (93.0, "cpu-0")):
        t = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 1e-1, log=True)})
        t.set_user_attr("slot", slot)
        study.tell(t, value)
    pruned = study.ask()
    pruned.set_user_attr("slot", "cpu-1")
    study.tell(pruned, state=TrialState.PRUNED)
    failed = study.ask()
    failed.set_user_attr("error", "boom")
    study.tell(failed, state=TrialState.FAIL)
    running = study.ask()
    running.set_user_attr("slot", "n0-cpu")
    return study, running


def cells(table: KeyedTable) -> list[list[str]]:
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def test_the_sweep_screen_shows_trials_best_so_far_and_slots_and_follows_the_study(tmp_path: Path) -> None:
    study, running = small_study(tmp_path)
    data = read_sweep()
    assert data is not None and data.name == "small"
    assert [v for _t, v in data.best] == [90.0, 95.5, 95.5] and data.best_trial == 1
    assert [r.state for r in data.rows] == ["complete"] * 3 + ["pruned", "fail", "running"]  # as `sweep show --json` names them

    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await pilot.press("W")
        await wait_for(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen.reads >= 1, what="a read")
        screen = app.screen
        trials = screen.query_one("#sweep-trials", KeyedTable)
        rows = cells(trials)
        assert [r[0] for r in rows] == ["5", "4", "3", "2", "1", "0"]  # newest first
        assert rows[4][1:4] == ["complete", "95.50%", "cpu-1"] and rows[0][1] == "running"
        assert rows[2][1:3] == ["pruned", "n/a"] and rows[1][1] == "fail" and "error: boom" in rows[1][5]
        assert cells(screen.query_one("#sweep-slots", KeyedTable))[0][:2] == ["n0-cpu", "5"]
        text = screen_text(app)
        assert "5/6 done, 1 running, 1 pruned, 1 failed; best 95.50% (trial 1)" in text
        assert "best so far" in text and "time since the first trial started" in text
        assert screen.query_one(BestPlot).display

        # the running trial ends (the master tells the study): the screen follows within a read or two
        reads = screen.reads
        study.tell(running, 97.25)
        await wait_for(pilot, lambda: screen.reads >= reads + 1 and cells(trials)[0][1] == "complete",
                       timeout=20, what="the next read showing trial 5 complete")
        assert cells(trials)[0][2] == "97.25%"
        assert screen.query_one("#sweep-slots", KeyedTable).row_count == 0
        assert "best 97.25% (trial 5)" in screen_text(app)
        await pilot.press("escape")
        assert not isinstance(app.screen, SweepScreen)

    drive(Host(), scenario)


def test_the_sweep_screen_without_a_sweep_says_how_to_start_one() -> None:
    async def scenario(pilot: Any) -> None:
        app = pilot.app
        await pilot.press("W")
        await wait_for(pilot, lambda: isinstance(app.screen, SweepScreen) and app.screen.reads >= 1, what="a read")
        assert "no sweep yet: `gputui sweep PROFILE` starts one" in screen_text(app)
        await pilot.press("W")
        assert not isinstance(app.screen, SweepScreen)

    drive(Host(), scenario)
