"""What a run exposes to the network: every socket it listens on is bound to a loopback
address (never every interface), slaves reach the rendezvous through their SSH tunnel,
and no process started for a run inherits the master's credentials. (A DDP run is checked
the same way in tests/test_stop_matrix.py, on the DDP run whose output is closed.)"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import psutil
import pytest

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env
from .proc_support import Child
from .sshd_fixture import Sshd

SECRETS = {"AWS_SECRET_ACCESS_KEY": "dummy-secret", "AWS_ACCESS_KEY_ID": "AKIADUMMY", "SSH_AUTH_SOCK": "/tmp/agent",
           "GITHUB_TOKEN": "ghp_dummy", "GPUTUI_KEEP_ME": "kept"}


def run_processes(root: int, *markers: str) -> list[psutil.Process]:
    """`root`'s descendants, and any process naming one of `markers` (a node's run directory)."""
    procs = {p.pid: p for p in psutil.Process(root).children(recursive=True)}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if any(m in cmd for m in markers):
            procs[proc.pid] = proc
    return list(procs.values())


def listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """(command, address, port) of every listening TCP socket of `procs`."""
    found = []
    for proc in {p.pid: p for p in procs}.values():
        try:
            cmd = " ".join(proc.cmdline())[-120:]
            for conn in proc.net_connections(kind="tcp"):
                if conn.status == psutil.CONN_LISTEN:
                    found.append((cmd, str(conn.laddr.ip), int(conn.laddr.port)))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def assert_loopback_only(sockets: list[tuple[str, str, int]]) -> None:
    wide = [s for s in sockets if not ipaddress.ip_address(s[1].split("%")[0]).is_loopback]
    assert wide == [], wide


def torchrun_endpoints(procs: list[psutil.Process]) -> list[str]:
    found = []
    for proc in procs:
        try:
            found += [a.split("=", 1)[1] for a in proc.cmdline() if a.startswith("--rdzv-endpoint=")]
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def environments(procs: list[psutil.Process]) -> list[dict[str, str]]:
    found = []
    for proc in procs:
        try:
            found.append(proc.environ())
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_the_loopback_checks_see_a_wide_socket() -> None:
    with pytest.raises(AssertionError):
        assert_loopback_only([("x", "::", 1), ("y", "127.0.0.1", 2)])
    with pytest.raises(AssertionError):
        assert_loopback_only([("x", "0.0.0.0", 1)])
    assert_loopback_only([("x", "127.0.0.3", 1), ("y", "::1", 2)])


@pytest.fixture(scope="module")
def node(cluster_nodes: ClusterNodes) -> Sshd:
    return cluster_nodes.shared_node(0)


def cluster_run(profile: Path, data: Path, run_dir: Path) -> Child:
    return Child([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
                  "--epochs", "1", "--batch-size", "32", "--seed", "2", "--device", "cpu", "--run-dir", str(run_dir)],
                 env=cli_env(**SECRETS), name="cluster run")


def test_a_cluster_run_listens_on_loopback_only_and_slaves_use_their_tunnel(
    node: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key, {"threads": 1})
    run_dir = tmp_path / "tunnel"
    with cluster_run(profile, medium_data, run_dir) as run:
        cluster = run.wait_for(lambda e: e["event"] == "cluster", 240, "the cluster event")
        # Training has started: every rank's process group and store exist now.
        run.wait_for(lambda e: e["event"] == "start", 240, "the start event")
        procs = run_processes(run.proc.pid, str(run_dir), *remote_run_dirs("tunnel", node))
        sockets = listening(procs + [psutil.Process(run.proc.pid)])
        endpoints = torchrun_endpoints(procs)
        started = [p for p in procs if p.pid != run.proc.pid]  # the master itself keeps its credentials
        envs = [e for e in environments(started) if "GPUTUI_KEEP_ME" in e or "PYTHONUNBUFFERED" in e]
        assert run.finish(240) == 0, run.stderr
    store_host, store_port = cluster["rdzv"].rsplit(":", 1)
    assert store_host == "127.0.0.1"
    assert sockets, "no listening socket found: the check would pass vacuously"
    assert_loopback_only(sockets)
    # The store is bound to 127.0.0.1 alone, in the master process.
    assert [(ip, port) for _cmd, ip, port in sockets if port == int(store_port)] == [("127.0.0.1", int(store_port))]
    # The master's node meets there; the slave's torchrun goes through its own forwarded port.
    assert f"127.0.0.1:{store_port}" in endpoints
    tunnels = [e for e in endpoints if e != f"127.0.0.1:{store_port}"]
    assert tunnels and all(e.startswith("127.0.0.1:") for e in tunnels), endpoints
    # No process started for the run got a credential (the master's own node included).
    assert envs
    for env in envs:
        assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "SSH_AUTH_SOCK", "GITHUB_TOKEN"} & set(env), \
            sorted(env)
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("tunnel", node)) == []


def test_direct_rendezvous_warns_and_binds_master_addr_alone(
    node: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key, {"threads": 1},
                              rendezvous="direct", master_addr="127.0.0.1")
    run_dir = tmp_path / "direct"
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(small_data),
                "--epochs", "1", "--batch-size", "64", "--device", "cpu", "--run-dir", str(run_dir)],
               env=cli_env(), name="direct cluster run") as run:
        warning = run.wait_for(lambda e: e["event"] == "warning", 240, "the direct-rendezvous warning")
        cluster = run.wait_for(lambda e: e["event"] == "cluster", 240, "the cluster event")
        sockets = listening([psutil.Process(run.proc.pid)])
        assert run.finish(240) == 0, run.stderr
    port = int(cluster["rdzv"].rsplit(":", 1)[1])
    assert f"127.0.0.1:{port}" in warning["message"] and "cannot run code" in warning["message"] and "disturb or stop the run" in warning["message"]
    assert [(ip, p) for _cmd, ip, p in sockets if p == port] == [("127.0.0.1", port)]
    assert run.events[-1]["event"] == "done"
