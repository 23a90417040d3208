"""The `[cluster]` profile table: a master (this machine) and its slaves.

Slaves are static SSH hosts (names of the profile's `[[hosts]]` tables), spot slaves
launched from the profile's `[cloud]` table, or both. Torch-free and paramiko-free, so
profiles are validated whole by gputui.profiles.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputui.errors import UserError
from gputui.hosts import HostSpec, hosts_from_profile
from gputui.schema import Field, Section, Source

if TYPE_CHECKING:
    from gputui.cloud.settings import CloudSettings
    from gputui.profiles import Profile

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:,-]{1,64}$")
_ADDR = re.compile(r"^[A-Za-z0-9_.:\-%]+$")


def _check(pattern: re.Pattern[str], what: str) -> Any:
    return lambda value: None if pattern.match(value) else what


CLUSTER_SECTION = Section(
    name="cluster",
    doc="A master (this machine) and slaves (SSH hosts and/or cloud spot slaves) trained across with torchrun.",
    fields={
        "name": Field("str", "Cluster name: tags its cloud slaves and names it in the ledger.", "default",
                      check=_check(_NAME, "a name of letters, digits, '-', '_' or '.'")),
        "hosts": Field("str_list", "Static slaves: `name`s of this profile's [[hosts]] tables.", ()),
        "cloud_slaves": Field("int", "Spot slaves from this profile's [cloud] table, started when a run needs them.", 0,
                              minimum=0, maximum=256),
        "nodes": Field("int", "Nodes a run trains on, the master included when master_trains "
                       "(default: the master and every slave).", None, minimum=1, maximum=1024),
        "nproc_per_node": Field("int", "Training processes per node (one per GPU; CPU nodes: 1).", 1, minimum=1, maximum=64),
        "min_nodes": Field("int", "Elastic lower bound: the run goes on with this many nodes when slaves are lost "
                           "(default: nodes).", None, minimum=1, maximum=1024),
        "master_trains": Field("bool", "Whether the master is one of the training nodes.", True),
        "master_addr": Field("str", "Address the slaves reach the master on (default: the master's end of its SSH "
                             "connection to the first slave).", None, check=_check(_ADDR, "a host name or IP address")),
        "rdzv_port": Field("int", "Port on the master for the rendezvous store (0: any free port).", 29400,
                           minimum=0, maximum=65535),
        "rendezvous": Field("str", "How slaves reach the rendezvous store: \"tunnel\" (through their SSH connection; "
                            "the store listens on the master's loopback only) or \"direct\" (master_addr:rdzv_port, "
                            "for a trusted network only: whoever reaches that port can disturb or stop the run).",
                            "tunnel", check=lambda v: None if v in ("tunnel", "direct") else 'one of "tunnel", "direct"'),
        "max_restarts": Field("int", "torchrun --max-restarts: worker-group restarts before a node gives up.", 3,
                              minimum=0, maximum=100),
        "join_timeout": Field("float", "Seconds the rendezvous waits for min_nodes (and a replacement slave).", 600.0,
                              minimum=5, maximum=86400),
        "keep_slaves": Field("bool", "Leave the cloud slaves a run started running when it ends.", False),
        "idle_stop_minutes": Field("float", "Terminate cloud slaves idle (no run, GPU under 5%) this long (0: never).",
                                   30.0, minimum=0, maximum=10080),
        "remote_dir": Field("str", "Base directory on each slave for gputui's venv, data and runs ('~' = its home).",
                            "~/.gputui-cluster"),
        "python": Field("str", "Python on the slaves (needs torch; gputui's venv there reuses that Python's torch, wherever it is installed).", "python3"),
        "socket_ifname": Field("str", "Network interface for gloo/NCCL (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME) on "
                               "every node, e.g. 'eth0' (default: their choice).", None,
                               check=_check(_IFNAME, "an interface name such as 'eth0'")),
    },
)


@dataclass(frozen=True)
class ClusterSettings:
    """A validated `[cluster]` table with its slaves resolved."""

    name: str
    hosts: tuple[HostSpec, ...]
    cloud_slaves: int
    nodes: int
    nproc_per_node: int
    min_nodes: int
    master_trains: bool
    master_addr: str | None
    rdzv_port: int
    rendezvous: str
    max_restarts: int
    join_timeout: float
    keep_slaves: bool
    idle_stop_minutes: float
    remote_dir: str
    python: str
    socket_ifname: str | None
    cloud: "CloudSettings | None"
    source: Path | None

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


def cluster_settings(profile: "Profile") -> ClusterSettings | None:
    """The profile's `[cluster]` with hosts resolved and cross-checked; None without one."""
    table = profile.tables.get("cluster")
    if table is None:
        return None
    path = profile.path
    source = Source(path, path.read_text(encoding="utf-8") if path and path.is_file() else "")
    values = {key: table.get(key, spec.default) for key, spec in CLUSTER_SECTION.fields.items()}
    known = {spec.name: spec for spec in hosts_from_profile(profile)}
    missing = [name for name in values["hosts"] if name not in known]
    if missing:
        names = ", ".join(sorted(known)) or "none"
        raise source.error("cluster", "hosts", f"no [[hosts]] table named {missing[0]!r} (this profile has: {names})")
    if len(set(values["hosts"])) != len(values["hosts"]):
        raise source.error("cluster", "hosts", "a host is listed twice")
    cloud = None
    if values["cloud_slaves"]:
        if "cloud" not in profile.tables:
            raise source.error("cluster", "cloud_slaves", "cloud slaves need a [cloud] table in this profile "
                               "(see profiles/aws-spot.toml)")
        from gputui.cloud.settings import CloudSettings

        cloud = CloudSettings(source=path, **profile.tables["cloud"])
    available = (1 if values["master_trains"] else 0) + len(values["hosts"]) + values["cloud_slaves"]
    if available == 0:
        raise source.error("cluster", "master_trains", "no node to train on: list [[hosts]] names in `hosts`, "
                           "set cloud_slaves, or let the master train")
    nodes = values["nodes"] if values["nodes"] is not None else available
    if nodes > available:
        raise source.error("cluster", "nodes", f"{nodes} nodes wanted but only {available} available "
                           f"(master {'1' if values['master_trains'] else '0'} + {len(values['hosts'])} hosts + "
                           f"{values['cloud_slaves']} cloud slaves)")
    min_nodes = values["min_nodes"] if values["min_nodes"] is not None else nodes
    if min_nodes > nodes:
        raise source.error("cluster", "min_nodes", f"min_nodes {min_nodes} is more than nodes {nodes}")
    return ClusterSettings(
        name=values["name"], hosts=tuple(known[n] for n in values["hosts"]), cloud_slaves=values["cloud_slaves"],
        nodes=nodes, nproc_per_node=values["nproc_per_node"], min_nodes=min_nodes,
        master_trains=values["master_trains"], master_addr=values["master_addr"], rdzv_port=values["rdzv_port"],
        rendezvous=values["rendezvous"], max_restarts=values["max_restarts"], join_timeout=values["join_timeout"], keep_slaves=values["keep_slaves"],
        idle_stop_minutes=values["idle_stop_minutes"], remote_dir=values["remote_dir"], python=values["python"],
        socket_ifname=values["socket_ifname"], cloud=cloud, source=path,
    )


def load_cluster(path: Path) -> ClusterSettings:
    """The `[cluster]` of a profile file; a UserError when it has none."""
    from gputui.profiles import load_profile

    settings = cluster_settings(load_profile(path))
    if settings is None:
        raise UserError(f"{path}: no [cluster] table; see profiles/cluster.toml for one with every key explained")
    return settings


CLUSTER_RECORD = "cluster.json"  # in a run directory: which profile's [cluster] the run trains on


def remember_cluster(run_path: Path, profile_path: Path | None) -> None:
    """Note in a new run's directory that it trains on `profile_path`'s cluster (if it has one)."""
    if profile_path is None:
        return
    from gputui.profiles import load_profile

    if "cluster" in load_profile(profile_path).tables:
        record = {"profile": str(Path(profile_path).resolve())}
        (run_path / CLUSTER_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")


def cluster_profile(run_path: Path) -> Path | None:
    """The cluster profile a run trains on, or None for a run on this machine only."""
    path = run_path / CLUSTER_RECORD
    if not path.is_file():
        return None
    try:
        return Path(json.loads(path.read_text(encoding="utf-8"))["profile"])
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path}: damaged; it should name the cluster profile: {{\"profile\": \"/path/cluster.toml\"}}") from None
