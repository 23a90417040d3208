"""One truth about what slaves cost: `gputui cloud ls`, `cloud down`, `gputui cost`, the
budget guard, the dashboard's cost frame and the ledger's records give the same figure for
the same simulated fleet, read at the same moment (the simulated cloud's clock, driven by
hand through GPUTUI_SIM_CLOCK): inside the 60 s billing minimum, and after a spot price
change over the instances' lives."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from gputui.cloud.budget import BudgetGuard
from gputui.cloud.costs import instance_cost
from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.factory import make_provider
from gputui.cloud.settings import load_cloud_settings
from gputui.dashboard.slaves import SlaveControl

from .conftest import run_cli
from .moto_fixture import public_key_line

T0 = 1_800_000_000.0
CLUSTER = "truth"


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    clock = tmp_path / "clock"
    clock.write_text(repr(T0))
    monkeypatch.setenv("GPUTUI_SIM_CLOCK", str(clock))
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", "0")
    monkeypatch.setenv("GPUTUI_SIM_SEED", "3")
    monkeypatch.setenv("GPUTUI_SIM_WATCHDOG", "0")  # no renewer runs here: the slaves' own lease must not stop them
    monkeypatch.setenv("GPUTUI_PUBLIC_IP_URL", "http://127.0.0.1:9/")  # never asked: this is the simulated cloud
    (tmp_path / "id.pub").write_text(public_key_line() + "\n")
    profile = tmp_path / f"{CLUSTER}.toml"
    profile.write_text('[cloud]\nzones = ["us-east-1a", "us-east-1b"]\npublic_key = "id.pub"\nbudget_usd = 50\n')
    return clock, profile


def cli(profile: Path, *args: str) -> Any:
    done = run_cli("cloud", *args, "--provider", "sim", "--profile", str(profile), timeout=120)
    assert done.returncode == 0, done.stderr
    return done


def views(profile: Path) -> dict[str, Any]:
    """Every view's figure, at the simulated cloud's current time."""
    listed = json.loads(cli(profile, "ls", "--json").stdout)
    report = run_cli("cost", "--json", timeout=120)
    assert report.returncode == 0, report.stderr
    spend = json.loads(report.stdout)
    settings = load_cloud_settings(profile)
    provider = make_provider("sim", settings.region)
    ctx = CloudContext(settings, provider, Ledger(), CLUSTER, "me", clock=provider.clock)  # type: ignore[attr-defined]
    try:
        guard = BudgetGuard(ctx, 30.0).status()
        frame = SlaveControl(ctx, 30.0).poll()
        now = ctx.clock()
        records = ctx.ledger.instances(cluster=CLUSTER)
        ledger = {r.instance_id: instance_cost(r, now) for r in records}
        prices = {r.instance_id: len(r.prices) for r in records}
    finally:
        ctx.ledger.close()
    (cluster,) = spend["clusters"]
    return {"ls": {i["id"]: i["cost_usd"] for i in listed["instances"] if i["known"]},
            "cost": cluster["total_usd"], "cost_rate": cluster["usd_per_hour"], "cost_total": spend["total_usd"],
            "guard": guard.spent_usd, "dashboard": frame.budget.spent_usd,
            "dashboard_lines": {s.instance_id: s.cost_usd for s in frame.slaves}, "ledger": ledger, "prices": prices}


def assert_one_truth(seen: dict[str, Any], live: list[str]) -> float:
    total = sum(seen["ledger"].values())
    for name in ("cost", "cost_total", "guard", "dashboard"):
        assert seen[name] == pytest.approx(total, abs=1e-6), (name, seen)
    for instance_id in live:
        assert seen["ls"][instance_id] == pytest.approx(seen["ledger"][instance_id], abs=1e-9), seen
        assert seen["dashboard_lines"][instance_id] == pytest.approx(seen["ledger"][instance_id], abs=1e-9), seen
    assert round(seen["cost"], 2) == round(total, 2)  # and so to the cent
    return total


def test_every_view_gives_the_same_cost_for_the_same_fleet(fleet: Any) -> None:
    clock, profile = fleet
    cli(profile, "up", "--count", "2", "--yes", "--no-guard")
    with Ledger() as ledger:
        first = ledger.instances(cluster=CLUSTER)
    ids = [r.instance_id for r in first]
    rate = sum(r.hourly_price for r in first)

    # 11 s in: every view owes the 60 s minimum, and the mean $/h is the price, never above it.
    clock.write_text(repr(T0 + 11))
    seen = views(profile)
    total = assert_one_truth(seen, ids)
    assert total == pytest.approx(rate * 60 / 3600, abs=1e-9)
    assert seen["cost_rate"] == pytest.approx(rate, abs=1e-6)

    # An hour and more later: the spot price is re-read (a new price line); per-second billing.
    clock.write_text(repr(T0 + 3600 + 600))
    views(profile)
    clock.write_text(repr(T0 + 2 * 3600 + 17))
    seen = views(profile)
    assert all(n >= 2 for n in seen["prices"].values()), seen["prices"]  # the price changed over their lives
    assert_one_truth(seen, ids)

    # One is terminated: `cloud down` says what it cost, and the others agree, then and later.
    down = cli(profile, "down", ids[0], "--yes")
    said = re.search(r"their estimated cost: \$([0-9.,]+)", down.stderr)
    assert said, down.stderr
    clock.write_text(repr(T0 + 3 * 3600))
    seen = views(profile)
    assert float(said.group(1).replace(",", "")) == pytest.approx(seen["ledger"][ids[0]], abs=5e-5)
    assert_one_truth(seen, ids[1:])
