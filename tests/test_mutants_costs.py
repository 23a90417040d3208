"""Cost maths and the `gputui cost` report at the edges benchmarks/mutation.py found untested:
zero-length spans, billing without a minimum, the first price's reach, energy gaps, and
which lines a report's cluster and run rows add up."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from gputui.cloud.costs import report
from gputui.cloud.ledger import Ledger
from gputui.model.cloud import (BudgetStatus, CostLine, FleetEntry, InstanceInfo, LaunchAttempt, PricePoint, SpendLine,
                                billed_seconds, budget_status, committed_cost, energy_kwh, hours_left, integrate,
                                metered_cost, price_at)

HOUR = 3600.0
NOW = 1_800_000_000.0
DOLLAR_PER_1000_S = [PricePoint(0, 3.6)]


def test_an_instance_names_its_cluster_and_owner_from_gputuis_tags() -> None:
    tagged = InstanceInfo("i-1", "t", "z", "running", "spot", 0.0, tags={"gputui:cluster": "c", "gputui:owner": "me"})
    assert (tagged.cluster, tagged.owner) == ("c", "me")
    assert (replace(tagged, tags={}).cluster, replace(tagged, tags={}).owner) == (None, None)


def test_an_instance_the_records_do_not_know_is_an_orphan() -> None:
    info = InstanceInfo("i-1", "t", "z", "running", "spot", 0.0)
    assert FleetEntry(info, known=False, usd_per_hour=None, cost_usd=None).orphan
    assert not FleetEntry(info, known=True, usd_per_hour=0.5, cost_usd=0.1).orphan


def test_a_launch_attempt_is_ok_when_it_launched_at_least_one() -> None:
    assert LaunchAttempt("z", "spot", requested=2, launched=1).ok
    assert not LaunchAttempt("z", "spot", requested=2, launched=0).ok


def test_a_zero_budget_is_spent_from_the_start() -> None:
    assert BudgetStatus(0.0, 0.0, 0.0).fraction == float("inf") and BudgetStatus(0.0, 0.0, 0.0).level == "stop"


def test_a_cost_line_lasts_until_its_end_or_until_now() -> None:
    line = CostLine("i-1", "instance", "c", start=100.0, end=400.0, usd_per_hour=1.0, usd=0.1)
    assert line.duration(now=1000.0) == 300.0
    assert replace(line, end=None).duration(now=1000.0) == 900.0
    assert replace(line, end=None).duration(now=50.0) == 0.0  # never negative


def test_a_spend_line_lasts_until_its_end_or_until_now() -> None:
    assert SpendLine("c", "c", 100.0, 400.0, 1.0).duration(now=1000.0) == 300.0
    assert SpendLine("c", "c", 100.0, None, 1.0).duration(now=1000.0) == 900.0
    assert SpendLine("c", "c", 100.0, 100.0, 1.0).duration(now=1000.0) == 0.0


def test_a_spend_lines_rate_is_its_mean_over_its_duration() -> None:
    assert SpendLine("r", "c", 0.0, 1800.0, 1.0).usd_per_hour(now=NOW) == pytest.approx(2.0)
    assert SpendLine("r", "c", 0.0, 0.0, 1.0).usd_per_hour(now=NOW) is None


def test_without_a_minimum_only_started_seconds_are_billed() -> None:
    assert billed_seconds(5.0, 5.0, minimum_s=0) == 0
    assert billed_seconds(5.0, 4.0, minimum_s=0) == 0  # a clock that went back bills nothing
    assert billed_seconds(0.0, 0.5, minimum_s=0) == 1


def test_price_at_needs_a_price() -> None:
    with pytest.raises(ValueError, match="^no prices$"):
        price_at([], 0.0)


def test_the_first_price_also_covers_the_time_before_it() -> None:
    assert integrate([PricePoint(100.0, 3.6)], 0.0, 200.0) == pytest.approx(0.2)


def test_metered_cost_without_prices_is_zero() -> None:
    assert metered_cost(0.0, 100.0, []) == 0.0


def test_metered_and_committed_cost_use_the_given_minimum() -> None:
    assert metered_cost(0.0, 10.0, DOLLAR_PER_1000_S, minimum_s=0) == pytest.approx(0.01)
    assert committed_cost(0.0, 10.0, DOLLAR_PER_1000_S, 30.0, minimum_s=0) == pytest.approx(0.03)
    assert committed_cost(0.0, 10.0, DOLLAR_PER_1000_S, 30.0) == 0.0  # the default 60 s minimum covers it


def test_power_readings_up_to_30_s_apart_are_bridged() -> None:
    assert energy_kwh([(0.0, 100.0), (30.0, 100.0)]) == pytest.approx(3000 / 3.6e6)
    assert energy_kwh([(0.0, 100.0), (30.5, 100.0)]) == 0.0
    assert energy_kwh([(0.0, 100.0), (1.0, 100.0)]) == pytest.approx(100 / 3.6e6)


def test_a_kilowatt_hour_is_3_6_megajoules() -> None:
    assert energy_kwh([(0.0, 1000.0), (3600.0, 1000.0)], max_gap_s=3600) == 1.0


def test_power_readings_are_ordered_by_time_alone() -> None:
    # Out of order, and a missing reading at the same time as a real one: sorted by time only.
    assert energy_kwh([(10.0, 100.0), (0.0, 100.0), (10.0, None)]) == pytest.approx(1000 / 3.6e6)


def test_budget_status_warns_at_80_percent_by_default() -> None:
    assert budget_status(10.0, 7.0, 1.0) == BudgetStatus(10.0, 7.0, 1.0, 0.8)


def test_no_hours_are_left_once_the_budget_is_spent() -> None:
    assert hours_left(10.0, 12.0, 2.0) == 0.0


# -- the report ------------------------------------------------------------------------------
def launch(ledger: Ledger, n: int, cluster: str, launched: float, rate: float, ended: float | None = None) -> None:
    info = InstanceInfo(f"i-{n:017x}", "g4dn.xlarge", "us-east-1a", "running", "spot", launched)
    ledger.record_launch(info, "ec2", "us-east-1", cluster, "me", rate)
    if ended is not None:
        ledger.record_end(info.instance_id, ended, "terminated", "user")


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return Ledger(tmp_path / "l.sqlite3")


def test_a_cluster_ended_before_the_window_is_left_out(ledger: Ledger) -> None:
    launch(ledger, 1, "old", NOW - 3 * HOUR, 0.5, ended=NOW - 2 * HOUR)
    ledger.add_energy("ws/gpu0", "oldlocal", None, NOW - 3 * HOUR, NOW - 2 * HOUR, 0.1, 0.5)
    launch(ledger, 2, "new", NOW - 0.5 * HOUR, 0.5)
    clusters, _runs = report(ledger, NOW, since=NOW - HOUR)
    assert [c.name for c in clusters] == ["new"]


def test_a_cluster_row_spans_its_first_start_to_its_last_end(ledger: Ledger) -> None:
    launch(ledger, 1, "c", NOW - 3 * HOUR, 0.5, ended=NOW - 2 * HOUR)
    launch(ledger, 2, "c", NOW - 2.5 * HOUR, 0.5, ended=NOW - HOUR)
    ledger.add_energy("ws/gpu0", "c", None, NOW - 5 * HOUR, NOW - 4.5 * HOUR, 0.05, 0.5)  # the master's GPU
    (row,), _runs = report(ledger, NOW)
    assert (row.start, row.end, row.running) == (NOW - 5 * HOUR, NOW - HOUR, 0)
    assert row.energy_kwh == pytest.approx(0.05)  # instances add no energy


def test_a_cluster_with_one_slave_up_is_still_going(ledger: Ledger) -> None:
    launch(ledger, 1, "c", NOW - 3 * HOUR, 0.5)
    launch(ledger, 2, "c", NOW - 2 * HOUR, 0.5, ended=NOW - HOUR)
    (row,), _runs = report(ledger, NOW)
    assert row.running == 1 and row.end is None


def test_a_local_clusters_row_adds_its_energy_lines(ledger: Ledger) -> None:
    ledger.add_energy("ws/gpu0", "local", None, NOW - 3 * HOUR, NOW - 2 * HOUR, 0.1, 0.5)
    ledger.add_energy("ws/gpu0", "local", None, NOW - 2 * HOUR, NOW - HOUR, 0.2, 0.5)
    (row,), _runs = report(ledger, NOW)
    assert (row.start, row.end, row.running) == (NOW - 3 * HOUR, NOW - HOUR, 0)
    assert row.energy_kwh == pytest.approx(0.3) and row.usd == pytest.approx(0.15)


def test_energy_is_cut_to_the_window(ledger: Ledger) -> None:
    ledger.add_energy("ws/gpu0", "local", None, NOW - 3 * HOUR, NOW - 2 * HOUR, 0.1, 0.5)
    ledger.add_energy("ws/gpu0", "local", None, NOW - 2 * HOUR, NOW - HOUR, 0.2, 0.5)
    (row,), _runs = report(ledger, NOW, since=NOW - 1.5 * HOUR)
    assert row.start == NOW - 1.5 * HOUR
    assert row.energy_kwh == pytest.approx(0.1)  # half of the second line


def test_a_run_row_adds_its_own_energy_inside_its_span(ledger: Ledger) -> None:
    ledger.start_run("r1", "local", NOW - 3 * HOUR)
    ledger.end_run("r1", NOW - 1.5 * HOUR, "done")
    ledger.add_energy("ws/gpu0", "local", "r1", NOW - 3 * HOUR, NOW - 2 * HOUR, 0.1, 0.5)
    ledger.add_energy("ws/gpu0", "local", "r1", NOW - 2 * HOUR, NOW - HOUR, 0.2, 0.5)  # half inside the run
    ledger.add_energy("ws/gpu1", "local", "r2", NOW - 2.5 * HOUR, NOW - 1.5 * HOUR, 1.0, 0.5)  # another run's
    _clusters, runs = report(ledger, NOW)
    (r1,) = [r for r in runs if r.name == "r1"]
    assert (r1.cluster, r1.start, r1.end) == ("local", NOW - 3 * HOUR, NOW - 1.5 * HOUR)
    assert r1.energy_kwh == pytest.approx(0.2) and r1.usd == pytest.approx(0.1)


def test_an_instantaneous_energy_line_counts_whole_inside_a_runs_span_ends_included(ledger: Ledger) -> None:
    ledger.start_run("r", "local", NOW - 3 * HOUR)
    ledger.end_run("r", NOW - 2 * HOUR, "done")
    for when, kwh in ((NOW - 3 * HOUR, 0.01), (NOW - 2.5 * HOUR, 0.02), (NOW - 2 * HOUR, 0.04), (NOW - HOUR, 0.08)):
        ledger.add_energy("ws/gpu0", "local", "r", when, when, kwh, 1.0)
    ledger.add_energy("ws/gpu0", "local", "r", NOW - 1.5 * HOUR, NOW - HOUR, 0.16, 1.0)  # after the run
    _clusters, (run,) = report(ledger, NOW)
    assert run.energy_kwh == pytest.approx(0.07)
