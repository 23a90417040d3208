"""The nodes of a cluster run, and the one way they are stopped.

`NodeGroup.stop` asks every running node to stop (its supervisor SIGTERMs torchrun and the
workers, which checkpoint; with `now`, SIGKILL after a second); `overdue` says when the
grace has passed without every node exiting, and `kill` drops them (the master's own node:
its whole process tree; a slave's: its SSH channel, whose end makes the slave's supervisor
kill the rest there). The monitor and the teardown both stop nodes through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, TextIO

from gputui.cluster.bootstrap import Bootstrapped
from gputui.cluster.procs import NodeProc
from gputui.cluster.sshnode import SlaveConnection
from gputui.cluster.tunnel import ReverseForward
from gputui.config.hosts import HostSpec
from gputui.model.supervisor import GRACE_S

STOP_GRACE_S = GRACE_S  # what each node's supervisor gives its tree (longer than torchrun's own)
KILL_MARGIN_S = 10.0  # on top of the grace, for the supervisor to report the exit over SSH


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

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.exit_code is None

    def keep_output(self, text: str) -> str:
        """A line of the node's output (not one of gputui's tagged lines) into its tail and its
        output.log; a progress bar's redraw (it ends in "\r") is written as it came, with no
        newline, so the log reads as the program's terminal did. The line without its "\r"."""
        line = text.rstrip("\r")
        if self.proc is not None:
            self.proc.tail.append(line)
        if self.log is not None:
            self.log.write(text if text.endswith("\r") else text + "\n")
            self.log.flush()
        return line


class NodeGroup:
    """The nodes of the run, in order, with the stop state of the current attempt."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []
        self.stop_asked_at: float | None = None  # monotonic time of the first stop of this attempt
        self.killed = False

    def __iter__(self) -> Iterator[Node]:
        return iter(list(self.nodes))  # a copy: recovery replaces nodes while the caller walks them

    def __len__(self) -> int:
        return len(self.nodes)

    def find(self, name: str | None) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    def running(self) -> list[Node]:
        return [n for n in self.nodes if n.running]

    def new_attempt(self) -> None:
        self.stop_asked_at, self.killed = None, False

    def stop(self, now: bool = False) -> None:
        """Ask every node to stop (again with `now`: the grace is dropped)."""
        if self.stop_asked_at is None:
            self.stop_asked_at = time.monotonic()
        for node in self.nodes:
            if node.proc is not None:
                node.proc.stop(now)

    def overdue(self, grace_s: float = STOP_GRACE_S + KILL_MARGIN_S) -> bool:
        return self.stop_asked_at is not None and time.monotonic() - self.stop_asked_at > grace_s

    def kill(self) -> None:
        """Drop every node's processes now."""
        self.killed = True
        for node in self.nodes:
            if node.proc is not None:
                node.proc.kill()

    def close(self) -> None:
        """Close every connection and node log (after the processes are gone)."""
        for node in self.nodes:
            for closing in (node.conn, node.log):
                if closing is not None:
                    try:
                        closing.close()
                    except Exception:  # noqa: BLE001 - a dead connection closes as well as it can
                        pass
