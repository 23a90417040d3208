"""The cost panel's data: one frozen frame per cloud poll (no cloud SDK, no I/O here)."""

from __future__ import annotations

from dataclasses import dataclass

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

    @property
    def live(self) -> tuple[SlaveLine, ...]:
        """Slaves not yet on their way out."""
        return tuple(s for s in self.slaves if s.state in ("pending", "running", "stopping", "stopped"))

    def projected(self, eta_s: float | None) -> float | None:
        """Spend when the run ends at the current rate (None without a run to project to)."""
        if eta_s is None:
            return None
        return projection(self.budget.spent_usd, self.usd_per_hour, eta_s / 3600.0)


def money(value: float | None, digits: int = 4) -> str:
    return "n/a" if value is None else f"${value:,.{digits}f}"
