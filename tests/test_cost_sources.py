"""Every recorded price names its source: launches, price changes and adopted orphans write
it to the ledger (schema 2, migrated in place from 1), and `gputui cost` shows it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from gputui.cli import main
from gputui.cloud.ledger import SCHEMA_VERSION, Ledger
from gputui.cloud.lifecycle import launch, plan_launch, terminate
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import SourcedPrice
from gputui.cloud.provider import LaunchRequest, instance_tags
from gputui.cloud.settings import CloudSettings
from gputui.cloud.sim import SimProvider, SimScript
from gputui.model.cloud import InstanceInfo

from .moto_fixture import public_key_line

T0 = 1_800_000_000.0
API = "api 2026-11-25"

# The schema as gputui wrote it before prices named their source (version 1).
SCHEMA_1 = """
CREATE TABLE instances (
    id TEXT PRIMARY KEY, provider TEXT NOT NULL, region TEXT NOT NULL, cluster TEXT NOT NULL, owner TEXT,
    type TEXT NOT NULL, zone TEXT NOT NULL, lifecycle TEXT NOT NULL, hourly_price REAL NOT NULL,
    launched REAL NOT NULL, terminated REAL, state TEXT NOT NULL, ended_by TEXT, address TEXT
);
CREATE TABLE cost_lines (
    id INTEGER PRIMARY KEY, kind TEXT NOT NULL CHECK (kind IN ('instance', 'energy')),
    subject TEXT NOT NULL, cluster TEXT NOT NULL, run_id TEXT,
    start REAL NOT NULL, "end" REAL, rate REAL NOT NULL, quantity REAL
);
CREATE INDEX cost_lines_subject ON cost_lines (subject, start);
CREATE TABLE runs (id TEXT PRIMARY KEY, cluster TEXT NOT NULL, started REAL NOT NULL, ended REAL, status TEXT);
CREATE TABLE events (
    id INTEGER PRIMARY KEY, time REAL NOT NULL, kind TEXT NOT NULL, instance_id TEXT, cluster TEXT, message TEXT NOT NULL
);
"""


class ApiPricedSim(SimProvider):
    """The simulated cloud with a Pricing API that answers (its region's price differs from the table's)."""

    def on_demand_price(self, instance_type: str) -> SourcedPrice | None:
        return SourcedPrice(1.23, API)


def info(n: int, launched: float, lifecycle: str = "spot") -> InstanceInfo:
    return InstanceInfo(f"i-{n:017x}", "g4dn.xlarge", "us-east-1a", "running", lifecycle, launched)


def columns(path: Path, table: str) -> set[str]:
    raw = sqlite3.connect(path)
    try:
        return {row[1] for row in raw.execute(f"PRAGMA table_info({table})")}
    finally:
        raw.close()


def test_a_schema_1_ledger_gains_the_source_columns_and_keeps_its_lines(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    raw = sqlite3.connect(path)
    raw.executescript(SCHEMA_1)
    raw.execute("INSERT INTO instances VALUES ('i-old', 'ec2', 'us-east-1', 'c', 'me', 'g4dn.xlarge', 'us-east-1a', "
                "'spot', 0.3, 100.0, NULL, 'running', NULL, NULL)")
    raw.execute("INSERT INTO cost_lines (kind, subject, cluster, start, rate) VALUES ('instance', 'i-old', 'c', 100.0, 0.3)")
    raw.execute("PRAGMA user_version = 1")
    raw.commit()
    raw.close()
    for _ in range(2):  # the second open finds the columns there and leaves them alone
        with Ledger(path) as ledger:
            assert ledger.schema_version() == SCHEMA_VERSION
    assert "price_source" in columns(path, "instances") and {"price_source", "method"} <= columns(path, "cost_lines")
    with Ledger(path) as ledger:
        (old,) = ledger.instances()
        assert old.hourly_price == 0.3 and getattr(old.hourly_price, "source", None) is None
        assert ledger.price_sources() == {"c": ["not recorded"]}
        ledger.set_price("i-old", 200.0, SourcedPrice(0.35, "sim"))
        (old,) = ledger.instances()
        assert [getattr(p.usd_per_hour, "source", None) for p in old.prices] == [None, "sim"]
        assert ledger.price_sources() == {"c": ["not recorded", "sim"]}


def test_launch_and_price_lines_record_where_each_rate_came_from(tmp_path: Path) -> None:
    with Ledger(tmp_path / "l.sqlite3") as ledger:
        ledger.record_launch(info(1, 100.0), "ec2", "us-east-1", "c", "me", SourcedPrice(0.3, API))
        ledger.record_launch(info(2, 100.0, "on-demand"), "ec2", "us-east-1", "c", "me", 0.526,
                             price_source="table 2024-06-01")
        assert ledger.set_price(info(1, 0).instance_id, 300.0, 0.45, price_source="api 2026-11-26")
        one, two = ledger.instances()
        assert [(p.usd_per_hour, p.usd_per_hour.source) for p in one.prices] == [(0.3, API), (0.45, "api 2026-11-26")]  # type: ignore[attr-defined]
        assert one.hourly_price.source == "api 2026-11-26"  # type: ignore[attr-defined]
        assert two.hourly_price.source == "table 2024-06-01"  # type: ignore[attr-defined]
        assert ledger.price_sources() == {"c": [API, "table 2024-06-01", "api 2026-11-26"]}
        assert ledger.price_sources(since=400.0) == {"c": ["table 2024-06-01", "api 2026-11-26"]}  # the first line ended at 300


def sim_context(tmp_path: Path) -> CloudContext:
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    settings = CloudSettings(budget_usd=10.0, zones=("us-east-1a",), ssh_cidr="198.51.100.7/32", public_key=str(key),
                             source=tmp_path / "p.toml")
    provider = ApiPricedSim(script=SimScript(seed=3, launch_delay_s=0, shutdown_delay_s=0), clock=lambda: T0)
    return CloudContext(settings, provider, Ledger(tmp_path / "l.sqlite3"), "c1", "me", clock=lambda: T0,
                        sleep=lambda s: None)


def test_a_spot_launch_records_the_spot_source_and_the_plan_the_regions_on_demand(tmp_path: Path) -> None:
    ctx = sim_context(tmp_path)
    plan = plan_launch(ctx, 1)
    assert [(q.on_demand, q.on_demand_source) for q in plan.quotes] == [(1.23, API)]
    (started,) = launch(ctx, plan).instances
    rec = ctx.ledger.get(started.instance_id)
    assert rec is not None and rec.hourly_price.source == "sim"  # type: ignore[attr-defined]
    assert any(e.kind == "launched" and "(sim)" in e.message for e in ctx.ledger.events())


def test_an_on_demand_orphan_is_metered_at_the_regions_price_with_its_source(tmp_path: Path) -> None:
    ctx = sim_context(tmp_path)
    (orphan,) = ctx.provider.launch(LaunchRequest("g4dn.xlarge", 1, "us-east-1a", "on-demand", "ami-1", "k", "sg",
                                                  tags=instance_tags("lost", "me")))
    terminate(ctx, [orphan], ended_by="sweep")
    rec = ctx.ledger.get(orphan.instance_id)
    assert rec is not None and rec.ended_by == "sweep"
    assert rec.hourly_price == 1.23 and rec.hourly_price.source == API  # type: ignore[attr-defined]  # not the table's 0.526


def test_cost_prints_the_sources_beside_the_rate(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    now = time.time()
    with Ledger() as ledger:
        ledger.record_launch(info(1, now - 600), "ec2", "eu-west-1", "lab", "me", SourcedPrice(0.3, API))
        ledger.record_launch(info(2, now - 600, "on-demand"), "ec2", "eu-west-1", "lab", "me",
                             SourcedPrice(0.526, "table 2024-06-01"))
    assert main(["cost"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.strip("│ ").startswith("lab"))
    assert "prices from" in out and f"{API}, table 2024-06-01" in row
    assert main(["cost", "--json"]) == 0
    (cluster,) = json.loads(capsys.readouterr().out)["clusters"]
    assert cluster["price_sources"] == [API, "table 2024-06-01"]
