"""Between two attempts of a cluster run: replace the nodes lost (a new cloud slave, or the
same host again over a fresh connection) or drop them while at least min_nodes remain.

A replacement cloud slave is recorded in the run's context the moment its launch returns
(the teardown releases it whatever happens next), and a stop request ends the waits for it.
"""

from __future__ import annotations

from gputui.cluster.bringup import connect_cloud, connect_host, prepare, record_started
from gputui.cluster.context import RunContext
from gputui.cluster.identity import resume_ref
from gputui.cluster.members import Node
from gputui.model.errors import GputuiError
from gputui.model.units import plural


class Recovery:
    """Replaces or drops lost nodes; at most max_restarts replacements in a run."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.replacements = 0

    def refill(self, lost: set[str]) -> None:
        """Before a relaunch: each node lost (or whose slave or connection is gone) replaced or dropped."""
        ctx = self.ctx
        for node in ctx.group:
            gone = node.name in lost
            if node.kind == "cloud" and ctx.manager is not None and node.instance_id is not None:
                alive = [i for i in ctx.manager.ctx.provider.describe([node.instance_id]) if i.state == "running"]
                gone = gone or not alive
            if not gone and (node.conn is None or node.conn.connected):
                continue
            ctx.stops.check()
            replacement = self._replace(node)
            if replacement is None:
                ctx.group.nodes.remove(node)
                ctx.emit("node_dropped", node=node.name, nodes=len(ctx.group),
                         message=f"going on without {node.name}: {plural(len(ctx.group), 'node')} left")
            elif replacement is not node:
                ctx.emit("node_replaced", node=node.name, by=replacement.name,
                         message=f"{replacement.name} ({replacement.address}) takes the place of {node.name}")
        if len(ctx.group) < ctx.settings.min_nodes:
            raise GputuiError(f"only {plural(len(ctx.group), 'node')} left, fewer than min_nodes {ctx.settings.min_nodes}; "
                              f"resume later with: gputui run --resume {resume_ref(ctx.run)}")

    def _replace(self, node: Node) -> Node | None:
        """A node to take a lost one's place: a new cloud slave, or the same host/master again."""
        ctx = self.ctx
        if self.replacements >= ctx.settings.max_restarts:
            return None
        self.replacements += 1
        try:
            if node.kind == "cloud" and ctx.manager is not None and node.instance_id is not None:
                slave = ctx.manager.replace(node.instance_id, started=record_started(ctx), sleep=ctx.stops.sleep)
                if slave is None:
                    return None
                for closing in (node.conn, node.log):
                    if closing is not None:
                        closing.close()
                new = Node(slave.instance_id, "cloud", slave.spec.address, slave.spec, instance_id=slave.instance_id)
                ctx.group.nodes[ctx.group.nodes.index(node)] = new  # in the group first: the teardown closes it
                new.conn = connect_cloud(ctx, slave)
                new.address = new.conn.address
            else:  # the same host (or the master) again, over a fresh connection
                new = node
                if node.conn is not None:
                    node.conn.close()
                    assert node.spec is not None
                    node.conn = connect_host(ctx, node.spec)
            if new.conn is not None:
                prepare(ctx, new)
            return new
        except GputuiError as exc:
            ctx.emit("node_unavailable", node=node.name, message=f"{node.name} cannot be replaced: {exc}")
            return None
