"""`gputui cluster up|down|status|idle [--watch]` through the real command: a static slave
on a loopback sshd (bootstrapped for real), and cloud slaves on the simulated cloud shared
by processes through its state file (GPUTUI_CLOUD=sim)."""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import pytest

from gputui.cloud.ledger import Ledger
from gputui.cluster.store import ClusterStore

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, trust,
)
from .conftest import cli_env, run_cli
from .moto_fixture import sim_cloud_profile
from .proc_support import Child


@pytest.fixture
def sim_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A profile with one static host (never contacted here) and cloud slaves on the simulated cloud."""
    return sim_cloud_profile(tmp_path, monkeypatch, "lab", 50, "0",
                             '\n[[hosts]]\nname = "box"\naddress = "192.0.2.10"\nuser = "ann"\n\n'
                             '[cluster]\nname = "lab"\nhosts = ["box"]\ncloud_slaves = 2\nidle_stop_minutes = 1\n')


def cloud_up(profile: Path, count: int) -> list[str]:
    """Start `count` simulated slaves tagged for the cluster (as a run would have left them)."""
    result = run_cli("cloud", "up", "--count", str(count), "--yes", "--no-guard", "--cluster", "lab",
                     "--profile", str(profile))
    assert result.returncode == 0, result.stderr
    with Ledger() as ledger:
        return sorted(r.instance_id for r in ledger.instances(cluster="lab", running=True))


def test_status_lists_the_master_the_hosts_and_the_running_cloud_slaves(sim_cluster: Path) -> None:
    ids = cloud_up(sim_cluster, 2)
    result = run_cli("cluster", "status", "--json", "--profile", str(sim_cluster))
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert doc["cluster"] == "lab"
    nodes = doc["nodes"]
    assert [(n["name"], n["kind"]) for n in nodes[:2]] == [("master", "master"), ("box", "host")]
    assert "192.0.2.10" in nodes[1]["address"]
    cloud = nodes[2:]
    assert sorted(n["name"] for n in cloud) == ids and len(ids) == 2
    assert all(n["kind"] == "cloud" and n["type"] == "g4dn.xlarge" and n["address"].startswith("203.0.113.")
               for n in cloud)
    text = run_cli("cluster", "status", "--profile", str(sim_cluster))
    assert text.returncode == 0 and all(i in text.stdout for i in ids) and "box" in text.stdout
    alias = run_cli("cluster", "ls", "--json", "--profile", str(sim_cluster))  # as gputui cloud ls
    assert alias.returncode == 0, alias.stderr
    assert [(n["name"], n["kind"]) for n in json.loads(alias.stdout)["nodes"]] == [(n["name"], n["kind"]) for n in nodes]


def test_down_terminates_the_cloud_slaves_and_says_the_user_did(sim_cluster: Path) -> None:
    ids = cloud_up(sim_cluster, 2)
    result = run_cli("cluster", "down", "--json", "--profile", str(sim_cluster))
    assert result.returncode == 0, result.stderr
    assert sorted(json.loads(result.stdout)["terminated"]) == ids
    assert "cluster lab: 2 cloud slaves terminated" in result.stderr
    with Ledger() as ledger:
        assert {r.instance_id: r.ended_by for r in ledger.instances(cluster="lab")} == {i: "user" for i in ids}
    again = run_cli("cluster", "down", "--json", "--profile", str(sim_cluster))
    assert again.returncode == 0 and json.loads(again.stdout)["terminated"] == []


def test_idle_stops_slaves_idle_past_idle_stop_minutes_and_keeps_the_others(sim_cluster: Path, gputui_home: Path) -> None:
    idle, fresh = cloud_up(sim_cluster, 2)
    with ClusterStore(gputui_home / "ledger.sqlite3") as store:
        store.mark_busy(idle, "lab", time.time() - 3600)  # last busy an hour ago (idle_stop_minutes = 1)
    # `fresh` was never looked at: its idle clock starts with this check. Their GPUs cannot be
    # read (the simulated addresses do not answer), which counts as idle when no run is going.
    result = run_cli("cluster", "idle", "--json", "--profile", str(sim_cluster))
    assert result.returncode == 0, result.stderr
    line = json.loads(result.stdout)
    assert (line["up"], line["terminated"]) == (2, [idle])
    with Ledger() as ledger:
        assert ledger.get(idle).ended_by == "idle" and ledger.get(fresh).running  # type: ignore[union-attr]


def test_idle_without_a_cloud_table_has_nothing_to_stop(tmp_path: Path) -> None:
    profile = tmp_path / "static.toml"
    profile.write_text('[[hosts]]\nname = "box"\naddress = "192.0.2.10"\n\n[cluster]\nhosts = ["box"]\n')
    result = run_cli("cluster", "idle", "--watch", "--profile", str(profile))
    assert result.returncode == 0
    assert "no cloud slaves (no [cloud] table): nothing to stop" in result.stderr


def test_idle_watch_checks_until_ctrl_c_and_then_exits_0(sim_cluster: Path) -> None:
    cloud_up(sim_cluster, 1)
    with Child([sys.executable, "-m", "gputui", "cluster", "idle", "--watch", "--json", "--interval", "600",
                "--profile", str(sim_cluster)], env=cli_env(), name="gputui cluster idle --watch",
               json_lines=False) as watch:  # its lines are JSON checks, not events
        first = json.loads(watch.wait_for_line(lambda line: True, 120, "the first check's line"))
        assert first["up"] == 1 and first["terminated"] == []  # first look: its idle clock starts now
        watch.proc.send_signal(signal.SIGINT)  # it now waits 600 s for the next check
        assert watch.rest(60, "the end of the output after SIGINT") == []
        said = watch.stderr_rest(60)
        assert watch.proc.wait(timeout=60) == 0
    assert said[-1] == "cluster lab: idle watch stopped", said
    assert not any("Traceback" in line or "interrupted twice" in line for line in said), said


def test_up_bootstraps_a_static_slave_once(cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path,
                                           gputui_home: Path) -> None:
    node = cluster_nodes.node(0)
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key, {"device": "cpu"}, name="pair")
    first = run_cli("cluster", "up", "--json", "--profile", str(profile))
    assert first.returncode == 0, first.stderr
    (done,) = json.loads(first.stdout)["nodes"]
    assert done["node"] == "n0" and not done["skipped"] and done["steps"], done
    assert node.home is not None and (node.home / ".gputui-cluster" / "venv" / "bin" / "python").exists()
    assert "n0: ready in" in first.stderr
    again = run_cli("cluster", "up", "--json", "--profile", str(profile))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"cluster": "pair", "nodes": [
        {"node": "n0", "skipped": True, "seconds": json.loads(again.stdout)["nodes"][0]["seconds"], "steps": []}]}
    assert "(already bootstrapped)" in again.stderr
    status = run_cli("cluster", "status", "--json", "--profile", str(profile))
    assert status.returncode == 0, status.stderr
    assert [n["name"] for n in json.loads(status.stdout)["nodes"]] == ["master", "n0"]
