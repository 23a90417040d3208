"""`gputui cluster up|down|status|idle`: the master's slaves outside a run.

`up` starts the cloud slaves a run would need and bootstraps every slave (they then stay
up: a later `gputui run` reuses them); `down` terminates the cluster's cloud slaves;
`status` lists the nodes; `idle` terminates cloud slaves idle (no run, GPUs under 5%) for
idle_stop_minutes (`--watch`: check every minute until interrupted).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from gputui.model.units import plural


def register(subparsers: Any) -> None:
    cluster = subparsers.add_parser("cluster", help="bring a cluster's slaves up or down, list them, stop idle ones",
                                    description="Manage the slaves of a [cluster] profile outside a run.")
    sub = cluster.add_subparsers(dest="cluster_command", metavar="ACTION", required=True)
    for name, text in (("up", "start the missing cloud slaves and bootstrap every slave"),
                       ("down", "terminate the cluster's cloud slaves"),
                       ("status", "list the cluster's nodes"),
                       ("idle", "terminate cloud slaves idle for idle_stop_minutes")):
        action = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".",
                                aliases=["ls"] if name == "status" else [])  # `ls`, as gputui cloud ls
        action.add_argument("--profile", type=Path, default=None, help="cluster profile (default: profiles/cluster.toml)")
        action.add_argument("--json", action="store_true", help="print JSON on stdout")
        if name == "idle":
            action.add_argument("--watch", action="store_true", help="check every --interval seconds until interrupted")
            action.add_argument("--interval", type=float, default=60.0, help="seconds between checks (default 60)")
        action.set_defaults(handler=cmd_cluster, cluster_action=name)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cmd_cluster(args: argparse.Namespace) -> int:
    from gputui.cluster.settings import load_cluster
    from gputui.model.paths import profiles_dir

    settings = load_cluster(args.profile or profiles_dir() / "cluster.toml")
    manager = None
    if settings.cloud is not None:
        from gputui.cluster.manager import SlaveManager, cloud_context

        manager = SlaveManager(settings, cloud_context(settings))
    action = args.cluster_action
    if action == "status":
        nodes = [{"name": "master", "kind": "master", "address": "this machine", "trains": settings.master_trains}]
        nodes += [{"name": h.name, "kind": "host", "address": h.label()} for h in settings.hosts]
        if manager is not None:
            nodes += [{"name": i.instance_id, "kind": "cloud", "address": i.public_ip, "type": i.instance_type,
                       "last_busy": manager.store.last_busy(i.instance_id)} for i in manager.up()]
        if args.json:
            print(json.dumps({"cluster": settings.name, "nodes": nodes}))
        else:
            for n in nodes:
                print(f"{n['name']:<22} {n['kind']:<7} {n['address']}")
        return 0
    if action == "down":
        gone = _down(manager) if manager else []
        _say(f"cluster {settings.name}: {plural(len(gone), 'cloud slave')} terminated")
        if args.json:
            print(json.dumps({"terminated": gone}))
        return 0
    if action == "idle":
        return _idle(args, settings, manager)
    return _up(args, settings, manager)


def _down(manager: Any) -> list[str]:
    """Terminate the cluster's running cloud slaves; the ledger says the user ended them."""
    from gputui.cloud.lifecycle import terminate

    up = manager.up()
    terminate(manager.ctx, up, ended_by="user")
    for info in up:
        manager.store.forget(info.instance_id)
    return [i.instance_id for i in up]


def _up(args: argparse.Namespace, settings: Any, manager: Any) -> int:
    from gputui.cluster.bootstrap import Bootstrapper, local_dataset
    from gputui.cluster.sshnode import SlaveConnection
    from gputui.cluster.wheel import build_wheel
    from gputui.model.paths import bundled_mnist

    static = list(settings.hosts)[: settings.slaves_needed]
    missing = settings.slaves_needed - len(static)
    launched: list[str] = []  # as each launch returns: a failed wait for them to run still releases them
    try:
        cloud = manager.ensure(missing, minimum=max(0, settings.min_slaves - len(static)),
                               started=lambda infos: launched.extend(i.instance_id for i in infos)) \
            if missing and manager else []
    except BaseException:
        if launched:
            manager.release(launched, keep=False)
        raise
    connects = [(spec, lambda spec=spec: SlaveConnection(spec).open_or_raise()) for spec in static]
    connects += [(slave.spec, lambda slave=slave: manager.connect(slave, 300.0)) for slave in cloud]
    boot = Bootstrapper(settings.remote_dir, settings.python, build_wheel(), local_dataset(bundled_mnist()))
    done = []
    for spec, connect in connects:
        conn = connect()
        try:
            result = boot.bootstrap(conn)
        finally:
            conn.close()
        done.append({"node": spec.name, "skipped": result.skipped, "seconds": round(result.seconds, 3), "steps": result.steps})
        _say(f"{spec.name}: ready in {result.seconds:.2f} s" + (" (already bootstrapped)" if result.skipped else f" ({', '.join(result.steps)})"))
    if args.json:
        print(json.dumps({"cluster": settings.name, "nodes": done}))
    return 0


def _idle(args: argparse.Namespace, settings: Any, manager: Any) -> int:
    import signal
    import threading

    if manager is None:
        _say(f"cluster {settings.name}: no cloud slaves (no [cloud] table): nothing to stop")
        return 0
    stop = threading.Event()

    def interrupted(_signum: int, _frame: Any) -> None:
        """Ctrl-C is how --watch ends: the check under way finishes first; a second one stops at once."""
        stop.set()
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, interrupted) if args.watch else None
    try:
        while True:
            _idle_check(args, settings, manager)
            if not args.watch:
                return 0
            if stop.wait(args.interval):
                _say(f"cluster {settings.name}: idle watch stopped")
                return 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _idle_check(args: argparse.Namespace, settings: Any, manager: Any) -> None:
    """One look at the cloud slaves' GPUs; terminate those idle long enough."""
    import time

    from gputui.sources.ssh import SshSource

    up = manager.up()
    specs = {i.instance_id: manager.host_spec(i) for i in up}
    source = SshSource(list(specs.values()))
    try:
        snaps = {s.name: s for s in source.poll(settle=True, wait=30.0)}
    finally:
        source.close()

    def utilisation(info: Any) -> float | None:
        snap = snaps.get(info.instance_id)
        values = [g.util_pct for g in (snap.gpus if snap else ()) if g.util_pct is not None]
        return max(values) if values else None

    stopped = manager.idle_stop(utilisation)
    if args.json:
        print(json.dumps({"time": time.time(), "up": len(up), "terminated": stopped}), flush=True)
    elif stopped:
        _say(f"cluster {settings.name}: terminated idle {'slave' if len(stopped) == 1 else 'slaves'} {', '.join(stopped)}")
