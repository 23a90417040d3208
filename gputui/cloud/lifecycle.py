"""Bringing slaves up and down: key pair, security group, spot launch with zone and
on-demand fallback, waiting with backoff, and the ledger kept in step at every stage.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Sequence

from gputui.model import units
from gputui.cloud.address import Resolver, resolver_for, ssh_cidr
from gputui.cloud.context import CloudContext
from gputui.cloud.lease import launch_tags
from gputui.cloud.pricing import (ListPriceSource, launch_price, launch_rate, on_demand_price, quotes,
                                  resolve_on_demand)
from gputui.cloud.provider import CapacityError, LaunchRequest, instance_tags
from gputui.cloud.tags import TAG_MANAGED
from gputui.model.errors import GputuiError, UserError
from gputui.model.cloud import ENDED_STATES, InstanceInfo, LaunchAttempt, PriceQuote
from gputui.model.units import plural


@dataclass(frozen=True)
class LaunchPlan:
    """What `up` will try, in order, and what it should cost."""

    count: int
    ssh_cidr: str  # who may reach port 22
    quotes: tuple[PriceQuote, ...]  # cheapest spot first
    attempts: tuple[tuple[str, str], ...]  # (zone, "spot" | "on-demand")

    def rate(self, zone: str, lifecycle: str, max_price: float | None) -> float | None:
        quote = next((q for q in self.quotes if q.zone == zone), None)
        return launch_rate(quote, lifecycle, max_price)

    def price(self, zone: str, lifecycle: str, max_price: float | None) -> tuple[float | None, str | None]:
        """`rate` with where the figure came from ("api 2026-11-25", "max_price", ...)."""
        quote = next((q for q in self.quotes if q.zone == zone), None)
        return launch_price(quote, lifecycle, max_price)

    @property
    def first_rate(self) -> float | None:
        return self.rate(*self.attempts[0], None) if self.attempts else None


@dataclass
class UpResult:
    instances: list[InstanceInfo] = field(default_factory=list)
    attempts: list[LaunchAttempt] = field(default_factory=list)
    rates: dict[str, float] = field(default_factory=dict)  # instance id -> $/h


def key_pair_name(public_key: str) -> str:
    """A name derived from the key itself: the same key always maps to the same key pair."""
    body = public_key.split()[1] if len(public_key.split()) > 1 else public_key
    return "gputui-" + hashlib.sha256(body.encode()).hexdigest()[:16]


def plan_launch(ctx: CloudContext, count: int, resolver: Resolver | None = None) -> LaunchPlan:
    """Price the allowed zones and order the attempts: spot cheapest first, then on-demand.

    The zones and prices come first (what AWS refuses, missing credentials first of all, is said
    before anything else), then the SSH source (the profile's ssh_cidr, or our public address).
    """
    s = ctx.settings
    zones = list(s.zones) or ctx.provider.zones()
    if not zones:
        raise UserError(f"region {s.region} has no available zones")
    on_demand = resolve_on_demand(ctx.price_source, s.instance_type, on_demand_price(s.instance_type, s.on_demand_price))
    priced = tuple(quotes(ctx.price_source, s.instance_type, zones, on_demand))
    attempts = [(q.zone, "spot") for q in priced]
    if s.on_demand_fallback:
        attempts += [(zone, "on-demand") for zone in zones]
    cidr = ssh_cidr(s.ssh_cidr, str(s.source), resolver or resolver_for(ctx.provider.name))
    plan = LaunchPlan(count, cidr, priced, tuple(attempts))
    if any(plan.rate(z, lc, s.max_price) is None for z, lc in attempts):
        raise UserError(f"no price known for {s.instance_type} (not in gputui's list-price table); "
                        f"set on_demand_price in [cloud] of {s.source}")
    return plan


def launch(ctx: CloudContext, plan: LaunchPlan, report: Callable[[LaunchAttempt], None] = lambda a: None,
           started: Callable[[list[InstanceInfo]], None] = lambda infos: None,
           proceed: Callable[[], None] = lambda: None) -> UpResult:
    """Key pair, security group, then spot (or on-demand) launches until `plan.count` are started.

    Each started instance is in the ledger, and handed to `started`, before anything else
    happens, so nothing launched can be forgotten (not even when a later attempt or the
    wait for it to run fails). Each attempt is reported, failed or not. `proceed` is called
    before each attempt: raising there ends the launches (a stop request).
    """
    s, p = ctx.settings, ctx.provider
    tags = instance_tags(ctx.cluster, ctx.owner)
    if p.name == "sim" and not s.public_key_path().is_file():  # simulated slaves are not logged in to
        key_name = p.ensure_key_pair("gputui-sim-no-key", "", {TAG_MANAGED: "true"})
    else:
        public_key = s.read_public_key()
        key_name = p.ensure_key_pair(key_pair_name(public_key), public_key, {TAG_MANAGED: "true"})
    group = p.ensure_security_group(f"gputui-{ctx.cluster}", plan.ssh_cidr, tags)
    image = p.resolve_image(s.ami)
    result, remaining, spot_quota_hit = UpResult(), plan.count, False
    for zone, lifecycle in plan.attempts:
        if remaining == 0:
            break
        if lifecycle == "spot" and spot_quota_hit:
            continue
        proceed()
        found, _source = plan.price(zone, lifecycle, s.max_price)
        # the watchdog's tags: a lease, capped by the budget's end with these instances' $/h added
        watched = {**tags, **launch_tags(ctx, ctx.clock(), (found or 0.0) * remaining)}
        request = LaunchRequest(s.instance_type, remaining, zone, lifecycle, image, key_name, group,
                                s.max_price if lifecycle == "spot" else None, watched)
        try:
            started_now = p.launch(request)
        except CapacityError as exc:
            spot_quota_hit = spot_quota_hit or (exc.account_wide and lifecycle == "spot")
            attempt = LaunchAttempt(zone, lifecycle, remaining, 0, exc.code, exc.message)
        else:
            found, source = plan.price(zone, lifecycle, s.max_price)
            rate = found or 0.0
            for info in started_now:
                ctx.ledger.record_launch(info, p.name, p.region, ctx.cluster, ctx.owner, rate, price_source=source)
                result.rates[info.instance_id] = rate
            started(list(started_now))
            from_where = f" ({source})" if source else ""
            ctx.record([ctx.event("launched", f"{i.instance_id} {i.instance_type} {lifecycle} in {zone} at "
                                              f"{units.per_hour(rate, 4, fixed=True)}{from_where}", i.instance_id) for i in started_now])
            result.instances += started_now
            remaining -= len(started_now)
            attempt = LaunchAttempt(zone, lifecycle, request.count, len(started_now))
        result.attempts.append(attempt)
        report(attempt)
    return result


def wait_running(ctx: CloudContext, result: UpResult) -> UpResult:
    """Wait (with backoff) until every launched instance runs with a public address, or ended."""
    ids = [i.instance_id for i in result.instances]
    if not ids:
        return result
    infos = ctx.wait(ids, lambda i: (i.state == "running" and bool(i.public_ip)) or i.state in ENDED_STATES,
                     f"{plural(len(ids), 'instance')} to run")
    now, events = ctx.clock(), []
    for info in infos:
        if info.state in ENDED_STATES:
            ended_by = "interrupted" if info.interrupted else "external"
            ctx.ledger.record_end(info.instance_id, now, info.state, ended_by)
            events.append(ctx.event("interrupted" if info.interrupted else "terminated",
                                    f"{info.instance_id} ended while starting ({info.state_reason or info.state})", info.instance_id))
        else:
            ctx.ledger.update_instance(info.instance_id, info.state, info.public_ip)
            events.append(ctx.event("running", f"{info.instance_id} running at {info.public_ip}", info.instance_id))
    ctx.record(events)
    result.instances = infos
    return result


def forget_host_keys(instances: Sequence[InstanceInfo]) -> None:
    """Drop the host keys gputui pinned for these instances' addresses: AWS hands addresses out
    again, and a later instance there must not look like a changed key."""
    from gputui.sources.hostkeys import SshOptions, forget_hosts

    forget_hosts(SshOptions().gputui_known_hosts_path(), [str(i.public_ip) for i in instances if i.public_ip])


def terminate(ctx: CloudContext, instances: Sequence[InstanceInfo], ended_by: str) -> list[InstanceInfo]:
    """Terminate, wait until each is shutting down or gone, and close their ledger records.

    Instances the ledger does not know (orphans) are adopted first, so their cost counts.
    """
    if not instances:
        return []
    known = {r.instance_id for r in ctx.ledger.instances(ctx.provider.name, ctx.provider.region)}
    for info in instances:
        if info.instance_id not in known:
            rate, source = _orphan_price(ctx, info)
            ctx.ledger.record_launch(info, ctx.provider.name, ctx.provider.region, info.cluster or ctx.cluster,
                                     info.owner, rate, price_source=source)
    ids = [i.instance_id for i in instances]
    asked = ctx.clock()
    ctx.provider.terminate(ids)
    forget_host_keys(instances)
    try:
        final = ctx.wait(ids, lambda i: i.state in ENDED_STATES, f"{plural(len(ids), 'instance')} to terminate")
    except GputuiError:
        _close(ctx, ids, ctx.provider.describe(ids), asked, ended_by)  # record what has ended so far
        raise
    _close(ctx, ids, final, asked, ended_by)
    return final


def _orphan_price(ctx: CloudContext, info: InstanceInfo) -> tuple[float, str | None]:
    """What an adopted orphan is metered at: its zone's spot price, else the region's on-demand
    price (the Pricing API's, the table's when it cannot say), with its source; 0 when none is known."""
    prices = ctx.price_source
    if info.lifecycle == "spot":
        spot = prices.spot_prices(info.instance_type, [info.zone]).get(info.zone)
        if spot is not None:
            return spot, prices.spot_source() if isinstance(prices, ListPriceSource) else None
    on_demand = resolve_on_demand(prices, info.instance_type, None)
    if on_demand is None:
        return 0.0, None
    return float(on_demand), getattr(on_demand, "source", None)


def _close(ctx: CloudContext, ids: Sequence[str], infos: Sequence[InstanceInfo], when: float, ended_by: str) -> None:
    """Close the records of instances that have ended (or that the cloud no longer shows)."""
    states = {i.instance_id: i.state for i in infos}
    events = []
    for instance_id in ids:
        state = states.get(instance_id, "terminated")
        if state in ENDED_STATES and ctx.ledger.record_end(instance_id, when, state, ended_by):
            events.append(ctx.event("terminated", f"{instance_id} terminated ({ended_by})", instance_id))
    ctx.record(events)
