"""Rank 0's events, relayed into the master's run: read from the nodes' output, cleaned,
rewritten to name the master's run, written to events.jsonl and the view.

Without a master node, rank 0's checkpoint is fetched into the master's run directory at
each epoch and at the end. A fetch that fails is never the run's end: the master keeps the
checkpoint it had, says so in a warning, and the nodes keep theirs (a relaunch resumes
from the newest any node holds).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gputui.runs import store as runs
from gputui.model import events
from gputui.cluster.context import RunContext
from gputui.cluster.members import Node
from gputui.cluster.node import NODE_TAG
from gputui.cluster.worker import EVENT_TAG
from gputui.model import outside
from gputui.model.text import clean, clean_tree
from gputui.model.units import plural_of

FETCH_AT = ("epoch", "interrupted", "done")


class Relay:
    """What the relayed events tell of the current attempt (and of the run so far)."""

    def __init__(self, ctx: RunContext) -> None:
        self.ctx = ctx
        self.last_event: dict[str, Any] | None = None  # this attempt's last event ("restarted" aside)
        self.last_step = 0  # the furthest step any attempt reached
        self.lost_at: int | None = None  # the step seen when a node was lost, until the group resumes
        self.rank0: str | None = None  # the node rank 0 runs on (its checkpoint is fetched)
        self.started = False  # this attempt's trainers emitted `start`
        self.tallies: dict[str, outside.Tally] = {}  # node -> the event lines it sent that were not taken

    @property
    def last_kind(self) -> str | None:
        return None if self.last_event is None else str(self.last_event.get("event"))

    def new_attempt(self) -> None:
        self.last_event, self.started = None, False

    def node_lost(self) -> None:
        if self.lost_at is None:
            self.lost_at = self.last_step

    def line(self, node: Node, text: str) -> None:
        """One line of a node's output: an event of rank 0's, the node supervisor's, or log text."""
        if text.startswith(EVENT_TAG):
            tally = self.tallies.setdefault(node.name, outside.Tally(f"slave {node.name}"))
            event = tally.line(text[len(EVENT_TAG):])  # a slave's words are data: hostile lines refused
            warning = tally.warning()  # its first bad line is said once; a flood is only counted
            if warning is not None:
                self.ctx.emit("warning", node=node.name, reason="bad_line", message=clean(warning, 300))
            if event is not None and isinstance(event.get("event"), str):
                self.relay(events.typed(clean_tree(event)))
        elif not text.startswith(NODE_TAG):
            node.keep_output(text)

    def relay(self, event: dict[str, Any]) -> None:
        event = self.ctx.identity.rewrite(event)
        kind = event.get("event")
        self.ctx.out.write(event)
        if kind == "start":
            self.started = True
            self.rank0 = event.get("node") if isinstance(event.get("node"), str) else None
            resumed = event.get("resumed_from_step")
            if self.lost_at is not None and resumed is not None:
                lost = max(0, self.lost_at - resumed)
                self.ctx.emit("resumed", from_step=resumed, lost_steps=lost, nodes=event.get("nodes"),
                              message=f"resumed at step {resumed} on {plural_of(event.get('nodes'), 'node')} ({plural_of(lost, 'step')} redone)")
                self.lost_at = None
        elif kind == "restarted":
            self.node_lost()
        if isinstance(event.get("step"), int) and kind != "start":
            self.last_step = max(self.last_step, event["step"])
        if kind in FETCH_AT and not self.ctx.settings.master_trains:
            self.fetch_checkpoint(event.get("step"))
        if kind != "restarted":
            self.last_event = event

    def fetch_checkpoint(self, step: Any) -> None:
        """Bring rank 0's node's checkpoint into the master's run directory; a warning if it fails."""
        node = self.ctx.group.find(self.rank0)
        if node is None or node.conn is None or node.boot is None:
            return
        from gputui.train import checkpoint

        remote = f"{node.boot.run_dir(self.ctx.identity.slave_name)}/{runs.CHECKPOINT}"
        try:  # a slave's file is data: bounded and checked before it replaces the last good one
            node.conn.get(remote, self.ctx.run.checkpoint, max_bytes=checkpoint.MAX_BYTES,
                          check=lambda copy: checkpoint.load(Path(copy)))
        except Exception as exc:  # noqa: BLE001 - any failure (SFTP, SSH, a refused file) keeps the last one
            why = clean(str(exc) or type(exc).__name__, 300)
            kept = "its previous checkpoint" if self.ctx.run.checkpoint.is_file() else "no checkpoint yet"
            self.ctx.emit("warning", node=node.name, reason="checkpoint_fetch",
                          message=f"checkpoint of step {step} from {node.name} not fetched ({why}); the master keeps "
                          f"{kept}, and a relaunch resumes from the newest checkpoint a node holds")
