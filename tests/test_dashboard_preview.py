"""u and d say what they will do before the key (the cost panel), and what they did after it (a
notification); a profile's `[ui] confirm = true` makes both ask first. Driven with the simulated
cloud; mouse clicks select slave rows and focus panels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textual.widgets._toast import Toast

from gputui.ui.app import create_app
from gputui.ui.cost_panel import CostPreview, SlavesTable
from gputui.ui.hosts_panel import HostsView
from gputui.ui.screens import ChoiceScreen, HelpScreen
from gputui.model.units import per_hour
from tests.dashboard_support import drive, make_backend, screen_text, sim_provider, wait_for

PROFILE = '[cloud]\nbudget_usd = 2.0\ninstance_type = "g4dn.xlarge"\n'


def preview(app: Any) -> str:
    return app.query_one(CostPreview).text


def rows(app: Any) -> int:
    return app.query_one(SlavesTable).row_count


def toasts(app: Any) -> list[str]:
    return [str(t.render()) for t in app.screen.query(Toast)]


def test_the_cost_panel_says_what_u_and_d_will_do_and_a_notification_what_they_did(gputui_home: Path) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cost_frame is not None and app.cost_frame.next_launch is not None,
                       what="the first cloud poll with the next launch priced")
        nxt = app.cost_frame.next_launch
        assert nxt.instance_type == "g4dn.xlarge" and nxt.zone.startswith("us-east-1") and nxt.usd_per_hour
        said = f"u launches 1 × g4dn.xlarge spot in {nxt.zone} at {per_hour(nxt.usd_per_hour)}"
        assert said in preview(app) and "d: no slave selected" in preview(app), preview(app)
        await pilot.pause()
        assert "u launches 1 × g4dn.xlarge spot" in screen_text(app), screen_text(app)  # drawn, not only set
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 1, what="the slave")
        slave = app.query_one(SlavesTable).selected
        await wait_for(pilot, lambda: any(f"u: launched {slave}, g4dn.xlarge spot in {nxt.zone}" in t
                                          for t in toasts(app)), what="the launch notification")
        assert provider.calls.count("launch") == 1
        await wait_for(pilot, lambda: f"d terminates {slave} (g4dn.xlarge, up " in preview(app), what="d's target")
        assert " spent)" in preview(app)
        await pilot.press("d")
        await wait_for(pilot, lambda: rows(app) == 0, what="the slave gone")
        await wait_for(pilot, lambda: any(f"d: terminated {slave} (g4dn.xlarge" in t for t in toasts(app)),
                       what="the terminate notification")
        assert not isinstance(app.screen, ChoiceScreen)  # without [ui] confirm, neither key asks
        await pilot.press("q")

    drive(app, scenario, notifications=True)


async def asked(pilot: Any, key: str) -> None:
    """Press `key` and wait for its question (an answer pressed before it shows would reach the app)."""
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(pilot.app.screen, ChoiceScreen), what=f"{key} to ask first")
    await pilot.pause()


def test_ui_confirm_makes_u_and_d_ask_first(tmp_path: Path, gputui_home: Path) -> None:
    profile = tmp_path / "confirm.toml"
    profile.write_text(PROFILE + "[ui]\nconfirm = true\n", encoding="utf-8")
    provider = sim_provider()
    app = create_app(make_backend(profile, provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cost_frame is not None and app.cost_frame.next_launch is not None,
                       what="the first cloud poll")
        assert "(asks first)" in preview(app)
        await asked(pilot, "u")
        question = screen_text(app)
        assert "Launch 1 × g4dn.xlarge spot in us-east-1" in question and "/h" in question, question
        await pilot.press("c")  # cancel: nothing launched
        assert not isinstance(app.screen, ChoiceScreen) and "launch" not in provider.calls
        await asked(pilot, "u")
        await pilot.press("l")  # launch
        await wait_for(pilot, lambda: rows(app) == 1, what="the slave")
        slave = app.query_one(SlavesTable).selected
        await asked(pilot, "d")
        assert f"Terminate {slave} (g4dn.xlarge" in screen_text(app)
        await pilot.press("escape")
        assert rows(app) == 1 and "terminate" not in provider.calls
        await asked(pilot, "d")
        await pilot.press("t")  # terminate
        await wait_for(pilot, lambda: rows(app) == 0, what="the slave gone")
        await pilot.press("q")

    drive(app, scenario, notifications=True)


def test_clicks_select_a_slave_row_and_focus_a_panel(gputui_home: Path) -> None:
    app = create_app(make_backend(provider=sim_provider()))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls and app.hosts_polls, what="first polls")
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 1, what="one slave")
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 2, what="two slaves")
        table = app.query_one(SlavesTable)
        first = table.selected
        await pilot.click(SlavesTable, offset=(2, 2))  # the second row (row 0 is the header)
        await pilot.pause()
        second = table.selected
        assert second is not None and second != first and app.focused is table
        assert f"d terminates {second}" in preview(app)
        await pilot.click(HostsView, offset=(2, 1))
        await pilot.pause()
        assert app.focused is app.query_one(HostsView)
        await pilot.click("#footer-pinned FooterKey")  # the footer's pinned "? Help" is a button too
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help from a click")
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen), what="the help to close")
        await asked(pilot, "q")
        await pilot.press("t")  # terminate them, then quit
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
