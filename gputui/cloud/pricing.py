"""Prices, kept apart from instance lifecycle: spot prices from the provider, on-demand
list prices from a small dated table (the profile's `on_demand_price` overrides it).
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Protocol, Sequence

from gputui.model.cloud import PriceQuote

# On-demand Linux list prices in $/h, us-east-1, as published by AWS on this date.
# Other regions differ by roughly 0-30%: set `on_demand_price` in [cloud] to be exact.
ON_DEMAND_DATE = "2024-06-01"
ON_DEMAND_REGION = "us-east-1"
ON_DEMAND_USD: dict[str, float] = {
    "g4dn.xlarge": 0.526, "g4dn.2xlarge": 0.752, "g4dn.4xlarge": 1.204, "g4dn.8xlarge": 2.176,
    "g4dn.12xlarge": 3.912, "g4dn.16xlarge": 4.352, "g4dn.metal": 7.824,
    "g5.xlarge": 1.006, "g5.2xlarge": 1.212, "g5.4xlarge": 1.624, "g5.8xlarge": 2.448,
    "g5.12xlarge": 5.672, "g5.16xlarge": 4.096, "g5.24xlarge": 8.144, "g5.48xlarge": 16.288,
    "g6.xlarge": 0.8048, "g6.2xlarge": 0.9776, "g6.4xlarge": 1.3232, "g6.8xlarge": 2.0144,
    "g6.12xlarge": 4.6016, "g6.48xlarge": 13.3504,
    "p3.2xlarge": 3.06, "p3.8xlarge": 12.24, "p3.16xlarge": 24.48,
    "p4d.24xlarge": 32.7726,
}


class PriceSource(Protocol):
    """Where spot prices come from: a provider, or a fixed table in tests."""

    def spot_prices(self, instance_type: str, zones: Sequence[str]) -> dict[str, float]: ...


def on_demand_price(instance_type: str, override: float | None = None) -> float | None:
    """The on-demand $/h: the profile's override, else the table, else None."""
    return override if override is not None else ON_DEMAND_USD.get(instance_type)


def on_demand_label(region: str, override: float | None) -> str:
    """Where the on-demand figure comes from, for table headers."""
    if override is not None:
        return "on-demand (profile)"
    where = "" if region == ON_DEMAND_REGION else f" {ON_DEMAND_REGION}"
    return f"on-demand{where} (list {ON_DEMAND_DATE})"


def quotes(source: PriceSource, instance_type: str, zones: Sequence[str], on_demand: float | None) -> list[PriceQuote]:
    """One quote per zone (spot may be None), cheapest spot first."""
    spot = source.spot_prices(instance_type, zones)
    out = [PriceQuote(instance_type, zone, spot.get(zone), on_demand) for zone in (zones or sorted(spot))]
    return sorted(out, key=lambda q: (q.spot is None, q.spot or 0.0, q.zone))


def launch_rate(quote: PriceQuote | None, lifecycle: str, max_price: float | None) -> float | None:
    """The $/h to meter a new instance at: the zone's spot price (at most max_price), or on-demand.

    With no spot price known, the dearest it may cost is used (max_price, else on-demand):
    an estimate that errs high keeps the budget safe.
    """
    if lifecycle == "on-demand":
        return quote.on_demand if quote else None
    if quote is not None and quote.spot is not None:
        return quote.spot if max_price is None else min(quote.spot, max_price)
    if max_price is not None:
        return max_price
    return quote.on_demand if quote else None


class PriceBook:
    """Current spot prices per (type, zone), re-read when older than `max_age_s` (at most hourly).

    Thread-safe: a UI worker and the budget guard may share one.
    """

    def __init__(self, source: PriceSource, max_age_s: float = 3600.0, clock: Callable[[], float] = time.time) -> None:
        self.source = source
        self.max_age_s = min(max_age_s, 3600.0)
        self.clock = clock
        self._cache: dict[tuple[str, str], tuple[float, float | None]] = {}
        self._lock = threading.Lock()

    def stale(self, instance_type: str, zone: str) -> bool:
        with self._lock:
            entry = self._cache.get((instance_type, zone))
        return entry is None or self.clock() - entry[0] >= self.max_age_s

    def spot(self, instance_type: str, zone: str) -> float | None:
        """The spot price in force, from the cache while fresh."""
        if self.stale(instance_type, zone):
            prices = self.source.spot_prices(instance_type, [zone])
            with self._lock:
                self._cache[(instance_type, zone)] = (self.clock(), prices.get(zone))
        with self._lock:
            return self._cache[(instance_type, zone)][1]
