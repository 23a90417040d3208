"""The dashboard's alerts: the profile's `[alerts]` evaluated on each telemetry round, in the
worker that polls (never on the UI thread), and handed to the command and the webhook.

The engine (gputui.monitor.alerts) fires once when a condition starts, once when it clears, and
repeats only at `repeat_s`; this only feeds it the round, the run and the cloud.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from gputui.monitor.alerts import Alert, AlertEngine, AlertSettings, CloudFacts, Notifier, RunFacts
from gputui.dashboard.cost import CostFrame
from gputui.model.telemetry import HostSnapshot


class DashboardAlerts:
    """One profile's alert engine and notifier. `round()` is called by one thread at a time
    (the hosts poll worker); `report` gets the notifier's failures, from its own thread."""

    def __init__(self, settings: AlertSettings, report: Callable[[str], None]) -> None:
        self.settings = settings
        self.engine = AlertEngine(settings)
        self.notifier = Notifier(settings, report=report)

    def round(self, hosts: Sequence[HostSnapshot], now: float, run: RunFacts | None = None,
              cost: CostFrame | None = None) -> list[Alert]:
        """This round's alerts (most rounds: none), already handed to the command and webhook."""
        alerts = self.engine.evaluate(hosts, now, run, cloud_facts(cost))
        if alerts:
            self.notifier.send(alerts)
        return alerts

    def close(self, timeout: float = 2.0) -> None:
        self.notifier.close(timeout)


def cloud_facts(cost: CostFrame | None) -> CloudFacts | None:
    """The budget as the alerts see it, from the cost panel's latest frame."""
    if cost is None:
        return None
    budget = cost.budget
    return CloudFacts(cost.cluster, budget.budget_usd, budget.spent_usd, budget.committed_usd, cost.usd_per_hour)


def fold_run(facts: RunFacts, events: list[dict[str, Any]]) -> RunFacts:
    """The run's facts after some of its `gputui run --json` events (stalled and NaN alerts)."""
    from gputui.monitor.watches import fold_all

    return fold_all(facts, events)


def run_ended(facts: RunFacts) -> RunFacts:
    """The child process ended (a crash says no `done`): the run is no longer watched for stalls."""
    return replace(facts, active=False)


def load_alerts(profile_path: Any, report: Callable[[str], None]) -> DashboardAlerts | None:
    """The profile's `[alerts]`, or None without the table."""
    from gputui.monitor.alerts import alert_settings
    from gputui.config.profile import load_profile

    settings = alert_settings(load_profile(profile_path))
    return None if settings is None else DashboardAlerts(settings, report)
