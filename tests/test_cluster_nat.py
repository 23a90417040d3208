"""A cluster from a laptop behind NAT: the slaves never connect to the master. The store
stays on the master's loopback, each slave's torchrun is told only the port its SSH tunnel
forwards on its own loopback, a master that would train beside cloud slaves it cannot reach
is refused before anything starts, and a tunnel that drops mid-run (its SSH session killed)
ends in a resume, never a hang. (tests/test_run_network.py checks that every socket of a
two-node run is on loopback and that the run finishes.)"""

from __future__ import annotations

import re
import signal
import sys
from pathlib import Path

import psutil
import pytest

from gputui.cluster.settings import cluster_settings
from gputui.config.profile import parse_profile

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env, run_cli
from .moto_fixture import public_key_line
from .proc_support import Child
from .sshd_fixture import Sshd
from .test_cluster_run import finish, logs
from .test_run_network import listening, run_processes, torchrun_endpoints


def nat_profile(tmp_path: Path, cluster: str) -> Path:
    (tmp_path / "id.pub").write_text(public_key_line() + "\n")
    path = tmp_path / "nat.toml"
    path.write_text('[cloud]\nbudget_usd = 5\npublic_key = "id.pub"\nssh_cidr = "198.51.100.7/32"\n'
                    f'[cluster]\nname = "nat"\n{cluster}')
    return path


@pytest.mark.parametrize(("cluster", "refused"), [
    ("cloud_slaves = 1\n", True),  # the default: the master trains, the slaves are across NAT
    ("cloud_slaves = 2\nhosts = []\nnodes = 2\n", True),
    ("cloud_slaves = 1\nmaster_trains = false\n", False),
    ("cloud_slaves = 1\nmaster_addr = \"10.0.0.2\"\n", False),  # the user says the slaves reach it there
    ("cloud_slaves = 1\nrendezvous = \"direct\"\n", False),  # a trusted network, said out loud
])
def test_which_clusters_a_training_master_cannot_join(tmp_path: Path, cluster: str, refused: bool) -> None:
    path = nat_profile(tmp_path, cluster)
    settings = cluster_settings(parse_profile(path.read_text(), path))
    assert settings is not None
    assert (settings.master_unreachable() is not None) == refused


def test_a_training_master_with_cloud_slaves_across_nat_is_refused_before_anything_starts(
    tmp_path: Path, gputui_home: Path, monkeypatch: pytest.MonkeyPatch, small_data: Path,
) -> None:
    monkeypatch.setenv("GPUTUI_CLOUD", "sim")
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", "0")
    profile = nat_profile(tmp_path, "cloud_slaves = 1\n")
    done = run_cli("run", "--json", "--profile", str(profile), "--data", str(small_data), "--epochs", "1",
                   "--device", "cpu", "--run-dir", str(tmp_path / "run"), timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"gputui: error: [cluster] in {profile}: master_trains = true, but cloud slaves cannot "
                           "reach this machine directly"), line
    assert "set master_trains = false, or master_addr" in line
    # Nothing was launched, not even asked for.
    assert not (gputui_home / "cloud-sim.json").exists()
    assert not (gputui_home / "ledger.sqlite3").exists()
    assert not (tmp_path / "run").exists()  # refused before its run directory was made


@pytest.fixture(scope="module")
def node(cluster_nodes: ClusterNodes) -> Sshd:
    return cluster_nodes.shared_node(0)


def kill_ssh_sessions(server: Sshd) -> int:
    """SIGKILL every per-connection sshd of `server` (its listener stays): the master's SSH
    session to that slave, its exec channels and its reverse forward, drop at once."""
    assert server.process is not None
    killed = 0
    for proc in psutil.Process(server.process.pid).children(recursive=True):
        try:
            if proc.name() == "sshd" or " ".join(proc.cmdline()).startswith("sshd:"):
                proc.send_signal(signal.SIGKILL)
                killed += 1
        except psutil.NoSuchProcess:
            continue
    return killed


def test_the_slave_knows_only_its_tunnel_and_a_dropped_tunnel_ends_in_a_resume(
    node: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, node)
    # The master trains beside one static slave, the rendezvous through the slave's tunnel (the default).
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key, {"threads": 1})
    run_dir = tmp_path / "natdrop"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(medium_data),
            "--epochs", "2", "--batch-size", "32", "--seed", "7", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(), name="gputui run (master + n0, tunnel)") as run:
        cluster = run.wait_for(lambda e: e["event"] == "cluster", 240, "the cluster event")
        run.wait_for(lambda e: e["event"] == "start", 240, "the start event")
        store = cluster["rdzv"]
        port = int(store.rsplit(":", 1)[1])
        slave = run_processes(run.proc.pid, *remote_run_dirs("natdrop", node))
        slave = [p for p in slave if any(m in " ".join(p.cmdline()) for m in remote_run_dirs("natdrop", node))]
        told = torchrun_endpoints(slave)
        texts = []
        for proc in slave:
            try:
                texts.append(" ".join(proc.cmdline()) + "\n" + "\n".join(f"{k}={v}" for k, v in proc.environ().items()))
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        sockets = listening([psutil.Process(run.proc.pid)])
        # Mid-run, tied to the end of epoch 1 (a checkpoint is on every node): the slave's SSH session dies.
        run.wait_for(lambda e: e["event"] == "epoch" and e["epoch"] == 1, 240, "the end of epoch 1")
        assert kill_ssh_sessions(node) > 0
        code = finish(run, 240, "the run to get over its dropped tunnel and finish", run_dir)
    # The store listens on the master's 127.0.0.1 alone; the slave was told only its own forwarded port.
    assert store.startswith("127.0.0.1:")
    assert [(ip, p) for _cmd, ip, p in sockets if p == port] == [("127.0.0.1", port)]
    assert told and all(e.startswith("127.0.0.1:") and e != store for e in told), (told, store)
    assert texts and not any(re.search(rf":{port}\b|={port}\b", t) for t in texts), store
    seen = run.events
    story = [(e["event"], e.get("node"), e.get("message")) for e in seen if e["event"] not in ("step", "eval")]
    assert code == 0, run.stderr + logs(run_dir)
    kinds = [e["event"] for e in seen]
    lost = next((e for e in seen if e["event"] == "node_lost"), None)
    assert lost is not None and lost["node"] == "n0", story
    assert "node_dropped" in kinds or "resumed" in kinds, story
    resumed = next((e for e in seen if e["event"] == "resumed"), None)
    assert resumed is not None and resumed["from_step"] > 0, story
    relaunched = [e for e in seen if e["event"] == "cluster" and e["attempt"] >= 1]
    assert relaunched and relaunched[0]["rdzv"] == store, story  # the same store, a fresh tunnel
    assert kinds[-1] == "done" and [e["epoch"] for e in seen if e["event"] == "epoch"] == [1, 2], story
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("natdrop", node)) == []
