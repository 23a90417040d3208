"""The cost panel's data: one frozen frame per cloud poll (no cloud SDK here; `launch_preview`
asks the price source, so it runs in the cloud poll's worker)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gputui.model import units
from gputui.model.cloud import BudgetStatus, projection


@dataclass(frozen=True)
class SlaveLine:
    """One slave in the cost panel."""

    instance_id: str
    instance_type: str
    zone: str
    state: str
    lifecycle: str
    launched: float
    usd_per_hour: float | None
    cost_usd: float | None
    orphan: bool = False

    def uptime_s(self, now: float) -> float:
        return max(0.0, now - self.launched)


@dataclass(frozen=True)
class LaunchPreview:
    """What the next `u` launches: the first attempt of the launch plan (cheapest spot zone)."""

    instance_type: str
    zone: str
    market: str  # "spot" or "on-demand"
    usd_per_hour: float | None


@dataclass(frozen=True)
class CostFrame:
    """The cost panel at one moment."""

    time: float
    cluster: str
    provider: str
    region: str
    instance_type: str
    budget: BudgetStatus
    usd_per_hour: float  # what the running slaves cost per hour now
    slaves: tuple[SlaveLine, ...] = ()
    next_launch: LaunchPreview | None = None  # what `u` would launch now (None: not known yet)

    @property
    def live(self) -> tuple[SlaveLine, ...]:
        """Slaves not yet on their way out."""
        return tuple(s for s in self.slaves if s.state in ("pending", "running", "stopping", "stopped"))

    def projected(self, eta_s: float | None) -> float | None:
        """Spend when the run ends at the current rate (None without a run to project to)."""
        if eta_s is None:
            return None
        return projection(self.budget.spent_usd, self.usd_per_hour, eta_s / 3600.0)


def launch_preview(ctx: Any) -> LaunchPreview | None:
    """The zone and price `u` would launch at now, as gputui.cloud.lifecycle.plan_launch orders
    the attempts (cheapest spot quote first, metered at its spot price). Blocks on the price source."""
    from gputui.cloud.pricing import launch_rate, on_demand_price, quotes

    s = ctx.settings
    zones = list(s.zones) or ctx.provider.zones()
    if not zones:
        return None
    priced = quotes(ctx.price_source, s.instance_type, zones, on_demand_price(s.instance_type, s.on_demand_price))
    if not priced:
        return None
    first = priced[0]
    return LaunchPreview(s.instance_type, first.zone, "spot", launch_rate(first, "spot", None))
