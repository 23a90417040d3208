"""What every part of a cluster run works on: one explicit record, every field set from the start.

The run goes through its phases in order (`Phase`); bring-up, the attempts, the relay and
the teardown each read and change this record, nothing else.
"""

from __future__ import annotations

import enum
import queue
from dataclasses import dataclass, field
from typing import Any

from gputui.runs import store as runs
from gputui.cluster.bootstrap import Bootstrapper
from gputui.cluster.identity import RunIdentity
from gputui.cluster.members import NodeGroup
from gputui.cluster.output import Output
from gputui.cluster.procs import Item
from gputui.cluster.settings import ClusterSettings
from gputui.cluster.stopping import StopRequests
from gputui.config.run import RunConfig

CLOUD_SSH_WAIT_S = 300.0  # how long a booting cloud slave may take to answer SSH


class Phase(enum.Enum):
    BRING_UP = "bring-up"  # connecting, starting cloud slaves, bootstrapping, serving the rendezvous
    TRAINING = "training"  # the attempts: nodes started, monitored, relaunched
    TEARDOWN = "teardown"  # nodes stopped and killed, slaves released, connections closed (shielded)
    ENDED = "ended"


@dataclass
class Slaves:
    """The cloud slaves this run started (each recorded the moment its launch returned) and
    those released since: what the teardown still owes."""

    started: list[str] = field(default_factory=list)
    released: list[str] = field(default_factory=list)

    def add(self, ids: list[str]) -> None:
        self.started += [i for i in ids if i not in self.started]

    def pending(self) -> list[str]:
        return [i for i in self.started if i not in self.released]


@dataclass
class RunContext:
    run: runs.RunDir
    identity: RunIdentity
    cfg: RunConfig
    settings: ClusterSettings
    out: Output
    stops: StopRequests
    manager: Any = None  # SlaveManager when the cluster has cloud slaves
    group: NodeGroup = field(default_factory=NodeGroup)
    slaves: Slaves = field(default_factory=Slaves)
    items: "queue.Queue[Item]" = field(default_factory=queue.Queue)
    bootstrapper: Bootstrapper | None = None
    store: Any = None  # the rendezvous TCPStore the master serves
    store_host: str = "127.0.0.1"
    master_addr: str = "127.0.0.1"
    phase: Phase = Phase.BRING_UP
    ledger_run: bool = False  # the run is recorded in the cloud ledger (to be ended at teardown)
    lease: Any = None  # the LeaseRenewer of the cluster's cloud slaves while the run holds them

    def emit(self, name: str, /, **fields: Any) -> dict[str, Any]:
        return self.out.emit(name, **fields)
