"""The master's side of a cluster run: bring the nodes up, start one torchrun per node,
relay rank 0's events into the master's run directory, recover from lost nodes, tear down.

The master serves the c10d rendezvous store itself (a TCPStore on `master_addr:rdzv_port`),
so no node is special and losing any node never loses the rendezvous. Every node runs
`torchrun --nnodes MIN:MAX --max-restarts R`: a dead trainer is restarted in place by
torchrun, and the ranks resume from the newest checkpoint any node holds (see
gputui.cluster.worker). A node whose torchrun is gone is replaced (a new cloud slave, or
the same host again) while the others wait in the rendezvous, or dropped when at least
min_nodes remain. When the whole group stopped on a slave's SIGTERM (a spot interruption
notice, the budget guard), the master relaunches it on the nodes it has, resuming.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, TextIO

from gputui import runs
from gputui.cluster.bootstrap import Bootstrapped, Bootstrapper, local_dataset
from gputui.cluster.node import NODE_TAG
from gputui.cluster.procs import Item, LocalNode, NodeProc, RemoteNode, Rendezvous
from gputui.cluster.settings import ClusterSettings, load_cluster
from gputui.cluster.sshnode import SlaveConnection, quote_path
from gputui.cluster.tunnel import ReverseForward
from gputui.cluster.worker import EVENT_TAG
from gputui.console import JsonView, View
from gputui.errors import GputuiError, UserError
from gputui.hosts import HostSpec
from gputui.model.text import clean, clean_tree
from gputui.paths import bundled_mnist
from gputui.profiles import RunConfig
from gputui.supervisor import GRACE_S

CLOUD_SSH_WAIT_S = 300.0
STOP_GRACE_S = GRACE_S  # longer than torchrun's own shutdown timeout
EXIT_GRACE_S = 5.0  # after the group finished or stopped, how long the other nodes get to exit by themselves


@dataclass
class Node:
    """One training node: the master's own, a static SSH host or a cloud slave."""

    name: str
    kind: str  # "master", "host" or "cloud"
    address: str  # what its torchrun advertises (--local-addr)
    spec: HostSpec | None = None
    conn: SlaveConnection | None = None
    boot: Bootstrapped | None = None
    instance_id: str | None = None
    proc: NodeProc | None = None
    log: TextIO | None = field(default=None, repr=False)
    forward: ReverseForward | None = field(default=None, repr=False)  # its way to the rendezvous (tunnel)


class ClusterRun:
    """One `gputui run` on a cluster."""

    def __init__(self, run: runs.RunDir, cfg: RunConfig, settings: ClusterSettings, view: View,
                 manager: Any = None, say: Callable[[str], None] | None = None) -> None:
        if cfg.strategy == "dataparallel":
            raise UserError(f"{settings.source}: a cluster trains with ddp across its nodes; remove "
                            "strategy = \"dataparallel\" from [run]")
        self.run, self.settings, self.view = run, settings, view
        self.cfg = replace(cfg, strategy="ddp", nproc=settings.nproc_per_node)
        self.manager = manager
        self.say = say or ((lambda m: None) if isinstance(view, JsonView) else (lambda m: print(clean(m, 2000), file=sys.stderr)))
        self.items: "queue.Queue[Item]" = queue.Queue()
        self.nodes: list[Node] = []
        self.started_ids: list[str] = []  # cloud slaves this run launched
        self.store: Any = None
        self.store_host = "127.0.0.1"
        self.master_addr = "127.0.0.1"
        self.stop_reason: str | None = None
        self.last_event: dict[str, Any] | None = None
        self.last_step = 0
        self.lost_at: int | None = None  # step seen when a node was lost, until the resume
        self.failure: str | None = None
        self.replacements = 0
        self.lost: set[str] = set()  # nodes lost in the current attempt
        self.started_this_attempt = False
        self.log: runs.EventLog | None = None

    # -- events ----------------------------------------------------------------------------
    def emit(self, event_name: str, /, **fields: Any) -> None:
        """A master-side event on the run (events.jsonl, the view, and a line on stderr)."""
        event = {"event": event_name, "time": round(time.time(), 3), **fields}
        self._write(event)
        text = fields.get("message") or ", ".join(f"{k} {v}" for k, v in fields.items() if not isinstance(v, (list, dict)))
        self.say(f"cluster: {event_name}: {text}")

    def _write(self, event: dict[str, Any]) -> None:
        assert self.log is not None
        self.log.write(runs.encode(event))
        self.view.show(event)

    # -- the run ---------------------------------------------------------------------------
    def execute(self, resume: bool) -> str:
        self.log = runs.EventLog(self.run.events)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.run.profile.write_text(self.cfg.to_toml(), encoding="utf-8")
            self._bring_up()
            self.outcome = self._train()
            return self.outcome
        finally:
            try:
                self._teardown()
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                self.log.close()

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stop_reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.stop_reason = signal.Signals(signum).name

    def _bring_up(self) -> None:
        s = self.settings
        data = Path(self.cfg.data) if self.cfg.data else bundled_mnist()
        static = list(s.hosts)[: s.slaves_needed]
        cloud_count = s.slaves_needed - len(static)
        with ThreadPoolExecutor(max_workers=max(1, len(static))) as pool:
            futures = [pool.submit(self._connect, spec) for spec in static]
        failed = [f.exception() for f in futures if f.exception() is not None]
        conns = [f.result() for f in futures if f.exception() is None]
        if failed:
            for conn in conns:  # no connection outlives a failed bring-up
                conn.close()
            raise failed[0]  # type: ignore[misc]
        self.nodes = [Node(c.name, "host", c.address, spec, c) for spec, c in zip(static, conns)]
        if cloud_count:
            if self.manager is None:
                from gputui.cluster.manager import SlaveManager, cloud_context

                self.manager = SlaveManager(s, cloud_context(s))
            self.manager.ctx.ledger.start_run(self.run.run_id, s.name, time.time())  # slaves with a run are not idle
            slaves = self.manager.ensure(cloud_count, minimum=max(0, s.min_slaves - len(static)))
            self.started_ids += [x.instance_id for x in slaves if x.started_here]
            if self.started_ids:
                self.emit("slaves_started", instances=list(self.started_ids), message=f"{len(self.started_ids)} cloud slave(s) started")
            for slave in slaves:
                conn = self.manager.connect(slave, CLOUD_SSH_WAIT_S)
                self.nodes.append(Node(slave.instance_id, "cloud", conn.address, slave.spec, conn, instance_id=slave.instance_id))
        slaves_up = [n for n in self.nodes if n.conn is not None]
        self.master_addr = s.master_addr or next((a for a in (n.conn.local_address() for n in slaves_up if n.conn) if a), None) or "127.0.0.1"
        if s.master_trains:
            self.nodes.insert(0, Node("master", "master", self.master_addr))
        if slaves_up:
            from gputui.cluster.wheel import build_wheel

            self.bootstrapper = Bootstrapper(s.remote_dir, s.python, build_wheel(), local_dataset(data))
            with ThreadPoolExecutor(max_workers=len(slaves_up)) as pool:
                list(pool.map(self._prepare, slaves_up))
        self._serve_rendezvous()

    def _connect(self, spec: HostSpec, wait_s: float = 0.0) -> SlaveConnection:
        return SlaveConnection(spec).open_or_raise(wait_s)

    def _prepare(self, node: Node) -> None:
        """Bootstrap a slave and give it this run's directory (profile, and the checkpoint if any)."""
        assert node.conn is not None
        boot = self.bootstrapper.bootstrap(node.conn)
        node.boot = boot
        run_dir = boot.run_dir(self.run.run_id)
        node.conn.check(f"mkdir -p {quote_path(run_dir)}", what="creating the run directory")
        node.conn.put_text(replace(self.cfg, data=boot.data_dir).to_toml(), f"{run_dir}/{runs.PROFILE}")
        if self.run.checkpoint.is_file():
            node.conn.put(self.run.checkpoint, f"{run_dir}/{runs.CHECKPOINT}")
        self.emit("node", node=node.name, kind=node.kind, address=node.address, bootstrap_s=round(boot.seconds, 3),
                  skipped=boot.skipped, steps=boot.steps, python=boot.python, torch=boot.torch,
                  message=f"{node.name} ({node.address}) ready in {boot.seconds:.2f} s"
                  + (" (already bootstrapped)" if boot.skipped else f": {', '.join(boot.steps) or 'checked'}"))

    def _serve_rendezvous(self) -> None:
        """The c10d store, on the master's loopback (slaves come through their SSH tunnel), or
        with rendezvous = "direct" on master_addr alone, said out loud."""
        from gputui.train.rdzv import LOOPBACK, serve_store

        s = self.settings
        host = self.master_addr if s.rendezvous == "direct" else LOOPBACK
        self.store_host = host
        try:
            self.store = serve_store(host, s.rdzv_port, s.join_timeout)
        except (RuntimeError, ValueError, OSError) as exc:
            raise GputuiError(f"cannot serve the rendezvous on {host}:{s.rdzv_port} ({exc}); "
                              f"set [cluster] rdzv_port to a free port in {s.source}") from None
        if s.rendezvous == "direct":
            self.emit("warning", message=f"rendezvous = \"direct\": the store on {host}:{self.store.port} is open to "
                      "whoever reaches that port, and they can run code on every node; use \"tunnel\" unless "
                      "this network is trusted")

    def _endpoint(self, node: Node) -> str:
        """host:port where `node`'s torchrun finds the store: through its own tunnel by default."""
        if self.settings.rendezvous == "direct" or node.conn is None:
            return f"{self.store_host}:{self.store.port}"
        if node.forward is None or node.forward.transport is not node.conn.transport():
            node.forward = node.conn.forward_to_master(self.store.port)
        return node.forward.endpoint

    def _rendezvous(self, attempt: int) -> Rendezvous:
        s = self.settings
        env = {"GLOO_SOCKET_IFNAME": s.socket_ifname, "NCCL_SOCKET_IFNAME": s.socket_ifname} if s.socket_ifname else {}
        # Workers get a fresh store from their rank 0 each round: in the master's long-lived rendezvous
        # store, keys of an earlier round would make a restarted group connect to dead peers.
        env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        return Rendezvous(f"{self.store_host}:{self.store.port}", f"{self.run.run_id}-{attempt}",
                          min(s.min_nodes, len(self.nodes)), max(s.nodes, len(self.nodes)), s.nproc_per_node,
                          s.max_restarts, s.join_timeout, env=env)

    def _start(self, node: Node, rdzv: Rendezvous) -> None:
        if node.log is None:
            (self.run.path / "nodes").mkdir(exist_ok=True)
            node.log = open(self.run.path / "nodes" / f"{node.name}.log", "a", encoding="utf-8")
        if node.kind == "master":
            node.proc = LocalNode(node.name, self.items,
                                  rdzv.torchrun_args(node.address, str(self.run.path), node.name, self._endpoint(node)),
                                  rdzv.env, STOP_GRACE_S)
        else:
            assert node.conn is not None and node.boot is not None
            run_dir = node.boot.run_dir(self.run.run_id)
            env = {**rdzv.env, "GPUTUI_HOME": node.boot.home}
            if node.kind == "cloud" and os.environ.get("GPUTUI_IMDS_URL"):  # another metadata endpoint for the watcher
                env["GPUTUI_IMDS_URL"] = os.environ["GPUTUI_IMDS_URL"]
            node.proc = RemoteNode(node.name, self.items, node.conn, node.boot.venv_python, node.boot.base,
                                   rdzv.torchrun_args(node.address, run_dir, node.name, self._endpoint(node)), env,
                                   STOP_GRACE_S,
                                   spot_watcher=node.kind == "cloud")

    def _train(self) -> str:
        attempt = 0
        while True:
            rdzv = self._rendezvous(attempt)
            self.emit("cluster", attempt=attempt, nodes=[n.name for n in self.nodes], world_size=len(self.nodes) * rdzv.nproc_per_node,
                      min_nodes=rdzv.min_nodes, rdzv=rdzv.endpoint,
                      message=f"{len(self.nodes)} node(s) x {rdzv.nproc_per_node} process(es), rendezvous at {rdzv.endpoint}")
            self.started_this_attempt = False
            for node in self.nodes:
                self._start(node, rdzv)
            outcome = self._monitor()
            if outcome != "relaunch":
                return outcome
            if self.lost_at is None:
                self.lost_at = self.last_step
            attempt += 1
            if attempt > self.settings.max_restarts:
                raise GputuiError(f"cluster run stopped {attempt} times; giving up (max_restarts "
                                  f"{self.settings.max_restarts}); resume later with: gputui run --resume {self.run.run_id}")
            self._refill()
            self.emit("relaunch", attempt=attempt, from_step=self.last_step,
                      message=f"relaunching on {len(self.nodes)} node(s), resuming from the last checkpoint")

    def _monitor(self) -> str:
        running = {n.name for n in self.nodes if n.proc is not None}
        stop_sent = False
        ended_at: float | None = None  # when the group had finished or stopped and a node had exited
        while running:
            if ended_at is None and (self.last_event or {}).get("event") in ("done", "interrupted") \
                    and len(running) < len(self.nodes):
                ended_at = time.monotonic()
            # A torchrun stopped by a signal (a spot notice) never reaches torchrun's exit barrier,
            # where the others would wait 300 s: they have checkpointed; stop them.
            late = ended_at is not None and time.monotonic() - ended_at > EXIT_GRACE_S
            if (self.stop_reason or late) and not stop_sent:
                stop_sent = True
                self._stop_all(now=late and not self.stop_reason)
            try:
                name, kind, payload = self.items.get(timeout=0.2)
            except queue.Empty:
                continue
            found = next((n for n in self.nodes if n.name == name), None)
            if found is None:
                continue
            if kind == "line":
                self._line(found, str(payload))
            elif name in running:
                running.discard(name)
                self._exited(found, int(payload), running)
        return self._outcome()

    def _line(self, node: Node, text: str) -> None:
        if text.startswith(EVENT_TAG):
            try:
                event = clean_tree(json.loads(text[len(EVENT_TAG):]))  # a slave's words are data
            except json.JSONDecodeError:
                return
            if isinstance(event, dict):
                self._relay(event)
        elif not text.startswith(NODE_TAG):
            if node.proc is not None:
                node.proc.tail.append(text)
            if node.log is not None:
                node.log.write(text + "\n")
                node.log.flush()

    def _relay(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        self._write(event)
        if kind == "start":
            self.started_this_attempt = True
            self.rank0_node = event.get("node")
            resumed = event.get("resumed_from_step")
            if self.lost_at is not None and resumed is not None:
                self.emit("resumed", from_step=resumed, lost_steps=max(0, self.lost_at - resumed), nodes=event.get("nodes"),
                          message=f"resumed at step {resumed} on {event.get('nodes')} node(s) "
                          f"({max(0, self.lost_at - resumed)} step(s) redone)")
                self.lost_at = None
        elif kind == "restarted" and self.lost_at is None:
            self.lost_at = self.last_step
        if isinstance(event.get("step"), int):
            self.last_step = max(self.last_step, event["step"]) if kind != "start" else self.last_step
        if kind in ("epoch", "interrupted", "done") and not self.settings.master_trains:
            self._fetch_checkpoint()
        if kind != "restarted":
            self.last_event = event

    def _fetch_checkpoint(self) -> None:
        """Without a master node, bring rank 0's node's checkpoint into the master's run directory."""
        node = next((n for n in self.nodes if n.name == getattr(self, "rank0_node", None) and n.conn and n.boot), None)
        if node is not None and node.conn is not None and node.boot is not None:
            from gputui.train import checkpoint

            try:  # a slave's file is data: bounded and checked before it replaces the last good one
                node.conn.get(f"{node.boot.run_dir(self.run.run_id)}/{runs.CHECKPOINT}", self.run.checkpoint,
                              max_bytes=checkpoint.MAX_BYTES, check=lambda copy: checkpoint.load(Path(copy)))
            except GputuiError as exc:
                self.emit("warning", node=node.name, message=f"checkpoint from {node.name} refused: {exc}")

    def _exited(self, node: Node, code: int, running: set[str]) -> None:
        kind = (self.last_event or {}).get("event")
        if self.stop_reason or kind in ("done", "error", "interrupted") or self.failure:
            return
        reason = node.proc.last_error() if node.proc else "gone"
        if not self.started_this_attempt:  # torchrun could not even start: no point waiting for the others
            self.failure = f"torchrun on {node.name} failed before training started (exit {code}: {reason})"
            self._stop_all()
            return
        self.lost.add(node.name)
        if self.lost_at is None:
            self.lost_at = self.last_step
        self.emit("node_lost", node=node.name, exit_code=code, step=self.last_step, reason=reason,
                  message=f"{node.name} lost at step {self.last_step} (exit {code}: {reason}); stopping the other "
                  "nodes to relaunch from the last checkpoint")
        # A torchrun that stops closes its rendezvous for everyone: the group is relaunched under a new one.
        self._stop_all()

    def _stop_all(self, now: bool = False) -> None:
        for other in self.nodes:
            if other.proc is not None:
                other.proc.stop(now)

    def _replace(self, node: Node) -> Node | None:
        """A node to take a lost one's place: a new cloud slave, or the same host/master again."""
        if self.replacements >= self.settings.max_restarts:
            return None
        self.replacements += 1
        try:
            if node.kind == "cloud" and self.manager is not None and node.instance_id is not None:
                slave = self.manager.replace(node.instance_id)
                if slave is None:
                    return None
                self.started_ids.append(slave.instance_id)
                if node.conn is not None:
                    node.conn.close()
                conn = self.manager.connect(slave, CLOUD_SSH_WAIT_S)
                new = Node(slave.instance_id, "cloud", conn.address, slave.spec, conn, instance_id=slave.instance_id)
                self.nodes[self.nodes.index(node)] = new
            else:  # the same host (or the master) again, over a fresh connection
                new = node
                if node.conn is not None:
                    node.conn.close()
                    assert node.spec is not None
                    node.conn = self._connect(node.spec)
            if new.conn is not None:
                self._prepare(new)
            return new
        except GputuiError as exc:
            self.emit("node_unavailable", node=node.name, message=f"{node.name} cannot be replaced: {exc}")
            return None

    def _refill(self) -> None:
        """Before a relaunch: replace the nodes lost (or interrupted) or drop them; keep at least min_nodes."""
        for node in list(self.nodes):
            lost = node.name in self.lost
            if node.kind == "cloud" and self.manager is not None and node.instance_id is not None:
                alive = [i for i in self.manager.ctx.provider.describe([node.instance_id]) if i.state == "running"]
                lost = lost or not alive
            if not lost and (node.conn is None or node.conn.connected):
                continue
            replacement = self._replace(node)
            if replacement is None:
                self.nodes.remove(node)
                self.emit("node_dropped", node=node.name, nodes=len(self.nodes),
                          message=f"going on without {node.name}: {len(self.nodes)} node(s) left")
            elif replacement is not node:
                self.emit("node_replaced", node=node.name, by=replacement.name,
                          message=f"{replacement.name} ({replacement.address}) takes the place of {node.name}")
        self.lost.clear()
        if len(self.nodes) < self.settings.min_nodes:
            raise GputuiError(f"only {len(self.nodes)} node(s) left, fewer than min_nodes {self.settings.min_nodes}; "
                              f"resume later with: gputui run --resume {self.run.run_id}")

    def _outcome(self) -> str:
        kind = (self.last_event or {}).get("event")
        if kind == "done":
            return "done"
        if self.stop_reason:
            return "interrupted"
        if kind == "error" and self.last_event is not None:
            error = UserError if self.last_event.get("exit_code") == 2 else GputuiError
            raise error(str(self.last_event.get("message")))
        if self.failure:
            raise GputuiError(self.failure)
        if kind == "interrupted":
            return "relaunch"  # a slave's SIGTERM (spot notice, budget) stopped the group: it checkpointed
        tails = "; ".join(f"{n.name}: {n.proc.last_error()}" for n in self.nodes if n.proc is not None)
        if not self.started_this_attempt:
            raise GputuiError(f"the cluster's torchrun failed before training started ({tails}); "
                              f"see {self.run.path / 'nodes'}")
        return "relaunch"

    def _teardown(self) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None]
        for proc in procs:
            proc.stop()
        deadline = time.monotonic() + STOP_GRACE_S + 10
        while any(p.exit_code is None for p in procs) and time.monotonic() < deadline:
            try:
                self.items.get(timeout=0.2)
            except queue.Empty:
                pass
        for proc in procs:
            proc.kill()
        if self.manager is not None:
            self.manager.ctx.ledger.end_run(self.run.run_id, time.time(), getattr(self, "outcome", "failed"))
        if self.started_ids and self.manager is not None:
            try:
                gone = self.manager.release(self.started_ids)
            except GputuiError as exc:
                self.emit("error", message=f"could not terminate the slaves this run started: {exc}; run gputui cloud down")
            else:
                if gone:
                    self.emit("slaves_terminated", instances=gone, message=f"{len(gone)} cloud slave(s) terminated")
        for node in self.nodes:
            if node.conn is not None:
                node.conn.close()
            if node.log is not None:
                node.log.close()
        self.store = None


def execute_cluster(run: runs.RunDir, cfg: RunConfig, resume: bool, view: View, profile: Path) -> str:
    """`gputui run` on the cluster of `profile`; 'done' or 'interrupted'."""
    settings = load_cluster(profile)
    return ClusterRun(run, cfg, settings, view).execute(resume)
