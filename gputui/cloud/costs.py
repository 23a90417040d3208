"""What slaves cost: the one estimate every view uses, and the `gputui cost` report.

`instance_cost` is the only place an instance's cost is computed: per-second billing with
EC2's 60-second minimum, at the price in force each second (spot re-prices over its life).
`gputui cloud ls`, `cloud down`, `gputui cost`, the dashboard and the budget guard all call
it, so they agree to the cent about the same instance. The minimum is owed from launch: an
instance up for 11 s costs its first 60 s in every view (and its mean $/h is its price).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from gputui.cloud.ledger import Ledger
from gputui.model.cloud import InstanceRecord, PricePoint, SpendLine, billed_seconds, metered_cost

ALL_TIME = (-math.inf, math.inf)


def report_clock() -> Callable[[], float]:
    """The time reports are made at: the wall clock, or the simulated cloud's when a test drives it
    by hand (GPUTUI_SIM_CLOCK names a file holding the time), so every view is read at one moment."""
    path = os.environ.get("GPUTUI_SIM_CLOCK")
    if not path:
        return time.time

    def clock() -> float:
        from gputui.model.errors import UserError

        try:
            return float(Path(path).read_text(encoding="ascii").strip())
        except (OSError, ValueError) as exc:
            raise UserError(f"GPUTUI_SIM_CLOCK={path}: {exc}") from None

    return clock


def _prices(rec: InstanceRecord) -> tuple[PricePoint, ...]:
    return rec.prices or (PricePoint(rec.launched, rec.hourly_price),)


def billed_span(rec: InstanceRecord, now: float) -> tuple[float, float]:
    """[launch, end of what is owed]: whole seconds up (to its end, or now), at least the minimum."""
    until = rec.terminated if rec.terminated is not None else now
    return rec.launched, rec.launched + billed_seconds(rec.launched, until)


def instance_cost(rec: InstanceRecord, now: float, since: float | None = None, until: float | None = None) -> float:
    """Estimated cost of one instance so far (in total once it has ended).

    `since`/`until` keep only the part of the billed span inside them (a report's window, a
    run's span); the part the minimum bills beyond `now` is owed already and is never cut at now.
    """
    window = (since if since is not None else -math.inf, until if until is not None else math.inf)
    until_now = rec.terminated if rec.terminated is not None else now
    return metered_cost(rec.launched, until_now, _prices(rec), window=None if window == ALL_TIME else window)


def committed_cost(rec: InstanceRecord, now: float, horizon_s: float) -> float:
    """What keeping a running instance `horizon_s` longer adds to `instance_cost` (the current price goes on)."""
    if rec.terminated is not None:
        return 0.0
    return metered_cost(rec.launched, now + horizon_s, _prices(rec)) - instance_cost(rec, now)


def total_cost(records: Iterable[InstanceRecord], now: float) -> float:
    return sum(instance_cost(r, now) for r in records)


def cluster_spent(ledger: Ledger, provider: str, region: str, cluster: str, now: float) -> float:
    """What a cluster has cost so far: its instances (ended or running) and its energy lines.
    The budget guard and the lease's end of budget both read it."""
    spent = sum(instance_cost(r, now) for r in ledger.instances(provider, region, cluster=cluster))
    return spent + sum(kwh * rate for _s, c, _r, _a, _b, kwh, rate in ledger.energy() if c == cluster)


@dataclass(frozen=True)
class BilledSpendLine(SpendLine):
    """A report row whose mean $/h is taken over the time billed (the 60 s minimum included),
    so one instance's mean is its price, never more."""

    billed_until: float | None = None  # the last second billed, when past the row's end (or now)

    def usd_per_hour(self, now: float) -> float | None:
        end = self.end if self.end is not None else now
        if self.billed_until is not None:
            end = max(end, self.billed_until)
        hours = max(0.0, end - self.start) / 3600.0
        return self.usd / hours if hours > 0 else None


@dataclass(frozen=True)
class RunSpendLine(BilledSpendLine):
    """A run's report row: its time is the sum of its segments (a resumed run was not running
    between them), and its mean $/h is taken over that time."""

    active_s: float = 0.0

    def duration(self, now: float) -> float:
        return self.active_s

    def usd_per_hour(self, now: float) -> float | None:
        end = self.end if self.end is not None else now
        beyond = max(0.0, self.billed_until - end) if self.billed_until is not None else 0.0
        hours = (self.active_s + beyond) / 3600.0
        return self.usd / hours if hours > 0 else None


def report(ledger: Ledger, now: float, since: float | None = None) -> tuple[list[SpendLine], list[SpendLine]]:
    """(clusters, runs) with their estimated cost inside [since, now] (what the minimum bills past
    now is counted: it is owed)."""
    window = (since if since is not None else float("-inf"), now)
    instances = ledger.instances(since=since)
    energy = ledger.energy(since=since)
    clusters: dict[str, dict[str, float]] = {}

    def add(cluster: str, start: float, end: float | None, usd: float, running: int = 0, kwh: float = 0.0,
            billed: float = -math.inf) -> None:
        c = clusters.setdefault(cluster, {"start": start, "end": 0.0, "open": 0, "usd": 0.0, "kwh": 0.0,
                                          "billed": -math.inf})
        c["start"] = min(c["start"], start)
        c["end"] = max(c["end"], end if end is not None else now)
        c["open"] += running
        c["usd"] += usd
        c["kwh"] += kwh
        c["billed"] = max(c["billed"], billed)

    for rec in instances:
        add(rec.cluster, max(rec.launched, window[0]), rec.terminated, instance_cost(rec, now, since=since),
            int(rec.running), billed=billed_span(rec, now)[1])
    for _subject, cluster, _run, start, end, kwh, rate in energy:
        share = _share(start, end, window)
        add(cluster, max(start, window[0]), end, kwh * share * rate, kwh=kwh * share)
    cluster_lines: list[SpendLine] = [
        BilledSpendLine(name, name, c["start"], None if c["open"] else c["end"], c["usd"], int(c["open"]), c["kwh"],
                        billed_until=c["billed"] if math.isfinite(c["billed"]) else None)
        for name, c in sorted(clusters.items())]
    run_lines: list[SpendLine] = []
    segments = ledger.segments(since)
    for run_id, cluster, started, ended, _status in ledger.runs(since):
        mine = [r for r in instances if r.cluster == cluster]
        usd, active, billed = 0.0, 0.0, []
        spans = []
        for seg_start, seg_end in segments.get(run_id) or [(started, ended)]:  # each start or resume
            span = (max(seg_start, window[0]), min(seg_end if seg_end is not None else now, now))
            spans.append(span)
            active += max(0.0, span[1] - span[0])
            for r in mine:
                part = instance_cost(r, now, since=span[0], until=seg_end)
                usd += part
                if part > 0:
                    billed.append(min(billed_span(r, now)[1], seg_end if seg_end is not None else math.inf))
        hull = (min(s for s, _e in spans), max(e for _s, e in spans))  # a run's energy lines are its own
        kwh = sum(k * _share(s, e, hull) for _sub, _c, rid, s, e, k, _rate in energy if rid == run_id)
        usd += sum(k * _share(s, e, hull) * rate for _sub, _c, rid, s, e, k, rate in energy if rid == run_id)
        run_lines.append(RunSpendLine(run_id, cluster, hull[0], ended, usd, energy_kwh=kwh,
                                      billed_until=max(billed) if billed else None, active_s=active))
    return cluster_lines, run_lines


def _share(start: float, end: float, window: tuple[float, float]) -> float:
    """The fraction of [start, end] inside the window (energy is spread evenly over its line)."""
    if end <= start:
        return 1.0 if window[0] <= end <= window[1] else 0.0
    inside = min(end, window[1]) - max(start, window[0])
    return max(0.0, inside) / (end - start)
