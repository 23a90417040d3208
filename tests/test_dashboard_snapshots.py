"""Snapshots of the dashboard at the four sizes the README names (80x24, 100x30, 120x40, 200x50),
fed from the H100 fixtures (tests/fixtures/h100: the `gputui monitor --once --json` round taken
while training, and the JSON events of the 40-epoch run replayed through the training fold),
plus a 2-node simulated cluster with a spot slave, the help screen, and the light theme. A
frozen clock and polls only when the test asks keep every frame the same each time.

Beside each snapshot, plain assertions read the screen as text, so that a failure says which
value is missing or cut (the snapshots say only that something changed).

Update after a deliberate change of the look:
`python -m pytest tests/test_dashboard_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from gputui.ui.app import DashboardApp, create_app
from gputui.ui.base import LIGHT_THEME
from gputui.ui.events_panel import EventsLog
from gputui.ui.hosts_panel import HostsView
from gputui.ui.screens import HelpScreen
from gputui.ui.training_actions import post_events
from gputui.model.units import duration
from tests.dashboard_support import (Clock, RecordedSource, drive, h100_events, make_backend, screen_diff, screen_text,
                                     settled, sim_provider, svg_picture, wait_for)
from tests.dashboard_support import utc  # noqa: F401 - an autouse fixture: the screen's clock in UTC

SIZES = [(80, 24), (100, 30), (120, 40), (200, 50)]
IDS = [f"{w}x{h}" for w, h in SIZES]
EVENTS = h100_events()
# Replayed up to the end of epoch 30 of 40: the run is going, so the ETA shows.
CUT = next(i for i, e in enumerate(EVENTS) if e["event"] == "epoch" and e["epoch"] == 30) + 1


SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_dashboard_snapshots"


@pytest.fixture
def snap_compare(snap_compare: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """pytest-textual-snapshot's comparison, whose failure prints a text diff of the screen
    (tests/dashboard_support.screen_diff) instead of only `assert False`."""
    import textual._doc as doc

    taken: list[str] = []
    take = doc.take_svg_screenshot

    def taking(*args: Any, **kwargs: Any) -> str:
        taken.append(take(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(doc, "take_svg_screenshot", taking)

    def compare(app: Any, **kwargs: Any) -> bool:
        if snap_compare(app, **kwargs) or request.config.getoption("--snapshot-update", False):
            return True
        stored = SNAPSHOTS / f"{request.node.name}.svg"
        if not stored.is_file():
            raise AssertionError(f"no stored snapshot {stored} (make it with --snapshot-update)")
        if svg_picture(stored.read_text(encoding="utf-8")) == svg_picture(taken[-1]):
            return True  # the same screen, its runs split otherwise (two blank cells drawn as one rect or two)
        raise AssertionError(f"the screen differs from {stored.name}:\n"
                             + screen_diff(stored.read_text(encoding="utf-8"), taken[-1], request.node.name))

    return compare


def h100_app(hosts: tuple[str, ...] = ("vm",)) -> DashboardApp:
    """The H100 machine's dashboard (profile local.toml: no cloud), polls an hour apart."""
    clock = Clock()
    return create_app(make_backend(demo=False, source=RecordedSource(clock, hosts), clock=clock, interval=3600))


def cluster_app() -> DashboardApp:
    clock = Clock()
    return create_app(make_backend(provider=sim_provider(clock), clock=clock, interval=3600, sim_hosts=2, sim_gpus=4))


async def polls(pilot: Any, rounds: int) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.hosts_polls >= 1 and app.cloud_polls >= 1, what="the first polls")
    for n in range(2, rounds + 1):  # a few rounds: the sparklines have points
        app.poll_hosts()
        await wait_for(pilot, lambda: app.hosts_polls >= n, what=f"telemetry round {n}")


async def replay(pilot: Any, events: list[dict[str, Any]]) -> None:
    app = pilot.app
    post_events(events, app.post_message, app.generation)  # the same fold and messages as a followed run's
    await wait_for(pilot, lambda: app.training.step == events[-1]["step"], what="the replayed events")
    await settled(pilot, what="the replayed run on the screen")
    panels = list(app.query("CurvesPanel"))
    for curves in panels:  # the curves redraw on a timer: draw the last state now
        curves.redraw()
    await settled(pilot, lambda: all(p._drawn == p._key() for p in panels), "the curves drawn")


async def settle_h100(pilot: Any) -> None:
    await polls(pilot, 6)
    await replay(pilot, EVENTS[:CUT])


async def settle_cluster(pilot: Any) -> None:
    """First polls, a spot slave launched with u, six rounds of telemetry, 30 epochs of the H100 run."""
    app = pilot.app
    await wait_for(pilot, lambda: app.hosts_polls >= 1 and app.cloud_polls >= 1, what="the first polls")
    await pilot.press("u")
    await wait_for(pilot, lambda: app.cloud_polls >= 2 and app.cost_frame and app.cost_frame.live, what="the slave")
    await polls(pilot, 6)
    await replay(pilot, EVENTS[:CUT])
    app.clear_notifications()  # the launch's toast would cover the events (and times out anyway)
    await settled(pilot, lambda: not app.query("Toast"), "the toasts gone")


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_h100_dashboard(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(h100_app(), terminal_size=size, run_before=settle_h100)


def test_cluster_with_a_spot_slave(snap_compare: Any) -> None:
    assert snap_compare(cluster_app(), terminal_size=(120, 40), run_before=settle_cluster)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
def test_help_screen(snap_compare: Any, size: tuple[int, int]) -> None:
    assert snap_compare(h100_app(), press=["question_mark"], terminal_size=size, run_before=settle_h100)


def test_light_theme(snap_compare: Any) -> None:
    assert snap_compare(h100_app(), press=["L"], terminal_size=(120, 40), run_before=settle_h100)


# Plain assertions: whole values on the screen at every size ------------------------------------

@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_every_size_shows_whole_values(size: tuple[int, int]) -> None:
    app = h100_app()

    async def scenario(pilot: Any) -> str:
        await settle_h100(pilot)
        return screen_text(app)

    text = drive(app, scenario, size=size)
    eta = app.training.eta_s
    assert eta is not None and eta > 0, "the replay stops mid-run: there is an ETA"
    wanted = {
        "the footer's quit key": "q Quit", "the footer's help key": "? Help",
        "the GPU model on the host line": "vm · H100 80GB HBM3", "host CPU": "cpu 10%",
        "GPU power of its limit": "118/700 W", "GPU memory": "1.1/80 GiB", "GPU temperature": "35°C",
        "the ETA": f"ETA {duration(eta)}", "the status line's words apart": "gputui · profile local.toml",
    }
    missing = {what: value for what, value in wanted.items() if value not in text}
    assert not missing, f"at {size[0]}x{size[1]} the screen lacks {missing}:\n{text}"
    assert not re.search(r"\d…", text), f"a number cut by an ellipsis at {size}:\n{text}"


def test_at_80x24_six_hosts_scroll_with_the_keyboard() -> None:
    app = h100_app(("vm", "node-1", "node-2", "node-3", "node-4", "node-5"))

    async def scenario(pilot: Any) -> None:
        await settle_h100(pilot)
        hosts = app.query_one(HostsView)
        assert app.focused is hosts, "the hosts panel has the focus first"
        before = screen_text(app)
        assert "node-5" not in before, "six hosts do not fit 80x24 (else this test shows nothing)"
        await pilot.press("end")
        assert hosts.scroll_offset.y > 0 and "node-5 · H100 80GB HBM3" in screen_text(app), screen_text(app)
        await pilot.press("home", "pagedown")
        assert hosts.scroll_offset.y > 0
        assert "Events" not in screen_text(app), "the events panel is below the screen at first"
        for _ in range(6):  # Tab moves panel to panel (no cloud here: no slaves table) and scrolls to it
            await pilot.press("tab")
            if isinstance(app.focused, EventsLog):
                break
        assert isinstance(app.focused, EventsLog), app.focused
        # The screen scrolls to the focused panel after the key (a busy machine drew it half way once).
        await wait_for(pilot, lambda: "checkpoint saved" in screen_text(app), what="the events panel scrolled to")
        text = screen_text(app)
        assert "Events" in text and "checkpoint saved" in text and "q Quit" in text, text
        for _ in range(6):
            await pilot.press("shift+tab")
            if app.focused is hosts:
                break
        assert app.focused is hosts and "Hosts & GPUs" in screen_text(app)

    drive(app, scenario, size=(80, 24))


def test_the_help_scrolls_at_80x24() -> None:
    app = h100_app()

    async def scenario(pilot: Any) -> None:
        await polls(pilot, 1)
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        await pilot.pause()
        last = "Esc, ? or q closes this help."
        assert last not in screen_text(app), "the help fits 80x24 (then this test shows nothing)"
        await pilot.press("end")
        await pilot.pause()
        assert last in screen_text(app), screen_text(app)
        await pilot.press("escape")

    drive(app, scenario, size=(80, 24))


def test_the_events_log_rewraps_to_its_width() -> None:
    app = h100_app()
    long = "slave i-0abc said: " + " ".join(f"word{n}" for n in range(25))  # about 170 characters

    async def scenario(pilot: Any) -> list[int]:
        await polls(pilot, 1)
        app.log_event(long)
        await pilot.pause()
        log = app.query_one(EventsLog)
        rows = []
        for width, height in ((200, 50), (80, 24), (200, 50)):
            await pilot.resize_terminal(width, height)
            await settled(pilot, lambda: tuple(app.size) == (width, height), f"the screen at {width}x{height}")
            rows.append(sum(1 for strip in log.lines if "word" in strip.text))
        last = [strip.text for strip in log.lines][-1]
        assert "word24" in last
        return rows

    wide, narrow, wide_again = drive(app, scenario, size=(200, 50))
    assert wide == 1 and narrow >= 3 and wide_again == 1, (wide, narrow, wide_again)


def test_l_switches_to_the_light_theme_and_back() -> None:
    app = h100_app()

    async def scenario(pilot: Any) -> list[str]:
        await polls(pilot, 1)
        seen = [app.theme]
        await pilot.press("L")
        seen.append(app.theme)
        await pilot.press("L")
        seen.append(app.theme)
        return seen

    dark, light, back = drive(app, scenario)
    assert light == LIGHT_THEME and dark == back != LIGHT_THEME


def test_gputui_light_starts_the_dashboard_in_the_light_theme(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.cli import build_parser
    from gputui.commands.ui import cmd_ui

    themes: list[str] = []
    monkeypatch.setattr(DashboardApp, "run", lambda self, *a, **k: themes.append(self.theme))
    parser = build_parser()
    for argv in (["--demo", "--light"], ["ui", "--demo", "--light"], ["--demo"]):
        assert cmd_ui(parser.parse_args(argv)) == 0
    assert themes[:2] == [LIGHT_THEME, LIGHT_THEME] and themes[2] != LIGHT_THEME, themes


class WideFigures(RecordedSource):
    """The H100 host with its widest figures: 100% busy, 100°C, 700/700 W, and a second GPU of
    1000/1023 MiB, busy and power-capped (its throttle reason shows)."""

    def poll(self) -> list[Any]:
        from dataclasses import replace

        gpu = self.host.gpus[0]
        hot = replace(gpu, util_pct=100.0, temperature_c=100.0, power_w=700.0, mem_used_mib=9.9 * 1024,
                      mem_total_mib=9.9 * 1024)
        small = replace(gpu, index=1, util_pct=99.0, mem_used_mib=1000.0, mem_total_mib=1023.0,
                        throttle=("sw_power_cap",))
        return [replace(self.host, time=self.clock(), gpus=(hot, small))]


@pytest.mark.parametrize("size", SIZES, ids=IDS)
def test_gpu_rows_keep_every_figure_whole(size: tuple[int, int]) -> None:
    clock = Clock()
    app = create_app(make_backend(demo=False, source=WideFigures(clock), clock=clock, interval=3600))

    async def scenario(pilot: Any) -> tuple[list[str], int]:
        await polls(pilot, 2)
        await pilot.pause()
        view = app.query_one(HostsView)
        return view.text_lines, view.scrollable_content_region.width

    lines, width = drive(app, scenario, size=size)
    hot, small = lines[1], lines[2]
    for figure in ("100%", "9.9/9.9 GiB", "100°C", "700/700 W"):
        assert figure in hot, (figure, hot)
    assert "1000/1023 MiB" in small and "99%" in small, small
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"lines wider than the panel ({width}) end in an ellipsis: {too_long}"


# The lab view (issue 33): 42 hosts of 4 GPUs, two of them unreachable, on a frozen clock -------

def test_lab_view(snap_compare: Any) -> None:
    from tests.test_dashboard_lab import FLEET_LINE, fleet, T0
    from tests.test_dashboard_processes import Scripted

    clock = Clock()
    source = Scripted([fleet(T0, down=False), fleet(T0 + 90.0, down=True)])
    app = create_app(make_backend(demo=False, source=source, clock=clock, interval=3600))

    async def run_before(pilot: Any) -> None:
        await polls(pilot, 2)
        view = app.query_one(HostsView)
        await settled(pilot, lambda: view.lab and FLEET_LINE in screen_text(app) and "s Sort" in screen_text(app),
                      "the lab view of the second round, its keys in the footer")

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)
