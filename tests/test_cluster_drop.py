"""A static node lost for good: nothing can replace it, so the run drops it and finishes on fewer nodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env
from .proc_support import Child
from .sshd_fixture import Sshd
from .test_cluster_run import finish, logs, weights


@pytest.fixture(scope="module")
def two_nodes(cluster_nodes: ClusterNodes) -> list[Sshd]:
    return [cluster_nodes.node(0), cluster_nodes.node(1)]


def test_a_lost_static_node_is_dropped_and_the_run_finishes_on_fewer_nodes(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, *two_nodes)
    # Two static slaves, no master node and no cloud: a lost node can only be dropped (min_nodes 1).
    profile = cluster_profile(tmp_path / "cluster.toml", two_nodes, cluster_nodes.user_key, {"threads": 1},
                              master_trains=False, nodes=2, min_nodes=1)
    run_dir = tmp_path / "dropped"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(medium_data),
            "--epochs", "2", "--batch-size", "32", "--seed", "5", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(), name="gputui run (two static slaves)") as child:
        child.wait_for(lambda e: e["event"] == "epoch" and e["epoch"] == 1, 240, "the end of epoch 1")
        # Lose the node that is not rank 0's for good: its sshd and everything it runs die.
        rank0 = next(e for e in child.events if e["event"] == "start")["node"]
        victim = two_nodes[1] if rank0 == "n0" else two_nodes[0]
        victim.stop()
        code = finish(child, 240, "the run to drop the lost node and finish", run_dir)
    seen, err = child.events, child.stderr
    assert code == 0, err + logs(run_dir)
    kinds = [e["event"] for e in seen]
    name = "n1" if victim is two_nodes[1] else "n0"
    lost = next((e for e in seen if e["event"] == "node_lost"), None)
    story = [(e["event"], e.get("node"), e.get("message")) for e in seen if e["event"] not in ("step", "eval")]
    assert lost is not None and lost["node"] == name, story
    dropped = next((e for e in seen if e["event"] == "node_dropped"), None)
    assert dropped is not None, story
    assert dropped["node"] == name and dropped["nodes"] == 1
    assert kinds.index("node_lost") < kinds.index("node_dropped") < kinds.index("resumed")
    resumed = next(e for e in seen if e["event"] == "resumed")
    assert resumed["nodes"] == 1 and resumed["from_step"] > 0
    relaunch = next(e for e in seen if e["event"] == "cluster" and e["attempt"] >= 1)
    assert relaunch["nodes"] == ["n1" if name == "n0" else "n0"] and relaunch["world_size"] == 1
    # The relaunched group's start (rank 0 on the surviving slave) names the master's run, not the slave's path.
    starts = [e for e in seen if e["event"] == "start"]
    assert len(starts) >= 2 and all((e["run_dir"], e["run_id"]) == (str(run_dir), "dropped") for e in starts), starts
    assert kinds[-1] == "done"
    assert [e["epoch"] for e in seen if e["event"] == "epoch"] == [1, 2]
    # The final checkpoint is in the master's run directory.
    assert weights(run_dir)["step"] == seen[-1]["step"]
    survivors = [s for s in two_nodes if s is not victim]
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("dropped", *two_nodes)) == [], survivors
