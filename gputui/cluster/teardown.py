"""The end of every cluster run, however it ended: nodes stopped (then killed), the run closed
in the ledger, the cloud slaves it started released, connections and logs closed.

It cannot be skipped: signals only count while the run lives (gputui.cluster.stopping), each
step runs even when the one before failed, and a failure is reported, not raised. A
further Ctrl-C only drops the nodes' grace; `describe` says what is being waited for.
"""

from __future__ import annotations

import queue
import time

from gputui.cluster.context import Phase, RunContext
from gputui.cluster.members import KILL_MARGIN_S, STOP_GRACE_S
from gputui.cluster.relay import Relay
from gputui.model.text import clean
from gputui.model.units import plural

DRAIN_S = 15.0  # after a kill, how long the exits of the killed nodes may take to come in


def describe(ctx: RunContext) -> tuple[str, int, int]:
    """What stopping the run waits for now: (message, node processes running, slaves to release)."""
    procs = len(ctx.group.running())
    grace = (ctx.cfg.stop_grace_s + 1.0 if ctx.cfg.is_program else STOP_GRACE_S) + KILL_MARGIN_S
    slaves = 0 if ctx.settings.keep_slaves else len(ctx.slaves.pending())
    parts = []
    if ctx.phase is Phase.BRING_UP:
        parts.append("bring-up ends at its next step")
    if procs:
        parts.append(f"{plural(procs, 'node')} being stopped now" if ctx.stops.urgent else
                     f"waiting for {plural(procs, 'node')} to save a checkpoint and exit "
                     f"(at most {grace:.0f} s)")
    if slaves:
        parts.append(f"{plural(slaves, 'slave')} being released")
    if not parts:
        parts.append("closing connections")
    return "stopping: " + ", then ".join(parts), procs, slaves


def report_stop(ctx: RunContext, reason: str) -> None:
    """A `stopping` event (and its line) saying what the run waits for."""
    message, procs, slaves = describe(ctx)
    ctx.emit("stopping", message=message, slaves=slaves, processes=procs, reason=reason)


def teardown(ctx: RunContext, relay: Relay | None, outcome: str) -> None:
    """Every step of the end, each one whatever happened to the others."""
    ctx.phase = Phase.TEARDOWN
    if ctx.stops.requested:
        report_stop(ctx, ctx.stops.reason or "stop")
    for step in (lambda: _stop_nodes(ctx, relay), lambda: _end_ledger_run(ctx, outcome), lambda: _release(ctx)):
        try:
            step()
        except Exception as exc:  # noqa: BLE001 - the next steps run anyway; this one is reported
            ctx.emit("warning", reason="teardown", message=f"teardown: {clean(str(exc) or type(exc).__name__, 300)}")
    ctx.group.close()
    ctx.store = None
    ctx.phase = Phase.ENDED


def _stop_nodes(ctx: RunContext, relay: Relay | None) -> None:
    """Stop the nodes still running (the grace, or none after a further Ctrl-C), then kill them."""
    group = ctx.group
    running = {n.name for n in group.running()}
    if not running:
        return
    group.stop(now=ctx.stops.urgent)
    urgent = ctx.stops.urgent
    grace = (ctx.cfg.stop_grace_s + 1.0 if ctx.cfg.is_program else STOP_GRACE_S) + KILL_MARGIN_S
    while running and not group.overdue(grace):
        if ctx.stops.urgent and not urgent:
            urgent = True
            group.stop(now=True)
        _take(ctx, relay, running, 0.2)
    if running:
        group.kill()
        deadline = time.monotonic() + DRAIN_S
        while running and time.monotonic() < deadline:
            _take(ctx, relay, running, 0.2)


def _take(ctx: RunContext, relay: Relay | None, running: set[str], timeout: float) -> None:
    try:
        name, kind, payload = ctx.items.get(timeout=timeout)
    except queue.Empty:
        return
    node = ctx.group.find(name)
    if kind == "line" and node is not None and relay is not None:
        relay.line(node, str(payload))  # a trainer's last events (its checkpoint) still count
    elif kind == "exit":
        running.discard(name)


def _end_ledger_run(ctx: RunContext, outcome: str) -> None:
    if ctx.ledger_run and ctx.manager is not None:
        ctx.manager.ctx.ledger.end_run(ctx.run.run_id, time.time(), outcome)


def _release(ctx: RunContext) -> None:
    """Stop renewing the slaves' lease; terminate the cloud slaves this run started (unless keep_slaves)."""
    if ctx.lease is not None:
        ctx.lease.stop()
    pending = ctx.slaves.pending()
    if not pending or ctx.manager is None:
        return
    try:
        gone = ctx.manager.release(pending)
    except Exception as exc:  # noqa: BLE001 - the cloud's failure, whatever it is, must be said
        ctx.emit("warning", reason="release", message=f"could not terminate the slaves this run started "
                 f"({', '.join(pending)}): {clean(str(exc), 300)}; run: {_down(ctx)}")
        return
    ctx.slaves.released += pending
    if gone:
        ctx.emit("slaves_terminated", instances=gone, message=f"{plural(len(gone), 'cloud slave')} terminated")
    elif ctx.settings.keep_slaves:
        _hand_to_guard(ctx, pending)


GUARD_INTERVAL_S = 30.0  # as `gputui cloud up`'s guard


def _down(ctx: RunContext) -> str:
    from gputui.cloud.leaks import down_command

    return down_command(ctx.manager.ctx, ctx.manager.ctx.cluster)


def _hand_to_guard(ctx: RunContext, kept: list[str]) -> None:
    """keep_slaves: the run no longer renews the kept slaves' lease, so a detached budget guard
    takes over (unless one already watches the cluster); without it they would power
    themselves off once the lease passes."""
    from gputui.cloud import guardian
    from gputui.cloud.leaks import cloud_command, down_command

    cloud = ctx.manager.ctx
    try:
        pid = guardian.spawn(cloud, GUARD_INTERVAL_S)
    except OSError as exc:
        ctx.emit("warning", reason="guard", message=f"kept {plural(len(kept), 'slave')} but could not start their "
                 f"budget guard ({clean(str(exc), 200)}): they power themselves off when their lease passes; "
                 f"run: {cloud_command('guard', cloud.provider.name, profile=cloud.settings.source, region=cloud.provider.region, cluster=cloud.cluster)}")
        return
    who = f"a budget guard (pid {pid})" if pid is not None else "the cluster's budget guard"
    ctx.emit("warning", reason="keep_slaves", message=f"kept {plural(len(kept), 'slave')} ({', '.join(kept)}): "
             f"{who} renews their lease; release them with {down_command(cloud, cloud.cluster)}")
