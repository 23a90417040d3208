"""Snapshots of the main screen and the help screen at 120x40: seeded simulated hosts and
cloud, a frozen clock, and the events of a real recorded run (tests/data/seed_run_events.jsonl).

Update after a deliberate change of the look: `python -m pytest tests/test_dashboard_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from gputui.ui.app import DashboardApp, create_app
from gputui.ui.training_actions import post_events
from tests.conftest import REPO
from tests.dashboard_support import Clock, make_backend, sim_provider, wait_for

EVENTS = [json.loads(line) for line in (REPO / "tests" / "data" / "seed_run_events.jsonl").read_text().splitlines()]
SIZE = (120, 40)


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


def frozen_app() -> DashboardApp:
    clock = Clock()
    # Polls only when the test asks (an hour apart otherwise), so every reading is the same each time.
    return create_app(make_backend(provider=sim_provider(clock), clock=clock, interval=3600, sim_hosts=2, sim_gpus=4))


async def settle(pilot: Any) -> None:
    """First polls, a slave launched with u, six rounds of telemetry, half of a recorded run."""
    app = pilot.app
    await wait_for(pilot, lambda: app.hosts_polls >= 1 and app.cloud_polls >= 1)
    await pilot.press("u")
    await wait_for(pilot, lambda: app.cloud_polls >= 2 and app.cost_frame and app.cost_frame.live)
    for n in range(2, 8):
        app.poll_hosts()
        await wait_for(pilot, lambda: app.hosts_polls >= n)
    cut = 25  # the events go through the same fold and messages as a child's
    post_events(EVENTS[:cut], app.post_message, app.generation)
    await wait_for(pilot, lambda: app.training.step == EVENTS[cut - 1]["step"])
    await pilot.pause(0.2)


def test_main_screen(snap_compare: Any) -> None:
    assert snap_compare(frozen_app(), terminal_size=SIZE, run_before=settle)


def test_help_screen(snap_compare: Any) -> None:
    assert snap_compare(frozen_app(), press=["question_mark"], terminal_size=SIZE, run_before=settle)
