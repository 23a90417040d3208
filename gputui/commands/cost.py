"""`gputui cost`: estimated spend per cluster and per run, from the cost ledger."""

from __future__ import annotations

import argparse
import time
from typing import Any

from gputui.model import units


def _reason(record: Any) -> str:
    """lease, budget, idle or max_hours: why a slave's watchdog powered it off."""
    return str(record.ended_by).split(":", 1)[1]


def register(subparsers: Any) -> None:
    cost = subparsers.add_parser("cost", help="estimated spend per cluster and per run",
                                 description="Estimated spend per cluster and per run (cloud instances and local GPU energy).")
    cost.add_argument("--since", type=float, metavar="DAYS", help="only the last DAYS days (fractions allowed)")
    cost.add_argument("--json", action="store_true", help="print JSON on stdout instead of tables")
    cost.set_defaults(handler=cmd_cost)


def cmd_cost(args: argparse.Namespace) -> int:
    from gputui.cloud.costs import report, report_clock
    from gputui.cloud.ledger import Ledger
    from gputui.views import cloud as view
    from gputui.model.errors import UserError

    if args.since is not None and not args.since > 0:
        raise UserError(f"--since {args.since:g}: expected a number of days > 0")
    now = report_clock()()
    since = now - args.since * 86400 if args.since is not None else None
    ledger = Ledger.existing()
    clusters, runs = ([], []) if ledger is None else report(ledger, now, since)
    sources = {} if ledger is None else ledger.price_sources(since)  # {cluster: where its rates came from}
    methods = {} if ledger is None else ledger.energy_methods(since)  # {cluster: how its energy was measured}
    stops = [] if ledger is None else ledger.self_stops(since)  # slaves their watchdog powered off
    if ledger is not None:
        ledger.close()
    total = sum(line.usd for line in clusters)
    if args.json:
        view.print_json({"estimate": True, "since": since, "now": now, "total_usd": round(total, 6),
                         "clusters": [view.spend_json(c, now, sources.get(c.cluster, ()), methods.get(c.cluster, ()))
                                      for c in clusters],
                         "runs": [view.spend_json(r, now, sources.get(r.cluster, ()), methods.get(r.cluster, ()))
                                  for r in runs],
                         "self_stops": [{"instance_id": r.instance_id, "cluster": r.cluster, "reason": _reason(r),
                                         "ended": r.terminated} for r in stops]})
        return 0
    if not clusters and not runs:
        view.say("no costs recorded yet" + (f" in the last {args.since:g} days" if since else ""))
        return 0
    window = f"last {args.since:g} days" if since else "all time"
    if clusters:  # none while only runs that paid for nothing are recorded (a CPU here, no GPU energy)
        view.spend_table(f"Spend per cluster, {window} (estimates)", clusters, now, "cluster", sources, methods)
    if runs:
        view.spend_table(f"Spend per run, {window} (estimates)", runs, now, "run", sources, methods)
    for r in stops:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.terminated)) if r.terminated else "n/a"
        view.say(f"{r.instance_id} ({r.cluster}) powered itself off: {_reason(r)} at {when}")
    view.say(f"total {units.money(total, 4)} (estimate: per-second billing with the 60 s minimum at the recorded prices; "
             "AWS's bill is the reference)")
    return 0
