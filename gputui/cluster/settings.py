"""A profile's `[cluster]` table (declared in gputui.config.cluster) resolved: its slaves looked up
among the `[[hosts]]`, its node counts checked; and which cluster profile a run trains on.
"""

from __future__ import annotations

import json
from pathlib import Path

from gputui.config.cloud import CloudSettings
from gputui.config.cluster import (  # noqa: F401 - re-exported: the table is declared in gputui.config.cluster
    CLUSTER_SECTION, ClusterSettings)
from gputui.config.profile import Profile, load_profile
from gputui.config.schema import Source
from gputui.model.errors import UserError
from gputui.sources.hostspecs import hosts_from_profile


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
    settings = cluster_settings(load_profile(path))
    if settings is None:
        raise UserError(f"{path}: no [cluster] table; see profiles/cluster.toml for one with every key explained")
    return settings


CLUSTER_RECORD = "cluster.json"  # in a run directory: which profile's [cluster] the run trains on


def remember_cluster(run_path: Path, profile_path: Path | None) -> None:
    """Note in a new run's directory that it trains on `profile_path`'s cluster (if it has one)."""
    if profile_path is None:
        return
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
