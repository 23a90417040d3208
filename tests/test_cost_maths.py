"""Cost maths: per-second billing, the 60 s minimum, price changes, energy, budget levels."""

from __future__ import annotations

import pytest

from gputui.cloud.pricing import PriceBook, launch_rate, on_demand_note, on_demand_price, quotes
from gputui.model.cloud import (BudgetStatus, InstanceRecord, PricePoint, PriceQuote, billed_seconds, committed_cost,
                                energy_kwh, hours_left, integrate, metered_cost, price_at, projection)

HOUR = 3600.0


def test_billing_is_per_second_with_a_sixty_second_minimum() -> None:
    assert billed_seconds(0, 0) == 60
    assert billed_seconds(0, 59.2) == 60
    assert billed_seconds(0, 60) == 60
    assert billed_seconds(0, 60.1) == 61  # a started second is billed whole
    assert billed_seconds(100, 3700) == 3600
    prices = [PricePoint(0, 0.36)]
    assert metered_cost(0, 10, prices) == pytest.approx(0.36 / 60)  # one minute
    assert metered_cost(0, HOUR, prices) == pytest.approx(0.36)
    assert metered_cost(0, 90.5, prices) == pytest.approx(0.36 * 91 / HOUR)


def test_price_changes_mid_run_are_charged_from_when_they_apply() -> None:
    prices = [PricePoint(0, 0.30), PricePoint(HOUR, 0.60), PricePoint(2 * HOUR, 0.15)]
    assert price_at(prices, -5) == 0.30 and price_at(prices, HOUR) == 0.60 and price_at(prices, 3 * HOUR) == 0.15
    assert metered_cost(0, 3 * HOUR, prices) == pytest.approx(0.30 + 0.60 + 0.15)
    assert metered_cost(0, 1.5 * HOUR, prices) == pytest.approx(0.30 + 0.30)
    # Launched just before a price change: the minimum spans it, each second at its own price.
    assert metered_cost(HOUR - 30, HOUR - 20, prices) == pytest.approx((30 * 0.30 + 30 * 0.60) / HOUR)
    # Unordered points give the same answer.
    assert integrate(list(reversed(prices)), 0, 3 * HOUR) == pytest.approx(1.05)


def test_a_window_keeps_only_the_part_inside_it() -> None:
    prices = [PricePoint(0, 1.0)]
    assert metered_cost(0, 10 * HOUR, prices, window=(8 * HOUR, 20 * HOUR)) == pytest.approx(2.0)
    assert metered_cost(0, 10 * HOUR, prices, window=(11 * HOUR, 20 * HOUR)) == 0.0


def test_committed_cost_is_what_the_next_interval_adds() -> None:
    prices = [PricePoint(0, 3.6)]  # a dollar-per-1000-seconds
    assert committed_cost(0, 0, prices, 30) == 0  # inside the minimum: already billed
    assert committed_cost(0, 45, prices, 30) == pytest.approx(15 * 3.6 / HOUR)
    assert committed_cost(0, 600, prices, 30) == pytest.approx(30 * 3.6 / HOUR)


def test_energy_integrates_power_over_time_and_skips_gaps_and_missing_readings() -> None:
    # 300 W for an hour = 0.3 kWh.
    steady = [(t, 300.0) for t in range(0, 3601, 5)]
    assert energy_kwh(steady) == pytest.approx(0.3)
    # A ramp 0 -> 600 W over an hour: the trapezoid gives the mean, 300 W.
    ramp = [(t, t / 6.0) for t in range(0, 3601, 10)]
    assert energy_kwh(ramp) == pytest.approx(0.3)
    # A missing reading or a gap over 30 s is not bridged.
    assert energy_kwh([(0, 100.0), (10, None), (20, 100.0), (30, 100.0)]) == pytest.approx(1000 / 3.6e6)
    assert energy_kwh([(0, 100.0), (10, 100.0), (100, 100.0), (110, 100.0)]) == pytest.approx(2000 / 3.6e6)
    assert energy_kwh([]) == 0.0


def test_budget_levels() -> None:
    assert BudgetStatus(10, 5, 2).level == "ok"
    assert BudgetStatus(10, 7, 1).level == "warn"
    assert BudgetStatus(10, 9.5, 0.5).level == "stop"
    assert BudgetStatus(10, 9.5, 0.5).fraction == pytest.approx(1.0)
    assert projection(2.0, 0.5, 4) == 4.0
    assert hours_left(10, 4, 2) == 3.0 and hours_left(10, 4, 0) is None


def test_quotes_and_launch_rates() -> None:
    class Source:
        def spot_prices(self, instance_type: str, zones: object) -> dict[str, float]:
            return {"z-b": 0.20, "z-a": 0.25}

    found = quotes(Source(), "g4dn.xlarge", ["z-a", "z-b", "z-c"], on_demand_price("g4dn.xlarge"))
    assert [q.zone for q in found] == ["z-b", "z-a", "z-c"]  # cheapest first, unpriced last
    assert found[0].saving == pytest.approx(1 - 0.20 / 0.526)
    assert found[2].spot is None and found[2].saving is None
    assert launch_rate(found[0], "spot", None) == 0.20
    assert launch_rate(found[0], "spot", 0.18) == 0.18  # never above max_price
    assert launch_rate(found[2], "spot", 0.3) == 0.3  # unknown spot price: the dearest it may cost
    assert launch_rate(found[2], "spot", None) == 0.526
    assert launch_rate(found[2], "on-demand", None) == 0.526
    assert on_demand_price("x9.huge") is None and on_demand_price("x9.huge", 1.5) == 1.5
    assert on_demand_price("g4dn.xlarge").source == "table 2024-06-01" and on_demand_price("x9.huge", 1.5).source == "profile"
    assert "eu-west-1 may differ" in on_demand_note(on_demand_price("g4dn.xlarge"), "eu-west-1")
    assert on_demand_note(on_demand_price("x9.huge", 1.5), "eu-west-1") is None
    assert PriceQuote("t", "z", 0.1, None).saving is None


def test_price_book_rereads_at_least_hourly() -> None:
    now = [0.0]
    reads: list[float] = []

    class Source:
        def spot_prices(self, instance_type: str, zones: object) -> dict[str, float]:
            reads.append(now[0])
            return {"z": 0.1 + len(reads) / 100}

    book = PriceBook(Source(), max_age_s=7200, clock=lambda: now[0])  # asked for 2 h, capped at 1 h
    assert book.spot("t", "z") == pytest.approx(0.11)
    now[0] = 3599
    assert book.spot("t", "z") == pytest.approx(0.11) and reads == [0.0]
    now[0] = 3600
    assert book.spot("t", "z") == pytest.approx(0.12) and reads == [0.0, 3600]


def test_instance_record_cost_uses_its_price_lines() -> None:
    record = InstanceRecord("i-1", "sim", "r", "c", None, "t", "z", "spot", 0.6, 0.0, None, "running", None, None,
                            (PricePoint(0, 0.3), PricePoint(HOUR, 0.6)))
    assert record.cost(2 * HOUR) == pytest.approx(0.9)
    ended = InstanceRecord("i-2", "sim", "r", "c", None, "t", "z", "spot", 0.3, 0.0, 10.0, "terminated", "user", None, ())
    assert ended.cost(99 * HOUR) == pytest.approx(0.3 / 60)  # fell back to hourly_price; the minimum applies
