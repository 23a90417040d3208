"""Cloud records and cost maths: frozen dataclasses and pure functions, no I/O.

The cloud layer (gputui.cloud) produces these records; the command line and the
dashboard draw them (a cost panel: spent, $/h, projection, budget gauge, one line per
slave). Times are Unix seconds, prices US dollars per hour, energy kWh.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

BILLING_MINIMUM_S = 60.0  # EC2 Linux: per-second billing with a 60-second minimum
LIVE_STATES = ("pending", "running", "stopping", "stopped")
ENDED_STATES = ("shutting-down", "terminated")
SPOT_TERMINATION_CODES = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")


@dataclass(frozen=True)
class InstanceInfo:
    """One instance as a provider reports it."""

    instance_id: str
    instance_type: str
    zone: str
    state: str  # pending, running, shutting-down, terminated, stopping, stopped
    lifecycle: str  # "spot" or "on-demand"
    launched: float
    public_ip: str | None = None
    state_reason: str | None = None  # e.g. "Server.SpotInstanceTermination"
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def interrupted(self) -> bool:
        """Ended by the spot market (capacity reclaimed or price), not by anyone's choice."""
        return self.state in ENDED_STATES and (self.state_reason or "") in SPOT_TERMINATION_CODES

    @property
    def cluster(self) -> str | None:
        return self.tags.get("gputui:cluster")

    @property
    def owner(self) -> str | None:
        return self.tags.get("gputui:owner")


@dataclass(frozen=True)
class PriceQuote:
    """What an instance type costs in one zone: the current spot price next to on-demand."""

    instance_type: str
    zone: str
    spot: float | None  # None: no spot price known for this zone
    on_demand: float | None  # None: not from the Pricing API, not in the list-price table, not set in the profile
    # Where each figure came from and when: "api 2026-11-25" (AWS's API, asked that day, UTC),
    # "table 2024-06-01" (gputui's us-east-1 list), "profile", "sim"; None: not said (a test's source)
    on_demand_source: str | None = None
    spot_source: str | None = None

    @property
    def saving(self) -> float | None:
        """The fraction saved by spot (0.7 = 70% cheaper), or None when not comparable."""
        if self.spot is None or not self.on_demand:
            return None
        return 1.0 - self.spot / self.on_demand


@dataclass(frozen=True)
class PricePoint:
    """An hourly price in force from `since` until the next point."""

    since: float
    usd_per_hour: float


@dataclass(frozen=True)
class LaunchAttempt:
    """One try at launching: where, which market, and how it went."""

    zone: str
    lifecycle: str
    requested: int
    launched: int
    error_code: str | None = None
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.launched > 0


@dataclass(frozen=True)
class CloudEvent:
    """Something that happened to the cloud side, for the log, the ledger and the UI."""

    time: float
    kind: str  # launched, running, terminated, interrupted, vanished, orphan, price, budget_warning, budget_stop
    message: str
    instance_id: str | None = None
    cluster: str | None = None


@dataclass(frozen=True)
class CostLine:
    """The estimated cost of one subject (an instance or a local GPU) over a span."""

    subject: str  # instance id, or "host/gpuN" for local energy
    kind: str  # "instance" or "energy"
    cluster: str
    start: float
    end: float | None  # None: still accruing
    usd_per_hour: float  # the rate in force now (instances) or the mean rate (energy)
    usd: float
    estimate: bool = True

    def duration(self, now: float) -> float:
        return max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass(frozen=True)
class InstanceRecord:
    """An instance as the ledger remembers it: who launched it, what it cost, how it ended."""

    instance_id: str
    provider: str
    region: str
    cluster: str
    owner: str | None
    instance_type: str
    zone: str
    lifecycle: str
    hourly_price: float  # the rate in force now (or at the end)
    launched: float
    terminated: float | None
    state: str
    ended_by: str | None  # user, budget, interrupted, sweep, external, vanished, run-end, or self:<reason> (lease, budget, idle, max_hours: the slave's watchdog); None while up
    address: str | None
    prices: tuple[PricePoint, ...] = ()

    @property
    def running(self) -> bool:
        return self.terminated is None

    def cost(self, now: float, window: tuple[float, float] | None = None) -> float:
        """Estimated cost so far (or in total once ended)."""
        until = self.terminated if self.terminated is not None else now
        prices = self.prices or (PricePoint(self.launched, self.hourly_price),)
        return metered_cost(self.launched, until, prices, window=window)


@dataclass(frozen=True)
class FleetEntry:
    """One line of `gputui cloud ls`: what the cloud shows, and what the records say."""

    instance: InstanceInfo
    known: bool  # False: carries gputui's tags but the local records do not know it (an orphan)
    usd_per_hour: float | None
    cost_usd: float | None  # estimated so far; None for orphans

    @property
    def orphan(self) -> bool:
        return not self.known


@dataclass(frozen=True)
class BudgetStatus:
    """Spent and committed cost against a budget."""

    budget_usd: float
    spent_usd: float
    committed_usd: float
    warn_fraction: float = 0.8

    @property
    def fraction(self) -> float:
        return (self.spent_usd + self.committed_usd) / self.budget_usd if self.budget_usd > 0 else math.inf

    @property
    def level(self) -> str:
        """"ok", "warn" (past warn_fraction) or "stop" (spent plus committed reach the budget)."""
        if self.fraction >= 1.0:
            return "stop"
        return "warn" if self.fraction >= self.warn_fraction else "ok"


@dataclass(frozen=True)
class SpendLine:
    """One row of `gputui cost`: a cluster or a run, over the report's window."""

    name: str  # cluster name, or run id
    cluster: str
    start: float
    end: float | None  # None: still going
    usd: float
    running: int = 0  # instances still up (clusters)
    energy_kwh: float = 0.0
    estimate: bool = True

    def duration(self, now: float) -> float:
        return max(0.0, (self.end if self.end is not None else now) - self.start)

    def usd_per_hour(self, now: float) -> float | None:
        """The mean rate over the line's duration."""
        hours = self.duration(now) / 3600.0
        return self.usd / hours if hours > 0 else None


def billed_seconds(start: float, end: float, minimum_s: float = BILLING_MINIMUM_S) -> float:
    """Seconds billed for a run from `start` to `end`: whole seconds, at least the minimum."""
    return max(float(math.ceil(max(0.0, end - start) - 1e-9)), minimum_s)


def price_at(prices: Sequence[PricePoint], when: float) -> float:
    """The hourly price in force at `when` (the first point also covers earlier times)."""
    if not prices:
        raise ValueError("no prices")
    current = prices[0].usd_per_hour
    for point in prices:
        if point.since > when:
            break
        current = point.usd_per_hour
    return current


def integrate(prices: Sequence[PricePoint], start: float, end: float) -> float:
    """Dollars for [start, end] at the piecewise-constant hourly prices."""
    if end <= start:
        return 0.0
    ordered = sorted(prices, key=lambda p: p.since)
    total = 0.0
    for i, point in enumerate(ordered):
        seg_start = start if i == 0 else max(start, point.since)
        seg_end = end if i + 1 == len(ordered) else min(end, ordered[i + 1].since)
        if seg_end > seg_start:
            total += (seg_end - seg_start) * point.usd_per_hour / 3600.0
    return total


def metered_cost(
    launched: float,
    until: float,
    prices: Sequence[PricePoint],
    minimum_s: float = BILLING_MINIMUM_S,
    window: tuple[float, float] | None = None,
) -> float:
    """Estimated cost of an instance up from `launched` to `until`.

    Per-second billing with a minimum: the billed span is `billed_seconds` long from
    launch, charged at the price in force each second. `window` keeps only the part of
    the billed span inside [window[0], window[1]] (for "since N days" reports).
    """
    if not prices:
        return 0.0
    start, end = launched, launched + billed_seconds(launched, until, minimum_s)
    if window is not None:
        start, end = max(start, window[0]), min(end, window[1])
    return integrate(prices, start, end)


def committed_cost(
    launched: float, now: float, prices: Sequence[PricePoint], horizon_s: float, minimum_s: float = BILLING_MINIMUM_S
) -> float:
    """What keeping an instance `horizon_s` longer adds to its bill (the current price goes on)."""
    return metered_cost(launched, now + horizon_s, prices, minimum_s) - metered_cost(launched, now, prices, minimum_s)


def energy_kwh(samples: Iterable[tuple[float, float | None]], max_gap_s: float = 30.0) -> float:
    """Energy in kWh from (time, watts) samples by the trapezoid rule.

    A missing reading (None) or a gap longer than `max_gap_s` is not bridged: energy is
    estimated only where power was actually measured.
    """
    total_j = 0.0
    previous: tuple[float, float] | None = None
    for when, watts in sorted(samples, key=lambda s: s[0]):
        if watts is None:
            previous = None
            continue
        if previous is not None and 0 < when - previous[0] <= max_gap_s:
            total_j += (when - previous[0]) * (watts + previous[1]) / 2.0
        previous = (when, float(watts))
    return total_j / 3.6e6


def budget_status(
    budget_usd: float, spent_usd: float, committed_usd: float, warn_fraction: float = 0.8
) -> BudgetStatus:
    return BudgetStatus(budget_usd, spent_usd, committed_usd, warn_fraction)


def projection(spent_usd: float, usd_per_hour: float, hours: float) -> float:
    """Spend after `hours` more at the current rate."""
    return spent_usd + usd_per_hour * max(0.0, hours)


def hours_left(budget_usd: float, spent_usd: float, usd_per_hour: float) -> float | None:
    """Hours until the budget is reached at the current rate (None: nothing accrues)."""
    if usd_per_hour <= 0:
        return None
    return max(0.0, (budget_usd - spent_usd) / usd_per_hour)
