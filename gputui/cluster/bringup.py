"""Bringing a cluster run's nodes up: connect the static slaves, start the missing cloud
slaves, wait for their SSH, bootstrap every slave, serve the rendezvous.

A stop request is looked at between every step and in every wait (a booting slave's SSH,
its host key, the cloud's launch), so Ctrl-C ends a bring-up within a step rather than
after it, and nothing a step started is lost: each cloud slave is recorded in the run's
context the moment its launch returns, before the wait for it to run.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

from gputui.runs import store as runs
from gputui.cluster.bootstrap import Bootstrapper, local_dataset
from gputui.cluster.context import CLOUD_SSH_WAIT_S, RunContext
from gputui.cluster.members import Node
from gputui.cluster.sshnode import SlaveConnection, quote_path
from gputui.model.errors import GputuiError, UserError
from gputui.config.hosts import HostSpec
from gputui.model.paths import bundled_mnist
from gputui.model.units import plural

T = TypeVar("T")
R = TypeVar("R")


def in_parallel(work: Callable[[T], R], items: Sequence[T], cleanup: Callable[[R], None] = lambda r: None) -> list[R]:
    """`work` on every item at once; the first failure (a stop included) is raised once all are
    done, after `cleanup` of the results that came (no connection outlives a failed step)."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        futures = [pool.submit(work, item) for item in items]
    failed = [f.exception() for f in futures if f.exception() is not None]
    done = [f.result() for f in futures if f.exception() is None]
    if failed:
        for result in done:
            cleanup(result)
        raise failed[0]  # type: ignore[misc]
    return done


def connect_host(ctx: RunContext, spec: HostSpec) -> SlaveConnection:
    ctx.stops.check()
    return SlaveConnection(spec).open_or_raise()


def connect_cloud(ctx: RunContext, slave: Any) -> SlaveConnection:
    """SSH to a cloud slave, waiting for it to boot; a stop ends the wait."""
    ctx.stops.check()
    return ctx.manager.connect(slave, CLOUD_SSH_WAIT_S, sleep=ctx.stops.sleep)  # type: ignore[no-any-return]


def record_started(ctx: RunContext) -> Callable[[Sequence[Any]], None]:
    """What the cloud launch calls with the instances each launch returned."""
    return lambda infos: ctx.slaves.add([i.instance_id for i in infos])


def prepare(ctx: RunContext, node: Node) -> None:
    """Bootstrap a slave and give it this run's directory (profile, and the checkpoint if any)."""
    assert node.conn is not None and ctx.bootstrapper is not None
    boot = ctx.bootstrapper.bootstrap(node.conn, check=ctx.stops.check)
    node.boot = boot
    run_dir = boot.run_dir(ctx.identity.slave_name)
    ctx.stops.check()
    node.conn.check(f"mkdir -p {quote_path(run_dir)}", what="creating the run directory")
    node.conn.put_text(replace(ctx.cfg, data=boot.data_dir).to_toml(), f"{run_dir}/{runs.PROFILE}")
    if ctx.run.checkpoint.is_file():
        node.conn.put(ctx.run.checkpoint, f"{run_dir}/{runs.CHECKPOINT}")
    ctx.emit("node", node=node.name, kind=node.kind, address=node.address, bootstrap_s=round(boot.seconds, 3),
             skipped=boot.skipped, steps=boot.steps, python=boot.python, torch=boot.torch,
             message=f"{node.name} ({node.address}) ready in {boot.seconds:.2f} s"
             + (" (already bootstrapped)" if boot.skipped else f": {', '.join(boot.steps) or 'checked'}"))


def bring_up(ctx: RunContext) -> None:
    """Every node of the run ready to start torchrun, and the rendezvous served."""
    s = ctx.settings
    refused = s.master_unreachable()
    if refused:  # before any connection or launch: nothing to undo
        raise UserError(refused)
    data = Path(ctx.cfg.data) if ctx.cfg.data else bundled_mnist()
    static = list(s.hosts)[: s.slaves_needed]
    conns = in_parallel(lambda spec: connect_host(ctx, spec), static, lambda c: c.close())
    ctx.group.nodes = [Node(c.name, "host", c.address, spec, c) for spec, c in zip(static, conns)]
    ctx.stops.check()
    cloud_count = s.slaves_needed - len(static)
    if cloud_count:
        _start_cloud(ctx, cloud_count, max(0, s.min_slaves - len(static)))
    slaves_up = [n for n in ctx.group if n.conn is not None]
    ctx.master_addr = s.master_addr or next((a for a in (n.conn.local_address() for n in slaves_up if n.conn) if a), None) \
        or "127.0.0.1"
    if s.master_trains:
        ctx.group.nodes.insert(0, Node("master", "master", ctx.master_addr))
    if slaves_up:
        from gputui.cluster.wheel import build_wheel

        ctx.stops.check()
        ctx.bootstrapper = Bootstrapper(s.remote_dir, s.python, build_wheel(), local_dataset(data))
        in_parallel(lambda node: prepare(ctx, node), slaves_up)
    ctx.stops.check()
    _serve_rendezvous(ctx)


def _start_cloud(ctx: RunContext, count: int, minimum: int) -> None:
    s = ctx.settings
    if ctx.manager is None:
        from gputui.cluster.manager import SlaveManager, cloud_context

        ctx.manager = SlaveManager(s, cloud_context(s))
    ctx.manager.ctx.ledger.start_run(ctx.run.run_id, s.name, time.time())  # slaves with a run are not idle
    ctx.ledger_run = True
    if ctx.lease is None:  # the slaves' lease, renewed while the run holds them (teardown stops it)
        from gputui.cloud.lease import LeaseRenewer

        ctx.lease = LeaseRenewer(ctx.manager.ctx).start()
    slaves = ctx.manager.ensure(count, minimum=minimum, started=record_started(ctx), sleep=ctx.stops.sleep)
    ours = [x.instance_id for x in slaves if x.started_here]
    if ours:
        ctx.emit("slaves_started", instances=ours, message=f"{plural(len(ours), 'cloud slave')} started")
    for slave in slaves:
        conn = connect_cloud(ctx, slave)
        ctx.group.nodes.append(Node(slave.instance_id, "cloud", conn.address, slave.spec, conn,
                                    instance_id=slave.instance_id))


def _serve_rendezvous(ctx: RunContext) -> None:
    """The rendezvous store, on the master's loopback (slaves come through their SSH tunnel), or
    with rendezvous = "direct" on master_addr alone, said out loud."""
    from gputui.train.rdzv import LOOPBACK, serve_store

    s = ctx.settings
    host = ctx.master_addr if s.rendezvous == "direct" else LOOPBACK
    ctx.store_host = host
    try:
        ctx.store = serve_store(host, s.rdzv_port, s.join_timeout)
    except (RuntimeError, ValueError, OSError) as exc:
        raise GputuiError(f"cannot serve the rendezvous on {host}:{s.rdzv_port} ({exc}); "
                          f"set [cluster] rdzv_port to a free port in {s.source}") from None
    if s.rendezvous == "direct":
        ctx.emit("warning", message=f"rendezvous = \"direct\": the store on {host}:{ctx.store.port} is open to "
                 "whoever reaches that port: they cannot run code (nothing read from it is unpickled) but can "
                 "disturb or stop the run; use \"tunnel\" unless this network is trusted")
