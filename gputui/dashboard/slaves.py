"""Slaves from the dashboard: one poll gives the cost frame (spent, $/h, budget, a line per
slave); one keystroke launches one more spot slave or terminates some. Every method here
blocks on the cloud: the dashboard calls them from worker threads.

Built on gputui.cloud (the provider contract, the ledger, the budget guard); the same
rules as `gputui cloud up`: a launch that would break the budget is refused.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from gputui.model import units
from gputui.cloud.budget import BudgetGuard
from gputui.cloud.costs import instance_cost
from gputui.cloud.fleet import fleet
from gputui.cloud.lifecycle import launch, plan_launch, terminate
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import PriceBook
from gputui.dashboard.cost import CostFrame, SlaveLine
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import hours_left


class BudgetRefusal(UserError):
    """A launch refused because it would break the budget."""


class SlaveControl:
    """The dashboard's handle on one cluster's slaves."""

    def __init__(self, ctx: CloudContext, interval_s: float, say: Callable[[str], None] = lambda m: None) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.say = say
        self.book = PriceBook(ctx.price_source, clock=ctx.clock)
        checkpoint = None
        if ctx.provider.name == "ec2":
            from gputui.cloud.remote import cloud_checkpointer

            checkpoint = cloud_checkpointer(ctx.settings)
        self.guard = BudgetGuard(ctx, interval_s, checkpoint)
        self._launching = threading.Lock()  # one launch at a time, so each sees the others' cost
        from gputui.cloud.lease import LeaseRenewer

        self.lease = LeaseRenewer(ctx).start()  # the slaves' lease, renewed while the dashboard watches them

    def poll(self) -> CostFrame:
        """Reconcile with the cloud, let the budget guard act, and return the panel's frame."""
        ctx = self.ctx
        entries, _events = fleet(ctx, self.book)
        self.guard.check()
        now = ctx.clock()
        records = {r.instance_id: r for r in ctx.ledger.instances(ctx.provider.name, ctx.provider.region, cluster=ctx.cluster)}
        lines = []
        for entry in entries:
            info = entry.instance
            if info.instance_id not in records and entry.known:
                continue  # another cluster's slave
            rec = records.get(info.instance_id)
            rate = rec.hourly_price if rec is not None and rec.running else entry.usd_per_hour
            lines.append(SlaveLine(info.instance_id, info.instance_type, info.zone, info.state, info.lifecycle,
                                   info.launched, rate, instance_cost(rec, now) if rec is not None else entry.cost_usd, entry.orphan))
        running = [r for r in records.values() if r.running]
        return CostFrame(now, ctx.cluster, ctx.provider.name, ctx.provider.region, ctx.settings.instance_type,
                         self.guard.status(now), sum(r.hourly_price for r in running), tuple(lines))

    def launch_one(self) -> list[str]:
        """Launch one more slave now, the cheapest spot zone first. Returns the ids started.

        Says the price and the budget effect first; raises BudgetRefusal if the launch would
        break the budget (spent plus committed, with the new slave's first billing minute).
        """
        ctx, s = self.ctx, self.ctx.settings
        with self._launching:
            plan = plan_launch(ctx, 1)
            rate = plan.first_rate or 0.0
            status = self.guard.status(extra_committed=rate * max(60.0, self.interval_s) / 3600.0)
            if status.level == "stop":
                raise BudgetRefusal(f"launch refused: 1 x {s.instance_type} at {units.per_hour(rate, 4)} would break the "
                                    f"{units.money(s.budget_usd)} budget ({units.money(status.spent_usd, 4)} spent, "
                                    f"{units.money(status.committed_usd, 4)} committed); raise budget_usd in the profile")
            zone, market = plan.attempts[0]
            running = sum(r.hourly_price for r in self.guard.running())
            left = hours_left(s.budget_usd, status.spent_usd, running + rate)
            lasts = f"the budget lasts {left:.1f} h at that rate" if left is not None else ""
            self.say(f"launching 1 x {s.instance_type} {market} in {zone} at {units.per_hour(rate, 4)}: fleet "
                     f"{units.per_hour(running)} -> {units.per_hour(running + rate)}; {units.money(status.spent_usd, 4)} of "
                     f"{units.money(s.budget_usd)} spent, {lasts}")
            result = launch(ctx, plan)
        if not result.instances:
            tried = "; ".join(f"{a.zone} {a.lifecycle}: {a.error_code}" for a in result.attempts)
            raise GputuiError(f"no slave launched ({tried})")
        return [i.instance_id for i in result.instances]

    def terminate(self, ids: Sequence[str]) -> int:
        """Terminate these slaves now (waits until each is shutting down); returns how many."""
        p = self.ctx.provider
        targets = [i for i in p.describe(list(ids)) if i.live]
        if targets:
            terminate(self.ctx, targets, ended_by="user")
        return len(targets)

    def terminate_all(self) -> int:
        """Terminate every running slave of the cluster, after any launch in progress has finished."""
        with self._launching:
            return self.terminate([r.instance_id for r in self.guard.running()])

    def close(self) -> None:
        self.lease.stop()
        self.ctx.ledger.close()
