"""The training part of a cluster run: attempts, each one torchrun per node under one
rendezvous, monitored until every node has exited.

Each attempt has a fixed set of nodes, ranked here (gputui's static rendezvous,
gputui.train.launch: nothing a store holds is unpickled), and a fresh secret token for its
keys in the master's store: the master's own node gets it in its environment, a slave in a
0600 file written through a command's stdin (`rdzv.token` in its run directory).

An attempt ends in one of four ways (`Outcome`): the group finished (`done`), a stop was
requested (`interrupted`: the workers checkpointed), a node was lost or the group stopped
on a slave's SIGTERM (`relaunch`: the nodes are refilled and the next attempt resumes from
the newest checkpoint any node holds), or a failure (raised). Workers resume only when the
master names the checkpoint (`--gputui-resume`): from the second attempt on, or when the run
itself is resumed.
"""

from __future__ import annotations

import enum
import os
import queue
import time
from typing import Any

from gputui.cluster.context import RunContext
from gputui.cluster.identity import resume_ref
from gputui.cluster.members import STOP_GRACE_S, Node
from gputui.cluster.procs import LocalNode, RemoteNode, Rendezvous
from gputui.cluster.recovery import Recovery
from gputui.cluster.relay import Relay
from gputui.cluster.sshnode import sh
from gputui.cluster.stopping import Stopped
from gputui.model.errors import GputuiError, UserError
from gputui.runs.store import CHECKPOINT
from gputui.model.units import plural

EXIT_GRACE_S = 5.0  # after the group finished or stopped, how long the other nodes get to exit by themselves
TOKEN_FILE = "rdzv.token"  # in a slave's run directory: the attempt's rendezvous token (0600)
TOKEN_WRITE_S = 60.0  # how long writing it may take


class Outcome(enum.Enum):
    DONE = "done"
    INTERRUPTED = "interrupted"
    RELAUNCH = "relaunch"


class Attempts:
    """Runs attempts until one ends the run; `relay` holds what rank 0's events said."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.relay = Relay(ctx)
        self.recovery = Recovery(ctx)
        self.lost: set[str] = set()  # nodes lost in the current attempt
        self.failure: str | None = None  # why the current attempt cannot go on

    def run(self, resume: bool) -> Outcome:
        """DONE or INTERRUPTED; a GputuiError when the run cannot go on."""
        ctx, attempt = self.ctx, 0
        while True:
            outcome = self._attempt(attempt, resume=resume or attempt > 0)
            if outcome is not Outcome.RELAUNCH:
                return outcome
            self.relay.node_lost()
            attempt += 1
            if attempt > ctx.settings.max_restarts:
                raise GputuiError(f"cluster run stopped {attempt} times; giving up (max_restarts "
                                  f"{ctx.settings.max_restarts}); resume later with: gputui run --resume {resume_ref(ctx.run)}")
            why = "a node was lost" if self.lost else "the group stopped on a slave (a spot notice or the budget)"
            try:
                self.recovery.refill(self.lost)
            except Stopped:
                return Outcome.INTERRUPTED
            if ctx.stops.requested:
                return Outcome.INTERRUPTED
            ctx.emit("relaunch", attempt=attempt, from_step=self.relay.last_step, reason=why,
                     message=f"relaunching on {plural(len(ctx.group), 'node')} ({why}), resuming from the last checkpoint")

    def _attempt(self, attempt: int, resume: bool) -> Outcome:
        ctx = self.ctx
        rdzv = self._rendezvous(attempt)
        ctx.emit("cluster", attempt=attempt, nodes=[n.name for n in ctx.group], world_size=len(ctx.group) * rdzv.nproc_per_node,
                 min_nodes=rdzv.min_nodes, rdzv=rdzv.endpoint,
                 message=f"{plural(len(ctx.group), 'node')} x {plural(rdzv.nproc_per_node, 'process')}, rendezvous at {rdzv.endpoint}")
        self.relay.new_attempt()
        ctx.group.new_attempt()
        self.lost.clear()
        self.failure = None
        for rank, node in enumerate(ctx.group):
            if not ctx.stops.requested:
                self._start(node, rank, rdzv, resume)
        return self._monitor()

    def _rendezvous(self, attempt: int) -> Rendezvous:
        from gputui.train.rdzv import new_token

        ctx, s = self.ctx, self.ctx.settings
        env = {"GLOO_SOCKET_IFNAME": s.socket_ifname, "NCCL_SOCKET_IFNAME": s.socket_ifname} if s.socket_ifname else {}
        # The workers get a fresh store from their rank 0 each round (the launcher's handler does
        # not share the master's: keys of an earlier round would make a restarted group connect to dead peers).
        return Rendezvous(f"{ctx.store_host}:{ctx.store.port}", ctx.identity.rdzv_id(attempt), len(ctx.group),
                          min(s.min_nodes, len(ctx.group)), s.nproc_per_node, s.max_restarts, s.join_timeout,
                          token=new_token(), env=env)

    def _endpoint(self, node: Node) -> str:
        """host:port where `node`'s torchrun finds the store: through its own tunnel by default."""
        ctx = self.ctx
        if ctx.settings.rendezvous == "direct" or node.conn is None:
            return f"{ctx.store_host}:{ctx.store.port}"
        if node.forward is None or node.forward.transport is not node.conn.transport():
            node.forward = node.conn.forward_to_master(ctx.store.port)
        return node.forward.endpoint

    def _start(self, node: Node, rank: int, rdzv: Rendezvous, resume: bool) -> None:
        from gputui.train.rdzv import TOKEN_ENV, TOKEN_FILE_ENV

        ctx = self.ctx
        if node.log is None:
            (ctx.run.path / "nodes").mkdir(exist_ok=True)
            node.log = open(ctx.run.path / "nodes" / f"{node.name}.log", "a", encoding="utf-8")
        if node.kind == "master":
            run_dir = str(ctx.run.path)
            args = rdzv.torchrun_args(rank, node.address, run_dir, node.name, self._endpoint(node),
                                      resume=f"{run_dir}/{CHECKPOINT}" if resume else None)
            node.proc = LocalNode(node.name, ctx.items, args, {**rdzv.env, TOKEN_ENV: rdzv.token}, STOP_GRACE_S)
            return
        assert node.conn is not None and node.boot is not None
        run_dir = node.boot.run_dir(ctx.identity.slave_name)
        token_file = f"{run_dir}/{TOKEN_FILE}"
        put_secret(node.conn, rdzv.token, token_file)
        env = {**rdzv.env, "GPUTUI_HOME": node.boot.home, TOKEN_FILE_ENV: token_file}
        if node.kind == "cloud" and os.environ.get("GPUTUI_IMDS_URL"):  # another metadata endpoint for the watcher
            env["GPUTUI_IMDS_URL"] = os.environ["GPUTUI_IMDS_URL"]
        args = rdzv.torchrun_args(rank, node.address, run_dir, node.name, self._endpoint(node),
                                  resume=f"{run_dir}/{CHECKPOINT}" if resume else None)
        node.proc = RemoteNode(node.name, ctx.items, node.conn, node.boot.venv_python, node.boot.base, args, env,
                               STOP_GRACE_S, spot_watcher=node.kind == "cloud")

    # -- monitoring --------------------------------------------------------------------------
    def _monitor(self) -> Outcome:
        ctx, group = self.ctx, self.ctx.group
        running = {n.name for n in group if n.proc is not None}
        stop_sent = urgent_sent = False
        ended_at: float | None = None  # when the group had finished or stopped and a node had exited
        while running:
            if ended_at is None and self.relay.last_kind in ("done", "interrupted") and len(running) < len(group):
                ended_at = time.monotonic()
            # A torchrun stopped by a signal (a spot notice) never reaches torchrun's exit barrier,
            # where the others would wait 300 s: they have checkpointed; stop them.
            late = ended_at is not None and time.monotonic() - ended_at > EXIT_GRACE_S
            if (ctx.stops.requested or late) and not stop_sent:
                stop_sent = True
                group.stop(now=late and not ctx.stops.requested)
            if ctx.stops.urgent and not urgent_sent:  # a further Ctrl-C: no grace (the teardown still runs whole)
                urgent_sent = True
                group.stop(now=True)
            if group.overdue() and not group.killed:
                group.kill()
            self.pump(running)
        return self._outcome()

    def pump(self, running: set[str], timeout: float = 0.2) -> None:
        """Take one item of the nodes' output (a line, or an exit) within `timeout`."""
        try:
            name, kind, payload = self.ctx.items.get(timeout=timeout)
        except queue.Empty:
            return
        node = self.ctx.group.find(name)
        if node is None:
            return
        if kind == "line":
            self.relay.line(node, str(payload))
        elif name in running:
            running.discard(name)
            self._exited(node, int(payload))

    def _exited(self, node: Node, code: int) -> None:
        ctx = self.ctx
        if ctx.stops.requested or self.relay.last_kind in ("done", "error") or self.failure:
            return
        # After an `interrupted` event a node's exit is the group stopping (a slave's spot notice or
        # budget stop: every rank checkpointed), unless the slave's channel ended with no exit
        # status at all: its connection went (a dropped tunnel), and the master rank's own
        # `interrupted` (its peer gone) can come before that channel is seen closed.
        if self.relay.last_kind == "interrupted" and not (isinstance(node.proc, RemoteNode) and code == -1):
            return
        reason = node.proc.last_error() if node.proc else "gone"
        if not self.relay.started:  # torchrun could not even start: no point waiting for the others
            self.failure = f"torchrun on {node.name} failed before training started (exit {code}: {reason})"
            ctx.group.stop()
            return
        self.lost.add(node.name)
        self.relay.node_lost()
        step = self.relay.last_step
        ctx.emit("node_lost", node=node.name, exit_code=code, step=step, reason=reason,
                 message=f"{node.name} lost at step {step} (exit {code}: {reason}); stopping the other "
                 "nodes to relaunch from the last checkpoint")
        # A torchrun that stops closes its rendezvous for everyone: the group is relaunched under a new one.
        ctx.group.stop()

    def _outcome(self) -> Outcome:
        ctx, last = self.ctx, self.relay.last_event
        kind = self.relay.last_kind
        if kind == "done":
            return Outcome.DONE
        if ctx.stops.requested:
            return Outcome.INTERRUPTED
        if kind == "error" and last is not None:
            error = UserError if last.get("exit_code") == 2 else GputuiError
            raise error(str(last.get("message")))
        if self.failure:
            raise GputuiError(self.failure)
        if kind == "interrupted":
            return Outcome.RELAUNCH  # a slave's SIGTERM (spot notice, budget) stopped the group: it checkpointed
        if not self.relay.started:
            tails = "; ".join(f"{n.name}: {n.proc.last_error()}" for n in ctx.group if n.proc is not None)
            raise GputuiError(f"the cluster's torchrun failed before training started ({tails}); "
                              f"see {ctx.run.path / 'nodes'}")
        return Outcome.RELAUNCH


def put_secret(conn: Any, secret: str, remote: str) -> None:
    """`secret` into a file at `remote` that only the slave's user can read (created 0600, then
    renamed into place), sent on the command's stdin: a command line shows in `ps` to everyone."""
    from gputui.model.errors import GputuiError

    part = remote + ".part"
    command = "umask 077 && " + sh("rm", "-f", part) + " && cat > " + sh(part) + " && " + sh("mv", "-f", part, remote)
    try:
        channel = conn.open(command)
        channel.sendall(secret.encode("ascii"))
        channel.shutdown_write()
        done = channel.status_event.wait(TOKEN_WRITE_S)
        status = channel.recv_exit_status() if done else None
        channel.close()
    except GputuiError:
        raise
    except Exception as exc:  # noqa: BLE001 - a dropped connection is the slave's failure
        raise GputuiError(f"slave {conn.name}: cannot write the rendezvous token ({exc})") from None
    if status != 0:
        raise GputuiError(f"slave {conn.name}: writing the rendezvous token to {remote} failed "
                          f"({'no answer' if status is None else f'exit {status}'})")
