"""The budget guard: warn at 80%, and at 100% checkpoint the runs and terminate the slaves.

"Spent" is the metered cost so far of the cluster's instances (and energy lines);
"committed" is what keeping the running ones until the next poll adds. The guard trips
when spent plus committed reach the budget, so the cluster never costs more than the
budget plus one polling interval's worth.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from gputui.model import units
from gputui.cloud.costs import cluster_spent, committed_cost
from gputui.cloud.fleet import poll
from gputui.cloud.lifecycle import terminate
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import PriceBook
from gputui.cloud.redact import redact
from gputui.model.errors import GputuiError
from gputui.model.cloud import BudgetStatus, CloudEvent, InstanceRecord
from gputui.model.units import plural

Checkpointer = Callable[[Sequence[InstanceRecord]], None]


class BudgetGuard:
    """Checks a cluster's spend against `[cloud] budget_usd` on every poll."""

    def __init__(self, ctx: CloudContext, interval_s: float, checkpoint: Checkpointer | None = None,
                 grace_s: float = 15.0, warn_fraction: float = 0.8) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.checkpoint = checkpoint
        self.grace_s = min(grace_s, interval_s)  # the grace is paid from the interval's margin
        self.warn_fraction = warn_fraction
        self.warned = False

    def running(self) -> list[InstanceRecord]:
        p = self.ctx.provider
        return self.ctx.ledger.instances(p.name, p.region, cluster=self.ctx.cluster, running=True)

    def status(self, now: float | None = None, extra_committed: float = 0.0) -> BudgetStatus:
        ctx, p = self.ctx, self.ctx.provider
        now = ctx.clock() if now is None else now
        records = ctx.ledger.instances(p.name, p.region, cluster=ctx.cluster)
        spent = cluster_spent(ctx.ledger, p.name, p.region, ctx.cluster, now)
        committed = sum(committed_cost(r, now, self.interval_s) for r in records if r.running)
        return BudgetStatus(ctx.settings.budget_usd, spent, committed + extra_committed, self.warn_fraction)

    def check(self) -> list[CloudEvent]:
        """Compare once; warn or stop. Returns the events raised (also in the ledger)."""
        ctx = self.ctx
        status = self.status()
        running = self.running()
        if status.level == "stop" and running:
            return self.trip(status, running)
        if status.level == "warn" and not self.warned:
            self.warned = True
            budget, spent = units.money(status.budget_usd, fixed=True), units.money(status.spent_usd, 4, fixed=True)
            return ctx.record([ctx.event("budget_warning", f"{status.fraction:.0%} of the {budget} budget "
                                         f"spent or committed ({spent} spent)")])
        return []

    def trip(self, status: BudgetStatus, running: Sequence[InstanceRecord]) -> list[CloudEvent]:
        """Ask every run to checkpoint (SIGTERM), give it the grace time, then terminate every slave."""
        ctx = self.ctx
        budget, spent = units.money(status.budget_usd, fixed=True), units.money(status.spent_usd, 4, fixed=True)
        committed = units.money(status.committed_usd, 4, fixed=True)
        events = [ctx.event("budget_stop", f"budget {budget} reached ({spent} spent + {committed} committed): "
                            f"checkpointing runs, terminating {plural(len(running), 'slave')}")]
        if self.checkpoint is not None:
            try:
                self.checkpoint(running)
            except Exception as exc:  # a failed SIGTERM must never keep slaves running
                events.append(ctx.event("budget_stop", f"could not ask the runs to checkpoint: {redact(str(exc))}"))
            if self.grace_s > 0:
                ctx.sleep(self.grace_s)
        ctx.record(events)
        terminate(ctx, ctx.provider.describe([r.instance_id for r in running]), ended_by="budget")
        return events


def guard_loop(ctx: CloudContext, guard: BudgetGuard, book: PriceBook, stop: threading.Event) -> None:
    """Poll every interval (polls never overlap) until the cluster has no slaves or `stop` is set.

    Events reach `ctx.listener` as they are recorded.
    """
    p = ctx.provider
    while True:
        try:
            poll(ctx, book)
            guard.check()
        except GputuiError as exc:  # a network blip or expired credentials: say so, keep guarding
            ctx.record([ctx.event("error", f"poll failed: {exc}")])
        if not ctx.ledger.instances(p.name, p.region, cluster=ctx.cluster, running=True):
            return
        if stop.wait(guard.interval_s):
            return
