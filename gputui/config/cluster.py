"""The `[cluster]` profile table: a master (this machine) and its slaves.

Slaves are static SSH hosts (names of the profile's `[[hosts]]` tables), spot slaves
launched from the profile's `[cloud]` table, or both. Declared once, as `ClusterSettings`;
resolving a profile's table into one (its hosts, its node counts) is gputui.cluster.settings.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gputui.config.cloud import DEFAULT_IDLE_STOP_MINUTES, DEFAULT_REMOTE_DIR, CloudSettings
from gputui.config.hosts import HostSpec
from gputui.config.schema import REQUIRED, key, section_of

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:,-]{1,64}$")
_ADDR = re.compile(r"^[A-Za-z0-9_.:\-%]+$")


def _check(pattern: re.Pattern[str], what: str) -> Any:
    return lambda value: None if pattern.match(value) else what


@dataclass(frozen=True)
class ClusterSettings:
    """A validated `[cluster]` table with its slaves resolved (gputui.cluster.settings.cluster_settings)."""

    name: str = key("str", "Cluster name: tags its cloud slaves and names it in the ledger.", "default",
                    attr=REQUIRED, check=_check(_NAME, "a name of letters, digits, '-', '_' or '.'"))
    # names of [[hosts]] tables in the profile, resolved to their HostSpecs
    hosts: tuple[HostSpec, ...] = key("str_list", "Static slaves: `name`s of this profile's [[hosts]] tables.", (),
                                      attr=REQUIRED)
    cloud_slaves: int = key("int", "Spot slaves from this profile's [cloud] table, started when a run needs them.", 0,
                            attr=REQUIRED, minimum=0, maximum=256)
    nodes: int = key("int", "Nodes a run trains on, the master included when master_trains (default: the master and "
                     "every slave).", None, attr=REQUIRED, minimum=1, maximum=1024)
    nproc_per_node: int = key("int", "Training processes per node (one per GPU; CPU nodes: 1).", 1, attr=REQUIRED,
                              minimum=1, maximum=64)
    min_nodes: int = key("int", "Elastic lower bound: the run goes on with this many nodes when slaves are lost "
                         "(default: nodes).", None, attr=REQUIRED, minimum=1, maximum=1024)
    master_trains: bool = key("bool", "Whether the master is one of the training nodes.", True, attr=REQUIRED)
    master_addr: str | None = key("str", "Address the slaves reach the master on (default: the master's end of its "
                                  "SSH connection to the first slave).", None, attr=REQUIRED,
                                  check=_check(_ADDR, "a host name or IP address"))
    rdzv_port: int = key("int", "Port on the master for the rendezvous store (0: any free port).", 29400,
                         attr=REQUIRED, minimum=0, maximum=65535)
    rendezvous: str = key("str", "How slaves reach the rendezvous store: \"tunnel\" (through their SSH connection; "
                          "the store listens on the master's loopback only) or \"direct\" (master_addr:rdzv_port, "
                          "for a trusted network only: whoever reaches that port can disturb or stop the run).",
                          "tunnel", attr=REQUIRED,
                          check=lambda v: None if v in ("tunnel", "direct") else 'one of "tunnel", "direct"')
    max_restarts: int = key("int", "torchrun --max-restarts: worker-group restarts before a node gives up.", 3,
                            attr=REQUIRED, minimum=0, maximum=100)
    join_timeout: float = key("float", "Seconds the rendezvous waits for min_nodes (and a replacement slave).", 600.0,
                              attr=REQUIRED, minimum=5, maximum=86400)
    keep_slaves: bool = key("bool", "Leave the cloud slaves a run started running when it ends.", False,
                            attr=REQUIRED)
    idle_stop_minutes: float = key("float", "Terminate cloud slaves idle (no run, GPU under 5%) this long (0: never).",
                                   DEFAULT_IDLE_STOP_MINUTES, attr=REQUIRED, minimum=0, maximum=10080)
    remote_dir: str = key("str", "Base directory on each slave for gputui's venv, data and runs ('~' = its home).",
                          DEFAULT_REMOTE_DIR, attr=REQUIRED)
    python: str = key("str", "Python on the slaves (needs torch; gputui's venv there reuses that Python's torch, "
                      "wherever it is installed).", "python3", attr=REQUIRED)
    socket_ifname: str | None = key("str", "Network interface for gloo/NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) "
                                    "on every node, e.g. 'eth0' (default: their choice).", None, attr=REQUIRED,
                                    check=_check(_IFNAME, "an interface name such as 'eth0'"))
    # Not keys of [cluster]:
    cloud: CloudSettings | None = None  # the profile's [cloud], when cloud_slaves
    source: Path | None = None  # the profile file

    @property
    def slaves_needed(self) -> int:
        """Slave nodes a run needs (the master's own node excluded)."""
        return self.nodes - (1 if self.master_trains else 0)

    @property
    def min_slaves(self) -> int:
        return max(0, self.min_nodes - (1 if self.master_trains else 0))

    @property
    def world_size(self) -> int:
        return self.nodes * self.nproc_per_node

    def master_unreachable(self) -> str | None:
        """Why the master cannot train beside these slaves, or None when it can.

        Cloud slaves reach the master only through their SSH tunnel by default: their security
        group lets in SSH from the master alone, and the master is often a laptop behind NAT. The
        rendezvous store travels through the tunnel, but gloo/NCCL traffic between the master's
        ranks and theirs cannot. So a training master needs master_addr (an address the slaves
        do reach) or rendezvous = "direct" (a network where all nodes reach each other).
        """
        if not self.master_trains or self.rendezvous != "tunnel" or self.master_addr is not None:
            return None
        if self.nodes - 1 <= len(self.hosts) or not self.cloud_slaves:
            return None  # no cloud slave trains: static hosts are taken to share the master's network
        where = f" in {self.source}" if self.source else ""
        return (f"[cluster]{where}: master_trains = true, but cloud slaves cannot reach this machine directly (they "
                "let in only its SSH, and it may be behind NAT) and training traffic must flow between all nodes; "
                "set master_trains = false, or master_addr to an address of this machine the slaves can reach")


CLUSTER_SECTION = section_of(
    ClusterSettings, "cluster",
    "A master (this machine) and slaves (SSH hosts and/or cloud spot slaves) trained across with torchrun.")
