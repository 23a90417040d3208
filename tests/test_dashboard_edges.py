"""The dashboard's rough edges a newcomer meets at 80x24 and 120x40 (issue 27, item 6): the help
says how to close it on its first screen, the demo says it is one, no footer key is cut, an empty
slaves table says what it is, a host that appears is scrolled into view, a starting run says so."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from textual.widgets._footer import FooterKey

from gputui.dashboard.training import TrainingState
from gputui.ui.app import create_app
from gputui.ui.screens import HelpScreen
from gputui.ui.training_panel import TrainingSummary
from tests.dashboard_support import Clock, RecordedSource, drive, make_backend, screen_text, sim_provider, wait_for
from tests.dashboard_support import utc  # noqa: F401 - an autouse fixture: the screen's clock in UTC


def demo_app() -> Any:
    clock = Clock()
    return create_app(make_backend(provider=sim_provider(clock), clock=clock, interval=3600))


async def first_polls(pilot: Any) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.hosts_polls >= 1 and app.cloud_polls >= 1, what="the first polls")
    await pilot.pause(0.1)


def test_at_80x24_the_demo_says_so_and_no_footer_key_is_cut() -> None:
    app = demo_app()

    def footer() -> tuple[str, list[tuple[str, bool]]]:
        keys = [(f"{k.key_display} {k.description}", bool(k.display)) for k in app.screen.query(FooterKey)]
        return screen_text(app), keys

    seen: list[tuple[str, list[tuple[str, bool]]]] = []

    def fitted() -> bool:  # the keys that do not fit are left out, and the screen shows it
        text, keys = footer()
        last = text.rstrip("\n").splitlines()[-1]
        if any(not shown for _l, shown in keys) and all(label in last for label, shown in keys if shown):
            seen.append((text, keys))  # this screen (a new binding recomposes the footer, its keys gone a moment)
            return True
        return False

    async def scenario(pilot: Any) -> tuple[str, list[tuple[str, bool]]]:
        await first_polls(pilot)
        await wait_for(pilot, fitted, what="the footer to show whole keys only")
        return seen[-1]

    text, keys = drive(app, scenario, size=(80, 24))
    lines = text.rstrip("\n").splitlines()
    assert "demo" in lines[0], lines[0]
    bottom = lines[-1]
    shown = [label for label, display in keys if display]
    assert "? Help" in shown and "q Quit" in shown
    for label in shown:  # every key on the footer is whole
        assert label in bottom, (label, bottom)
    for label, display in keys:
        if not display:
            assert label.split(" ", 1)[1] not in bottom, (label, bottom)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_the_help_says_how_to_close_it_on_its_first_screen(size: tuple[int, int]) -> None:
    app = demo_app()

    async def scenario(pilot: Any) -> str:
        await first_polls(pilot)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.pause(0.1)
        return screen_text(app)

    assert "Esc, ? or q closes this help" in drive(app, scenario, size=size)


def test_an_empty_slaves_table_says_what_it_is_and_how_to_fill_it() -> None:
    app = demo_app()

    async def scenario(pilot: Any) -> tuple[str, str]:
        await first_polls(pilot)
        empty = screen_text(app)
        await pilot.press("u")
        await wait_for(pilot, lambda: app.cost_frame is not None and app.cost_frame.live, what="the slave")
        await wait_for(pilot, lambda: "no slaves" not in screen_text(app), what="the table to show the slave")
        return empty, screen_text(app)

    empty, one = drive(app, scenario, size=(120, 40))
    assert "no slaves: u starts one" in empty
    assert "no slaves" not in one


def test_a_host_that_appears_is_scrolled_into_view() -> None:
    clock = Clock()
    source = RecordedSource(clock, ("vm", "node-1", "node-2", "node-3", "node-4", "node-5"))
    app = create_app(make_backend(demo=False, source=source, clock=clock, interval=3600))

    async def scenario(pilot: Any) -> str:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        assert "node-5" not in screen_text(app)  # six hosts do not fit: a seventh would be below
        source.names += ("slave-new",)
        app.poll_hosts()
        await wait_for(pilot, lambda: app.hosts_polls >= 2, what="the second poll")
        await wait_for(pilot, lambda: "slave-new" in screen_text(app), what="the new host on screen")
        return screen_text(app)

    assert "slave-new · H100 80GB HBM3" in drive(app, scenario, size=(80, 24))


def test_a_starting_run_says_it_is_starting() -> None:
    app = demo_app()

    async def scenario(pilot: Any) -> str:
        await first_polls(pilot)
        summary = app.query_one(TrainingSummary)
        summary.show(replace(TrainingState(), status="starting"))
        await pilot.pause(0.1)
        return screen_text(app)

    text = drive(app, scenario, size=(120, 40))
    assert "starting (loading torch" in text and "epoch 0/?" not in text
