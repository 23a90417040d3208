"""Dashboard promises with no other test (App.run_test): kwh_price meters this machine's
GPU energy into the ledger every minute and on exit; ctrl+q quits through the same
question as q; a slave is selected with the mouse."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gputui.cloud.ledger import Ledger
from gputui.dashboard.hosts import ENERGY_FLUSH_S
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState
from gputui.ui.app import create_app
from gputui.ui.cost_panel import SlavesTable
from gputui.ui.screens import ChoiceScreen
from tests.dashboard_support import Clock, drive, make_backend, screen_text, sim_provider, wait_for

WATTS = 250.0
KWH_PRICE = 0.40


class LocalGpus:
    """This machine's two GPUs as NVML would read them, at the test's clock, drawing WATTS each."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def poll(self) -> list[HostSnapshot]:
        gpus = tuple(GpuSample(i, name="NVIDIA H100 80GB HBM3", util_pct=50.0, power_w=WATTS) for i in range(2))
        return [HostSnapshot("here", HostState.OK, self.clock(), kind="local", gpus=gpus)]

    def close(self) -> None:
        pass


def energy_profile(tmp_path: Path) -> Path:
    profile = tmp_path / "energy.toml"
    profile.write_text(f"[cloud]\nbudget_usd = 5\nkwh_price = {KWH_PRICE}\n", encoding="utf-8")
    return profile


def metered_app(tmp_path: Path, gputui_home: Path) -> tuple[Clock, float, Any, Ledger]:
    """The dashboard over LocalGpus with kwh_price set: its clock, that clock's start, the app, its ledger."""
    clock = Clock()
    start = clock.now
    app = create_app(make_backend(energy_profile(tmp_path), source=LocalGpus(clock), clock=clock))
    return clock, start, app, Ledger(gputui_home / "ledger.sqlite3")


async def advance(app: Any, pilot: Any, clock: Clock, seconds: float) -> None:
    """Move the clock, then let two polls run: the second read the new time from start to end."""
    clock.now += seconds
    polls = app.hosts_polls
    await wait_for(pilot, lambda: app.hosts_polls >= polls + 2, what="two polls at the new time")


def test_kwh_price_meters_local_gpu_energy_every_minute(tmp_path: Path, gputui_home: Path) -> None:
    clock, start, app, ledger = metered_app(tmp_path, gputui_home)

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        for step in (20, 20, ENERGY_FLUSH_S - 45):  # readings <= 20 s apart (a gap over 30 s is not bridged)
            await advance(app, pilot, clock, step)
            assert ledger.energy() == [], "written before a minute passed"
        await advance(app, pilot, clock, 10)  # 65 s since the start: the minute's flush
        lines = ledger.energy()
        assert sorted(line[0] for line in lines) == ["here/gpu0", "here/gpu1"]
        for _subject, cluster, _run, begin, end, kwh, rate in lines:
            assert (cluster, begin, end, rate) == ("local", start, start + 65, KWH_PRICE)
            assert kwh == pytest.approx(WATTS * 65 / 3.6e6)  # 250 W for 65 s
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)


def test_kwh_price_energy_since_the_last_flush_is_written_on_exit(tmp_path: Path, gputui_home: Path) -> None:
    clock, start, app, ledger = metered_app(tmp_path, gputui_home)

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        await advance(app, pilot, clock, 20)
        assert ledger.energy() == []  # 20 s: not yet written ...
        await pilot.press("q")  # ... until the dashboard exits
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
    lines = ledger.energy()
    assert sorted((s, b, e) for s, _c, _r, b, e, _k, _p in lines) == [
        ("here/gpu0", start, start + 20), ("here/gpu1", start, start + 20)]
    assert sum(line[5] for line in lines) == pytest.approx(2 * WATTS * 20 / 3.6e6)


@pytest.mark.parametrize("slave_up", [False, True])
def test_ctrl_q_quits_through_the_same_question_as_q(gputui_home: Path, slave_up: bool) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        if slave_up:
            await pilot.press("u")
            await wait_for(pilot, lambda: app.query_one(SlavesTable).row_count == 1, what="one slave")
        await pilot.press("ctrl+q")
        if slave_up:  # asks first: terminate, keep or cancel
            assert isinstance(app.screen, ChoiceScreen)
            assert "1 slave(s) running" in screen_text(app)
            await pilot.press("k")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
    assert app.return_code == 0
    running = Ledger(gputui_home / "ledger.sqlite3").instances(running=True)
    assert len(running) == (1 if slave_up else 0)
    if slave_up:
        assert "left running by your choice" in str(app.exit_message)


def test_a_click_selects_the_slave_that_d_then_terminates(gputui_home: Path) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> tuple[str, str]:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        table = app.query_one(SlavesTable)
        await pilot.press("u")
        await wait_for(pilot, lambda: table.row_count == 1, what="one slave")
        await pilot.press("u")
        await wait_for(pilot, lambda: table.row_count == 2, what="two slaves")
        first, second = (key.value for key in table.rows)
        assert table.selected == first  # the cursor starts on the first row
        assert await pilot.click(SlavesTable, offset=(2, 2))  # row 2 of the table: the header, then the slaves
        await wait_for(pilot, lambda: table.selected == second, what="the clicked row selected")
        await pilot.press("d")
        await wait_for(pilot, lambda: table.row_count == 1, what="the selected slave gone")
        assert {key.value for key in table.rows} == {first}
        await pilot.press("q", "t")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
        return first, second

    first, second = drive(app, scenario)
    records = {r.instance_id: r for r in Ledger(gputui_home / "ledger.sqlite3").instances()}
    assert records[second].ended_by == "user" and records[first].ended_by is not None
