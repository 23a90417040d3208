"""Prices, kept apart from instance lifecycle: spot prices from the provider, on-demand
prices from the AWS Pricing API (cached for a day), with a small dated table as the
offline fallback (the profile's `on_demand_price` overrides both).

Every on-demand figure says where it came from and when: "api 2026-11-25" (the Pricing
API, asked that day, UTC), "table 2024-06-01" (the shipped us-east-1 list) or "profile".
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from gputui.cloud.redact import redact
from gputui.model.cloud import PriceQuote
from gputui.model.outside import number

# On-demand Linux list prices in $/h, us-east-1, as published by AWS on this date: the
# fallback when the Pricing API cannot be asked. Other regions differ by roughly 0-30%.
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
TABLE_SOURCE = f"table {ON_DEMAND_DATE}"
PROFILE_SOURCE = "profile"
CACHE_MAX_AGE_S = 86400.0  # Pricing API answers are kept a day
RETRY_AFTER_S = 3600.0  # a process that could not ask the API tries again after an hour


class SourcedPrice(float):
    """A $/h that says where it came from ("api 2026-11-25", "table 2024-06-01", "profile").

    A float, so code that only needs the number keeps working (arithmetic drops the source);
    `note` says why a fallback was used.
    """

    __slots__ = ("source", "note")
    source: str
    note: str

    def __new__(cls, usd: float, source: str, note: str = "") -> "SourcedPrice":
        self = super().__new__(cls, usd)
        self.source = source
        self.note = note
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        return (SourcedPrice, (float(self), self.source, self.note))


def api_source(when: float) -> str:
    """The source label of a price the AWS API gave at `when` (its UTC date)."""
    return "api " + time.strftime("%Y-%m-%d", time.gmtime(when))


def table_price(instance_type: str, note: str = "") -> SourcedPrice | None:
    """The shipped table's us-east-1 price, or None for a type it does not list."""
    usd = ON_DEMAND_USD.get(instance_type)
    return None if usd is None else SourcedPrice(usd, TABLE_SOURCE, note)


class PriceSource(Protocol):
    """Where spot prices come from: a provider, or a fixed table in tests."""

    def spot_prices(self, instance_type: str, zones: Sequence[str]) -> dict[str, float]: ...


@runtime_checkable
class ListPriceSource(Protocol):
    """A price source that also knows on-demand prices and names its sources (the providers do)."""

    def on_demand_price(self, instance_type: str) -> SourcedPrice | None:
        """The region's on-demand $/h with its source (the table when the cloud cannot say), or None."""

    def spot_source(self) -> str:
        """Where the spot prices come from now, e.g. "api 2026-11-25" or "sim"."""


def on_demand_price(instance_type: str, override: float | None = None) -> SourcedPrice | None:
    """The on-demand $/h without asking any cloud: the profile's override, else the table, else None.

    `quotes` replaces a table figure with the price source's own (the Pricing API's).
    """
    if override is not None:
        return SourcedPrice(override, PROFILE_SOURCE)
    return table_price(instance_type)


def resolve_on_demand(source: object, instance_type: str, given: float | None) -> float | None:
    """The on-demand $/h to quote, a SourcedPrice where its source is known.

    A profile override (or any plain number a caller gives) stands; a table figure, or
    none, is replaced by what a ListPriceSource says (the table again when it cannot say).
    """
    from_table = given is None or (isinstance(given, SourcedPrice) and given.source == TABLE_SOURCE)
    if from_table and isinstance(source, ListPriceSource):
        found = source.on_demand_price(instance_type)
        if found is not None:
            return found
    return given


def on_demand_note(price: float | None, region: str) -> str | None:
    """A line for whoever reads an on-demand figure that is not the region's fresh API price."""
    if price is None:
        return "no on-demand price known here: set on_demand_price in [cloud]"
    source, note = getattr(price, "source", None), getattr(price, "note", "")
    why = f" ({note})" if note else ""
    if source == TABLE_SOURCE:
        differs = "" if region == ON_DEMAND_REGION else f"; {region} may differ by up to 30%"
        return (f"on-demand: gputui's {ON_DEMAND_REGION} list of {ON_DEMAND_DATE}{why}{differs}; "
                "set on_demand_price in [cloud] to be exact")
    if note:
        return f"on-demand: the Pricing API's last answer, {source}{why}"
    return None


def quotes(source: PriceSource, instance_type: str, zones: Sequence[str], on_demand: float | None) -> list[PriceQuote]:
    """One quote per zone (spot may be None), cheapest spot first, each naming its sources."""
    spot = source.spot_prices(instance_type, zones)
    resolved = resolve_on_demand(source, instance_type, on_demand)
    usd = None if resolved is None else float(resolved)
    od_source = getattr(resolved, "source", None)
    spot_source = source.spot_source() if isinstance(source, ListPriceSource) else None
    out = [PriceQuote(instance_type, zone, spot.get(zone), usd, od_source, spot_source) for zone in (zones or sorted(spot))]
    return sorted(out, key=lambda q: (q.spot is None, q.spot or 0.0, q.zone))


def launch_price(quote: PriceQuote | None, lifecycle: str, max_price: float | None) -> tuple[float | None, str | None]:
    """`launch_rate` with the source of the figure ("max_price" when the cap decides)."""
    if lifecycle == "on-demand":
        return (quote.on_demand, quote.on_demand_source) if quote else (None, None)
    if quote is not None and quote.spot is not None:
        if max_price is not None and max_price < quote.spot:
            return max_price, "max_price"
        return quote.spot, quote.spot_source
    if max_price is not None:
        return max_price, "max_price"
    return (quote.on_demand, quote.on_demand_source) if quote else (None, None)


def launch_rate(quote: PriceQuote | None, lifecycle: str, max_price: float | None) -> float | None:
    """The $/h to meter a new instance at: the zone's spot price (at most max_price), or on-demand.

    With no spot price known, the dearest it may cost is used (max_price, else on-demand):
    an estimate that errs high keeps the budget safe.
    """
    return launch_price(quote, lifecycle, max_price)[0]


def cache_home() -> Path:
    """gputui's cache directory (paths.cache_home: user_cache_dir, or GPUTUI_HOME/cache when set)."""
    from gputui.model.paths import cache_home as home

    return home()


def price_cache_path() -> Path:
    return cache_home() / "on-demand-prices.json"


def _positive(value: object) -> float | None:
    """A finite number > 0 from JSON, else None."""
    found = number(value)
    return found if found is not None and found > 0 else None


def _read_cache(path: Path) -> dict[str, dict[str, tuple[float, float]]]:
    """{region: {type: (usd, fetched)}}; anything unreadable or malformed counts as absent."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    regions = raw.get("prices") if isinstance(raw, dict) else None
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for region, types in regions.items() if isinstance(regions, dict) else ():
        for instance_type, entry in types.items() if isinstance(types, dict) else ():
            usd, fetched = (_positive(entry.get(k)) for k in ("usd", "fetched")) if isinstance(entry, dict) else (None, None)
            if usd is not None and fetched is not None:
                out.setdefault(str(region), {})[str(instance_type)] = (usd, fetched)
    return out


def _write_cache(path: Path, prices: dict[str, dict[str, tuple[float, float]]]) -> None:
    """Replace the cache file in one step; a cache that cannot be written is no error."""
    body = {"version": 1, "prices": {region: {t: {"usd": usd, "fetched": fetched} for t, (usd, fetched) in sorted(types.items())}
                                     for region, types in sorted(prices.items())}}
    tmp: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".on-demand-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(body, fh, indent=1)
        os.replace(tmp, path)
    except OSError:
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


class OnDemandBook:
    """On-demand $/h for one region from the cloud's price API, cached a day in a file.

    `fetch(instance_type)` asks the API (None: no such product there). When it fails (no
    network, no permission, anything) the last API answer is used however old, else the
    table: a price lookup never stops a command. Thread-safe.
    """

    def __init__(self, region: str, fetch: Callable[[str], float | None], path: Path | None = None,
                 clock: Callable[[], float] = time.time, max_age_s: float = CACHE_MAX_AGE_S) -> None:
        self.region = region
        self.fetch = fetch
        self.path = path
        self.clock = clock
        self.max_age_s = max_age_s
        self._memo: dict[str, tuple[float, SourcedPrice | None]] = {}  # type -> (until, price)
        self._lock = threading.Lock()

    def _cache_path(self) -> Path:
        return self.path if self.path is not None else price_cache_path()

    def price(self, instance_type: str) -> SourcedPrice | None:
        with self._lock:
            now = self.clock()
            memo = self._memo.get(instance_type)
            if memo is not None and now < memo[0]:
                return memo[1]
            path = self._cache_path()
            cached = _read_cache(path)
            usd_fetched = cached.get(self.region, {}).get(instance_type)
            if usd_fetched is not None and 0 <= now - usd_fetched[1] < self.max_age_s:
                found: SourcedPrice | None = SourcedPrice(usd_fetched[0], api_source(usd_fetched[1]))
                self._memo[instance_type] = (usd_fetched[1] + self.max_age_s, found)
                return found
            try:
                usd = self.fetch(instance_type)
            except Exception as exc:  # noqa: BLE001 - pricing must never stop a command
                note = f"the AWS Pricing API did not answer ({redact(' '.join(str(exc).split()))[:200]})"
                if usd_fetched is not None:  # an older API answer for this region beats the us-east-1 table
                    found = SourcedPrice(usd_fetched[0], api_source(usd_fetched[1]), note)
                else:
                    found = table_price(instance_type, note)
                self._memo[instance_type] = (now + RETRY_AFTER_S, found)
                return found
            if usd is None or not math.isfinite(usd) or usd <= 0:
                found = table_price(instance_type, f"the AWS Pricing API lists no Linux on-demand {instance_type} "
                                                   f"in {self.region}")
                self._memo[instance_type] = (now + RETRY_AFTER_S, found)
                return found
            cached.setdefault(self.region, {})[instance_type] = (float(usd), now)
            _write_cache(path, cached)
            found = SourcedPrice(usd, api_source(now))
            self._memo[instance_type] = (now + self.max_age_s, found)
            return found


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
