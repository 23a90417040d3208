"""The master's view of its slaves: one poll reconciles the cloud with the ledger.

A poll notices spot interruptions and other ends (recording when and how), re-reads
spot prices when they are an hour old, and lists every gputui-tagged instance,
marking those the local records do not know (orphans).
"""

from __future__ import annotations

from typing import Sequence

from gputui.model import units
from gputui.cloud.costs import instance_cost
from gputui.cloud.lease import ended_how
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import PriceBook
from gputui.cloud.tags import TAG_MANAGED
from gputui.model.cloud import ENDED_STATES, CloudEvent, FleetEntry, InstanceInfo


def poll(ctx: CloudContext, book: PriceBook) -> tuple[list[InstanceInfo], list[CloudEvent]]:
    """Reconcile once: returns what the cloud shows (tagged instances) and the events raised."""
    p, ledger = ctx.provider, ctx.ledger
    now = ctx.clock()
    records = ledger.instances(p.name, p.region, running=True)
    live = {i.instance_id: i for i in p.list_tagged({TAG_MANAGED: "true"})}
    missing = [r.instance_id for r in records if r.instance_id not in live]
    if missing:  # tags may have been removed by hand: look the ids up directly
        live.update({i.instance_id: i for i in p.describe(missing)})
    events = []
    for rec in records:
        info = live.get(rec.instance_id)
        if info is None:
            if ledger.record_end(rec.instance_id, now, "terminated", "vanished"):
                events.append(CloudEvent(now, "vanished", f"{rec.instance_id} is gone from {p.name} (recorded as ended)",
                                         rec.instance_id, rec.cluster))
        elif info.state in ENDED_STATES:
            end = ended_how(p, info, now)  # a spot interruption, its own watchdog (why), or outside gputui
            if ledger.record_end(rec.instance_id, end.when, info.state, end.ended_by):
                events.append(CloudEvent(now, end.kind, f"{rec.instance_id} {info.state}: {end.why}", rec.instance_id, rec.cluster))
        else:
            if (info.state, info.public_ip) != (rec.state, rec.address):
                ledger.update_instance(rec.instance_id, info.state, info.public_ip)
                if info.state == "running" and rec.state != "running":
                    events.append(CloudEvent(now, "running", f"{rec.instance_id} running at {info.public_ip}",
                                             rec.instance_id, rec.cluster))
            # The book re-reads a zone's price when it is stale; every instance of that zone then
            # takes the new price (not only the first one polled after the re-read).
            price = book.spot(rec.instance_type, rec.zone) if rec.lifecycle == "spot" else None
            if price is not None and abs(price - rec.hourly_price) > 1e-12:
                source = getattr(ctx.price_source, "spot_source", None)
                if ledger.set_price(rec.instance_id, now, price,
                                    price_source=source() if callable(source) else None):
                    events.append(CloudEvent(now, "price", f"{rec.instance_id} spot price now "
                                             f"{units.per_hour(price, 4, fixed=True)}",
                                             rec.instance_id, rec.cluster))
    return list(live.values()), ctx.record(events)


def fleet(ctx: CloudContext, book: PriceBook) -> tuple[list[FleetEntry], list[CloudEvent]]:
    """Poll, then one entry per tagged instance that is not yet terminated, oldest first."""
    shown, events = poll(ctx, book)
    now = ctx.clock()
    records = {r.instance_id: r for r in ctx.ledger.instances(ctx.provider.name, ctx.provider.region)}
    entries = []
    for info in sorted(shown, key=lambda i: (i.launched, i.instance_id)):
        if info.state == "terminated" or info.tags.get(TAG_MANAGED) != "true":
            continue
        rec = records.get(info.instance_id)
        # Known: on record, and the record agrees it is up (or it is on its way out anyway).
        known = rec is not None and (rec.running or not info.live)
        entries.append(FleetEntry(info, known, rec.hourly_price if rec and known else None,
                                  instance_cost(rec, now) if rec and known else None))
    return entries, events


def orphans(entries: Sequence[FleetEntry], owner: str, any_owner: bool = False) -> list[InstanceInfo]:
    """Live tagged instances the records do not know; only this owner's unless `any_owner`."""
    return [e.instance for e in entries
            if e.orphan and e.instance.live and (any_owner or e.instance.owner == owner)]
