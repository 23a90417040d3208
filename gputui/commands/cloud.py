"""`gputui cloud up|down|ls|sweep|prices|guard|watch`: spot slaves on AWS (or simulated).

Nothing heavy is imported here: boto3 loads only when a command talks to EC2.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gputui.model import units
from gputui.model.units import plural

DEFAULT_GUARD_INTERVAL_S = 30.0


def register(subparsers: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--profile", type=Path, help="profile with a [cloud] table (default: profiles/aws-spot.toml)")
    common.add_argument("--provider", choices=("ec2", "sim"), help="ec2 (default) or sim, the simulated cloud (or GPUTUI_CLOUD)")
    common.add_argument("--region", help="AWS region (default: the profile's [cloud] region)")
    common.add_argument("--cluster", help="cluster name, tagged on every instance (default: the profile's file name)")
    yes = argparse.ArgumentParser(add_help=False)
    yes.add_argument("--yes", "-y", action="store_true", help="go ahead without asking (needed without a terminal)")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true", help="print JSON on stdout instead of a table")

    cloud = subparsers.add_parser("cloud", help="spot slaves on AWS: up, down, ls, sweep, prices, guard, watch",
                                  description="Launch, list and stop spot GPU slaves, with live cost and a budget.")
    cloud.set_defaults(handler=lambda args: (cloud.print_help(), 0)[1])
    sub = cloud.add_subparsers(dest="cloud_command", metavar="ACTION")

    up = sub.add_parser("up", parents=[common, yes], help="launch spot slaves (shows the price and asks first)")
    up.add_argument("--count", type=int, help="how many (default: [cloud] count)")
    up.add_argument("--ssh-cidr", metavar="CIDR", help="who may reach the slaves' port 22, e.g. 203.0.113.7/32 "
                    "(default: the profile's ssh_cidr, else GPUTUI_SSH_CIDR, else this machine's public address)")
    up.add_argument("--no-guard", action="store_true", help="do not start the background budget guard")
    up.add_argument("--guard-interval", type=float, default=DEFAULT_GUARD_INTERVAL_S, metavar="S",
                    help=f"seconds between the guard's polls (default {DEFAULT_GUARD_INTERVAL_S:g})")
    up.set_defaults(handler=cmd_up)

    down = sub.add_parser("down", parents=[common, yes], help="terminate slaves by id, or --all")
    down.add_argument("ids", nargs="*", metavar="ID", help="instance ids")
    down.add_argument("--all", action="store_true", help="every instance the records say is running in the region "
                      "(only the cluster's with --cluster)")
    down.set_defaults(handler=cmd_down)

    ls = sub.add_parser("ls", parents=[common, as_json], help="every gputui instance in the region, orphans marked")
    ls.set_defaults(handler=cmd_ls)

    sweep = sub.add_parser("sweep", parents=[common, yes], help="terminate orphans: tagged instances the records do not know")
    sweep.add_argument("--any-owner", action="store_true", help="also orphans tagged with another owner")
    sweep.set_defaults(handler=cmd_sweep)

    prices = sub.add_parser("prices", parents=[common, as_json], help="spot price per zone next to on-demand")
    prices.add_argument("--type", dest="instance_type", help="instance type (default: [cloud] instance_type)")
    prices.set_defaults(handler=cmd_prices)

    guard = sub.add_parser("guard", parents=[common, as_json], help="watch the cluster: interruptions, cost, budget")
    guard.add_argument("--interval", type=float, default=DEFAULT_GUARD_INTERVAL_S, metavar="S", help="seconds between polls")
    guard.add_argument("--grace", type=float, default=15.0, metavar="S", help="checkpoint time before a budget stop")
    guard.add_argument("--detached", action="store_true", help=argparse.SUPPRESS)
    guard.set_defaults(handler=cmd_guard)

    watch = sub.add_parser("watch", help="on a slave: SIGTERM the training process on a spot interruption notice")
    what = watch.add_mutually_exclusive_group(required=True)
    what.add_argument("--pid", type=int, help="the training process")
    what.add_argument("--checkpoint-all", action="store_true", help="SIGTERM every watched process now")
    watch.add_argument("--interval", type=float, default=5.0, help="seconds between polls (default 5)")
    watch.add_argument("--imds", default=None, help="metadata service URL (default: 169.254.169.254)")
    watch.set_defaults(handler=cmd_watch)


def context(args: argparse.Namespace, listener: Any = None) -> Any:
    from gputui.cloud.ledger import Ledger
    from gputui.cloud.context import CloudContext
    from gputui.cloud.provider import check_cluster_name, default_owner
    from gputui.cloud.factory import make_provider
    from gputui.cloud.settings import load_cloud_settings

    settings = load_cloud_settings(args.profile)
    if getattr(args, "region", None) and args.region != settings.region:
        settings = with_region(settings, args.region)
    cluster = check_cluster_name(args.cluster or (settings.source.stem if settings.source else "default"))
    provider = make_provider(args.provider, settings.region)
    # The provider's clock where it has one (a simulated cloud driven by hand), so every figure
    # is taken at the cloud's own time.
    clock = getattr(provider, "clock", None)
    return CloudContext(settings, provider, Ledger(), cluster, default_owner(), listener=listener,
                        **({"clock": clock} if callable(clock) else {}))


def with_region(settings: Any, region: str) -> Any:
    """The settings in another region (the profile's zones are kept only where they belong to it)."""
    import re
    from dataclasses import replace

    from gputui.model.errors import UserError

    if not re.match(r"^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", region):
        raise UserError(f"--region {region!r}: expected an AWS region such as us-east-1")
    return replace(settings, region=region, zones=tuple(z for z in settings.zones if z.startswith(region)))


def cmd_up(args: argparse.Namespace) -> int:
    from gputui.cloud import guardian
    from gputui.cloud.budget import BudgetGuard
    from gputui.cloud.fleet import poll
    from gputui.cloud.leaks import describe, exit_check
    from gputui.cloud.lifecycle import launch, plan_launch, wait_running
    from gputui.cloud.pricing import PriceBook
    from gputui.views import cloud as view
    from gputui.model.errors import GputuiError, UserError

    from dataclasses import replace

    from gputui.cloud.address import check_cidr, resolver_for
    from gputui.cloud.leaks import down_command

    cidr = check_cidr(args.ssh_cidr, "--ssh-cidr") if args.ssh_cidr is not None else None
    ctx = context(args)
    if cidr is not None:  # the flag wins over the profile and GPUTUI_SSH_CIDR
        ctx.settings = replace(ctx.settings, ssh_cidr=cidr)
    with ctx.ledger:
        s = ctx.settings
        count = args.count if args.count is not None else s.count
        if not 1 <= count <= 256:
            raise UserError(f"--count {count}: expected a whole number from 1 to 256")
        poll(ctx, PriceBook(ctx.price_source))
        before = ctx.ledger.instances(ctx.provider.name, s.region, running=True)
        if before:
            view.say(f"note: {describe(before)} already")
        plan = plan_launch(ctx, count, resolver=resolver_for(ctx.provider.name))
        rate = plan.first_rate or 0.0
        status = BudgetGuard(ctx, args.guard_interval).status(extra_committed=count * rate * 60 / 3600)
        if status.level == "stop":
            spent, budget = units.money(status.spent_usd, 4, fixed=True), units.money(s.budget_usd, fixed=True)
            raise UserError(f"budget reached for cluster {ctx.cluster}: {spent} spent of {budget} (launching needs "
                            f"{units.money(status.committed_usd, 4, fixed=True)} more); raise budget_usd in {s.source}")
        zone, market = plan.attempts[0]
        view.say(f"{count} x {s.instance_type}: {view.launch_price_text(plan.quotes, zone, market)}; "
                 f"{units.per_hour(rate * count, 4)} in all; budget {units.money(s.budget_usd)}, {units.money(status.spent_usd, 4)} spent")
        if not view.confirm(f"Launch {count} x {s.instance_type} at about {units.per_hour(rate * count, 4)}? [y/N] ",
                            args.yes, "gputui cloud up launches " + ("simulated instances" if ctx.provider.name == "sim"
                                                                     else "paid instances")):
            view.say("nothing launched")
            return 1
        try:
            result = launch(ctx, plan, report=lambda a: view.say(view.attempt_line(a)))
            if result.instances:
                view.say(f"waiting for {plural(len(result.instances), 'instance')} to run ...")
                wait_running(ctx, result)
        except KeyboardInterrupt:
            view.say("interrupted")
            exit_check(ctx, view.interactive(), lambda q: view.confirm(q, False, "stop"), view.say)
            return 130
        if not result.instances:
            tried = "; ".join(view.attempt_line(a) for a in result.attempts)
            raise GputuiError(f"no instance launched ({tried}); try other zones, a higher max_price or on_demand_fallback")
        view.instances_table(f"cluster {ctx.cluster}: {plural(len(result.instances), 'instance')} up", result.instances, result.rates)
        if len(result.instances) < count:
            view.say(f"warning: only {len(result.instances)} of {count} launched")
        if not args.no_guard:
            pid = guardian.spawn(ctx, args.guard_interval)
            if pid:
                view.say(f"budget guard running (pid {pid}, every {args.guard_interval:g} s, log {guardian.log_path(ctx)})")
        else:
            view.say(f"no budget guard: nothing renews the slaves' lease, so they power themselves off within "
                     f"{s.lease_minutes:g} min unless `gputui run` or the dashboard uses them")
        view.say(f"stop them with: {down_command(ctx, ctx.cluster)}   (costs: gputui cost)")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    from gputui.cloud.costs import total_cost
    from gputui.cloud.fleet import poll
    from gputui.cloud.lifecycle import terminate
    from gputui.cloud.pricing import PriceBook
    from gputui.cloud.tags import TAG_MANAGED
    from gputui.views import cloud as view
    from gputui.model.errors import UserError

    if not args.ids and not args.all:
        raise UserError("gputui cloud down: name instance ids, or --all")
    if args.ids and args.all:
        raise UserError("gputui cloud down: give ids or --all, not both")
    ctx = context(args)
    with ctx.ledger:
        p = ctx.provider
        poll(ctx, PriceBook(ctx.price_source))
        if args.all:  # every cluster's, or only the one named by --cluster
            records = ctx.ledger.instances(p.name, p.region, cluster=args.cluster, running=True)
            targets = p.describe([r.instance_id for r in records]) if records else []
        else:
            found = {i.instance_id: i for i in p.describe(args.ids)}
            for instance_id in args.ids:
                if instance_id not in found:
                    raise UserError(f"{instance_id}: no such instance in {p.region}")
                if found[instance_id].tags.get(TAG_MANAGED) != "true":
                    raise UserError(f"{instance_id}: not launched by gputui (no {TAG_MANAGED} tag); gputui stops only its own")
            targets = [found[i] for i in args.ids]
        targets = [t for t in targets if t.live]
        if not targets:
            view.say("nothing to stop: no instance running")
            return 0
        rates = {r.instance_id: r.hourly_price for r in ctx.ledger.instances(p.name, p.region, running=True)}
        view.instances_table("to terminate", targets, rates)
        if not view.confirm(f"Terminate {plural(len(targets), 'instance')}? [y/N] ", args.yes, "gputui cloud down terminates instances"):
            view.say("nothing terminated")
            return 1
        final = terminate(ctx, targets, ended_by="user")
        now = ctx.clock()
        ended = {t.instance_id for t in targets}
        cost = total_cost([r for r in ctx.ledger.instances(p.name, p.region) if r.instance_id in ended], now)
        view.say(f"terminated {plural(len(final), 'instance')}; their estimated cost: {units.money(cost, 4)}")
    return 0


def cmd_ls(args: argparse.Namespace) -> int:
    from gputui.cloud.leaks import cloud_command
    from gputui.cloud.fleet import fleet
    from gputui.cloud.pricing import PriceBook
    from gputui.views import cloud as view

    ctx = context(args)
    with ctx.ledger:
        entries, events = fleet(ctx, PriceBook(ctx.price_source))
        now = ctx.clock()
        if args.json:
            view.print_json({"region": ctx.settings.region, "provider": ctx.provider.name,
                             "instances": view.fleet_json(entries, now), "events": [view.event_json(e) for e in events]})
            return 0
        for event in events:
            view.say(view.event_line(event))
        if not entries:
            view.say(f"no gputui instances in {ctx.settings.region}")
            return 0
        view.fleet_table(entries, now, ctx.settings.region,
                         sweep=cloud_command("sweep", ctx.provider.name, profile=ctx.settings.source,
                                             region=ctx.provider.region, extra=("--yes",)))
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from gputui.cloud.fleet import fleet, orphans
    from gputui.cloud.lifecycle import terminate
    from gputui.cloud.pricing import PriceBook
    from gputui.views import cloud as view

    ctx = context(args)
    with ctx.ledger:
        entries, _events = fleet(ctx, PriceBook(ctx.price_source))
        found = orphans(entries, ctx.owner, args.any_owner)
        others = [e for e in entries if e.orphan and e.instance.live and e.instance not in found]
        if others:
            view.say(f"{plural(len(others), 'orphan')} belong to other owners; --any-owner includes them")
        if not found:
            view.say("no orphans: every gputui instance here is in the records")
            return 0
        view.instances_table("orphans to terminate", found, {})
        if not view.confirm(f"Terminate {plural(len(found), 'orphan')}? [y/N] ", args.yes, "gputui cloud sweep terminates instances"):
            view.say("nothing terminated")
            return 1
        terminate(ctx, found, ended_by="sweep")
        view.say(f"terminated {plural(len(found), 'orphan')}; they are in the cost ledger now")
    return 0


def cmd_prices(args: argparse.Namespace) -> int:
    from gputui.cloud.pricing import on_demand_note, on_demand_price, quotes, resolve_on_demand
    from gputui.views import cloud as view

    ctx = context(args)
    with ctx.ledger:
        s = ctx.settings
        instance_type = args.instance_type or s.instance_type
        override = s.on_demand_price if instance_type == s.instance_type else None
        zones = list(s.zones) or ctx.provider.zones()
        on_demand = resolve_on_demand(ctx.price_source, instance_type, on_demand_price(instance_type, override))
        found = quotes(ctx.price_source, instance_type, zones, on_demand)
        note = on_demand_note(on_demand, s.region)
        if args.json:
            view.print_json({"region": s.region, "instance_type": instance_type, "quotes": view.quotes_json(found),
                             "on_demand_note": note})
        else:
            view.quotes_table(found, f"{instance_type} in {s.region}, $/h now", note)
    return 0


def cmd_guard(args: argparse.Namespace) -> int:
    import signal
    import threading

    from gputui.cloud import guardian
    from gputui.cloud.budget import BudgetGuard, guard_loop
    from gputui.cloud.leaks import exit_check
    from gputui.cloud.pricing import PriceBook
    from gputui.cloud.remote import cloud_checkpointer
    from gputui.views import cloud as view
    from gputui.model.errors import UserError

    if not args.interval > 0 or args.grace < 0:
        raise UserError("--interval must be > 0 and --grace >= 0")

    said = threading.Lock()

    def emit(event: Any) -> None:
        # The guard loop and the lease renewer's thread both emit: one line at a time (print writes
        # the text and its newline apart, and two threads' lines ran together into one).
        with said:
            if args.json:
                print(view.json_line(view.event_json(event)), flush=True)
            else:
                view.say(view.event_line(event))

    ctx = context(args, listener=emit)
    with ctx.ledger, guardian.exclusive(ctx) as mine:
        if not mine:
            if args.detached:
                return 0
            raise UserError(f"a budget guard already watches cluster {ctx.cluster} (see {guardian.log_path(ctx)})")
        checkpoint = cloud_checkpointer(ctx.settings) if ctx.provider.name == "ec2" else None
        guard = BudgetGuard(ctx, args.interval, checkpoint, args.grace)
        stop = threading.Event()
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
        # Ctrl-C (SIGINT) stops the guard even when it was started with SIGINT ignored (a parent
        # that ignores it passes that on through exec, as a test runner's worker may).
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
        view.say(f"guarding cluster {ctx.cluster} every {args.interval:g} s (budget {units.money(ctx.settings.budget_usd)})")
        try:
            from gputui.cloud.lease import LeaseRenewer

            with LeaseRenewer(ctx):  # the slaves' lease (their watchdog's), renewed while the guard lives
                guard_loop(ctx, guard, PriceBook(ctx.price_source), stop)
        except KeyboardInterrupt:
            view.say("interrupted")
        finally:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)
        if not guard.running():
            view.say(f"no slaves running in cluster {ctx.cluster}: the guard stops")
        return exit_check(ctx, view.interactive() and not args.detached, lambda q: view.confirm(q, False, "stop"), view.say)


def cmd_watch(args: argparse.Namespace) -> int:
    import os

    from gputui.cloud import watcher

    if args.imds is None:
        args.imds = os.environ.get("GPUTUI_IMDS_URL", watcher.IMDS_URL)
    return watcher.run(args)
