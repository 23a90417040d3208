"""Hosts behind a bastion (ProxyJump, chains, ProxyCommand) against real loopback sshd servers.

The bastions log at DEBUG, so each `direct-tcpip` channel they open is a line naming where it
leads: that line (and, while connected, the owner of the TCP connection to the target) shows
the traffic went through the bastion. Monitor, doctor, a cluster run and the budget guard's
OpenSSH route are each taken through one.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gputui.cloud.remote import ssh_checkpointer
from gputui.model.errors import GputuiError
from gputui.config.hosts import HostSpec
from gputui.model.cloud import InstanceRecord
from gputui.model.telemetry import HostState
from gputui.sources import jump
from gputui.sources.hostkeys import SshOptions
from gputui.sources.ssh import SshHost

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust, wait_no_leftovers,
)
from .conftest import run_cli
from .proc_support import Child
from .sshd_fixture import Sshd, free_port

TIMEOUT = 15.0  # connect timeout: generous, a bastion adds a handshake


def start_bastion(nodes: ClusterNodes, address: str) -> Sshd:
    """An sshd at `address` logging each forwarded channel (LogLevel DEBUG); no nvidia-smi, no sftp."""
    root = nodes.root / f"bastion{len(nodes.servers)}"
    root.mkdir()
    server = Sshd(root, [free_port()], nodes.host_key, nodes.user_key, None, address=address, log_level="DEBUG")
    nodes.servers.append(server)
    return server.start()


def start_gpu_host(nodes: ClusterNodes, address: str, fixture: str) -> Sshd:
    """An sshd at `address` with a fake nvidia-smi replaying `fixture` (see tests/data/nvsmi)."""
    root = nodes.root / f"gpu{len(nodes.servers)}"
    root.mkdir()
    server = Sshd(root, [free_port()], nodes.host_key, nodes.user_key, fixture, address=address)
    nodes.servers.append(server)
    return server.start()


def forwarded(bastion: Sshd, to: Sshd) -> int:
    """How many direct-tcpip channels `bastion` opened to `to` (its DEBUG log says each one)."""
    pattern = re.compile(rf"server_request_direct_tcpip: originator \S+ port \d+, target {re.escape(to.address)} port {to.port}\b")
    return len(pattern.findall(bastion.log.read_text(errors="replace")))


def logins(server: Sshd) -> int:
    return server.log.read_text(errors="replace").count("Accepted publickey for root")


@pytest.fixture(scope="module")
def bastion(cluster_nodes: ClusterNodes) -> Sshd:
    return start_bastion(cluster_nodes, "127.0.0.1")


@pytest.fixture(scope="module")
def inner(cluster_nodes: ClusterNodes) -> Sshd:
    """The GPU host behind the bastion (a fake nvidia-smi with 8 A100s)."""
    return start_gpu_host(cluster_nodes, "127.0.0.7", "r535-a100x8")


def hosts_profile(path: Path, target: Sshd, key: Path, proxy_jump: str, name: str = "inner") -> Path:
    path.write_text(f'[[hosts]]\nname = "{name}"\naddress = "{target.address}"\nport = {target.port}\nuser = "root"\n'
                    f'identity_file = "{key}"\nproxy_jump = "{proxy_jump}"\nconnect_timeout = {TIMEOUT}\n')
    return path


def monitor(profile: Path) -> tuple[Any, list[dict[str, Any]]]:
    result = run_cli("monitor", "--once", "--json", "--no-local", "--profile", str(profile), timeout=120)
    return result, json.loads(result.stdout)["hosts"] if result.stdout.strip() else []


def doctor(profile: Path) -> tuple[Any, dict[tuple[str, str], dict[str, str]]]:
    result = run_cli("doctor", "--json", "--no-local", "--profile", str(profile), timeout=180)
    checks = json.loads(result.stdout)["checks"] if result.stdout.strip() else []
    return result, {(c["host"], c["name"]): c for c in checks}


def test_monitor_and_doctor_reach_a_host_through_its_bastion(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, ssh_home: Path, gputui_home: Path, tmp_path: Path
) -> None:
    trust(gputui_home, bastion, inner)
    profile = hosts_profile(tmp_path / "p.toml", inner, cluster_nodes.user_key, f"root@127.0.0.1:{bastion.port}")
    before = forwarded(bastion, inner)
    result, hosts = monitor(profile)
    assert result.returncode == 0, result.stderr
    (host,) = hosts
    assert host["state"] == "ok" and len(host["gpus"]) == 8, host["message"]
    assert host["address"] == f"root@{inner.address}:{inner.port}"
    assert forwarded(bastion, inner) == before + 1  # the one connection went through the bastion
    result, rows = doctor(profile)
    assert result.returncode == 0, result.stdout + result.stderr
    assert rows[("inner", "bastion")]["status"] == "pass" and f"via bastion root@127.0.0.1:{bastion.port}" in rows[("inner", "bastion")]["detail"]
    assert rows[("inner", "reachable")]["status"] == rows[("inner", "nvidia-smi")]["status"] == "pass"
    assert forwarded(bastion, inner) == before + 2


def owners_of_connections_to(target: Sshd) -> list[psutil.Process]:
    """The processes holding an established TCP connection to the target's sshd."""
    found = []
    for conn in psutil.net_connections("tcp"):
        if conn.raddr and (conn.raddr.ip, conn.raddr.port) == (target.address, target.port) and conn.pid:
            if conn.status == psutil.CONN_ESTABLISHED:
                found.append(psutil.Process(conn.pid))
    return found


def test_hosts_behind_one_bastion_share_its_connection_and_only_it_talks_to_them(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    other = start_gpu_host(cluster_nodes, "127.0.0.8", "r470-k80")
    known = tmp_path / "known_hosts"
    known.write_text(bastion.known_hosts_line() + inner.known_hosts_line() + other.known_hosts_line())
    options = SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gputui_known_hosts", ssh_config=None)
    via = f"root@127.0.0.1:{bastion.port}"
    hosts = [SshHost(HostSpec(n, s.address, s.port, "root", cluster_nodes.user_key, connect_timeout=TIMEOUT, proxy_jump=via), options)
             for n, s in (("a", inner), ("b", other))]
    bastion_logins = logins(bastion)
    try:
        snaps = [h.poll_now() for h in hosts]
        assert [s.state for s in snaps] == [HostState.OK, HostState.OK], [s.message for s in snaps]
        assert [len(s.gpus) for s in snaps] == [8, 2]
        assert logins(bastion) == bastion_logins + 1 and jump.open_bastions() == 1  # one transport for both
        # Every connection to either host comes out of the bastion's sshd, none out of this process.
        bastion_tree = {bastion.process.pid} | {p.pid for p in psutil.Process(bastion.process.pid).children(recursive=True)}  # type: ignore[union-attr]
        for target in (inner, other):
            owners = owners_of_connections_to(target)
            assert owners and {p.pid for p in owners} <= bastion_tree, [(p.pid, p.cmdline()) for p in owners]
        hosts[0].close()
        assert jump.open_bastions() == 1 and hosts[1].poll_now().state == HostState.OK  # still in use by b
        assert logins(bastion) == bastion_logins + 1
    finally:
        for host in hosts:
            host.close()
    assert jump.open_bastions() == 0  # closed with its last host


def test_the_bastions_host_key_is_checked_like_any_hosts(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    known = tmp_path / "known_hosts"
    known.write_text(inner.known_hosts_line())  # the host's key only
    options = SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gputui_known_hosts", ssh_config=None)
    via = f"root@127.0.0.1:{bastion.port}"
    spec = HostSpec("a", inner.address, inner.port, "root", cluster_nodes.user_key, connect_timeout=TIMEOUT, proxy_jump=via)
    snap = SshHost(spec, options).poll_now()
    assert snap.state == HostState.HOST_KEY_UNKNOWN, snap.message
    assert (snap.message or "").startswith(f"via bastion {via}: host key of [127.0.0.1]:{bastion.port} is not known")
    assert f"ssh-keyscan -p {bastion.port} 127.0.0.1" in (snap.message or "")
    assert not options.gputui_known_hosts_path().exists()
    # Trust on first use records the bastion's key as it would any host's.
    host = SshHost(HostSpec("a", inner.address, inner.port, "root", cluster_nodes.user_key, trust_on_first_use=True,
                            connect_timeout=TIMEOUT, proxy_jump=via), options)
    try:
        assert host.poll_now().state == HostState.OK
    finally:
        host.close()
    assert f"[127.0.0.1]:{bastion.port} {bastion.host_public_key()}" in options.gputui_known_hosts_path().read_text()


def test_a_chain_of_two_bastions(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, ssh_home: Path, gputui_home: Path, tmp_path: Path
) -> None:
    second = start_bastion(cluster_nodes, "127.0.0.20")
    trust(gputui_home, bastion, second, inner)
    chain = f"root@127.0.0.1:{bastion.port},root@{second.address}:{second.port}"
    profile = hosts_profile(tmp_path / "p.toml", inner, cluster_nodes.user_key, chain)
    first_to_second, second_to_inner, first_to_inner = forwarded(bastion, second), forwarded(second, inner), forwarded(bastion, inner)
    result, hosts = monitor(profile)
    assert result.returncode == 0 and hosts[0]["state"] == "ok" and len(hosts[0]["gpus"]) == 8, result.stdout + result.stderr
    assert forwarded(bastion, second) == first_to_second + 1 and forwarded(second, inner) == second_to_inner + 1
    assert forwarded(bastion, inner) == first_to_inner  # the first bastion only ever saw the second


RELAY = """import os, socket, sys, threading
host, port, user, log = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
with open(log, "a") as fh:
    fh.write(f"{host} {port} {user}\\n")
s = socket.create_connection((host, port))
def up():
    while True:
        data = os.read(0, 65536)
        if not data:
            s.shutdown(socket.SHUT_WR)
            return
        s.sendall(data)
threading.Thread(target=up, daemon=True).start()
while True:
    data = s.recv(65536)
    if not data:
        break
    os.write(1, data)
"""


def test_ssh_config_proxycommand_and_proxyjump_are_used(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    relay, relay_log = tmp_path / "relay.py", tmp_path / "relay.log"
    relay.write_text(RELAY)
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu-by-command\n  HostName {inner.address}\n  Port {inner.port}\n  User root\n"
                      f"  IdentityFile {cluster_nodes.user_key}\n  ProxyCommand {sys.executable} {relay} %h %p %r {relay_log}\n"
                      f"Host gpu-by-jump\n  HostName {inner.address}\n  Port {inner.port}\n  User root\n"
                      f"  IdentityFile {cluster_nodes.user_key}\n  ProxyJump root@127.0.0.1:{bastion.port}\n")
    known = tmp_path / "known_hosts"
    known.write_text(bastion.known_hosts_line() + inner.known_hosts_line())
    options = SshOptions(known_hosts=(known,), gputui_known_hosts=tmp_path / "gk", ssh_config=config)
    by_command = SshHost(HostSpec("c", "gpu-by-command", connect_timeout=TIMEOUT), options)
    try:
        snap = by_command.poll_now()
        assert snap.state == HostState.OK and len(snap.gpus) == 8, snap.message
        assert relay_log.read_text() == f"{inner.address} {inner.port} root\n"  # %h %p %r, as paramiko substitutes them
    finally:
        by_command.close()
    before = forwarded(bastion, inner)
    by_jump = SshHost(HostSpec("j", "gpu-by-jump", connect_timeout=TIMEOUT), options)
    try:
        assert by_jump.poll_now().state == HostState.OK
        assert forwarded(bastion, inner) == before + 1
    finally:
        by_jump.close()
    # proxy_jump = "none" in the profile turns the config's jump off: the host is reached directly.
    direct = SshHost(HostSpec("d", "gpu-by-jump", connect_timeout=TIMEOUT, proxy_jump="none"), options)
    try:
        assert direct.poll_now().state == HostState.OK and forwarded(bastion, inner) == before + 1
    finally:
        direct.close()


def test_a_dead_bastion_is_named_and_the_host_is_not_blamed(
    cluster_nodes: ClusterNodes, inner: Sshd, ssh_home: Path, gputui_home: Path, tmp_path: Path
) -> None:
    trust(gputui_home, inner)
    dead = free_port()
    profile = hosts_profile(tmp_path / "p.toml", inner, cluster_nodes.user_key, f"root@127.0.0.1:{dead}")
    result, hosts = monitor(profile)
    assert result.returncode == 1, result.stderr  # no host answered
    (host,) = hosts
    assert host["state"] == "unreachable"
    assert host["message"].startswith(f"via bastion root@127.0.0.1:{dead}: unreachable (connection refused by 127.0.0.1:{dead})"), host["message"]
    assert inner.address not in host["message"]  # the host is not said to be unreachable
    result, rows = doctor(profile)
    assert result.returncode == 1
    assert rows[("inner", "bastion")]["status"] == "fail" and "via bastion" in rows[("inner", "bastion")]["detail"]
    assert ("inner", "reachable") not in rows  # the host itself was never asked


def test_an_unparsable_ssh_config_is_one_warning_line_naming_it(
    cluster_nodes: ClusterNodes, bastion: Sshd, inner: Sshd, ssh_home: Path, gputui_home: Path
) -> None:
    trust(gputui_home, bastion, inner)
    config = ssh_home / ".ssh" / "config"
    config.write_text("Host *\n  =oops\n")
    key = str(cluster_nodes.user_key)
    result = run_cli("monitor", "--once", "--json", "--no-local", "-i", key, "--host", f"root@{inner.address}:{inner.port}",
                     "--host", f"root@127.0.0.1:{bastion.port}", timeout=120)
    assert result.returncode == 0, result.stderr
    assert [h["state"] for h in json.loads(result.stdout)["hosts"]] == ["ok", "no-nvidia-smi"]  # both still polled
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "warning" in lines[0] and str(config) in lines[0] and "Traceback" not in result.stderr, result.stderr


def test_a_cluster_node_behind_a_bastion_trains(
    cluster_nodes: ClusterNodes, bastion: Sshd, pinned_wheel: Path, small_data: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = cluster_nodes.node(7)
    trust(gputui_home, bastion, node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key, {"threads": 1})
    text = profile.read_text().replace("\n[cluster]", f'proxy_jump = "root@127.0.0.1:{bastion.port}"\n\n[cluster]')
    profile.write_text(text)
    before = forwarded(bastion, node)
    run_dir = tmp_path / "behind"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(small_data),
            "--epochs", "1", "--batch-size", "64", "--seed", "3", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=dict(os.environ), name="gputui run (master + n0 behind a bastion)") as child:
        code = child.finish(240, "the cluster run through the bastion to finish")
    assert code == 0, child.stderr
    cluster = next(e for e in child.events if e["event"] == "cluster")
    assert cluster["nodes"] == ["master", "n0"] and cluster["world_size"] == 2
    assert child.events[-1]["event"] == "done" and child.events[-1]["step"] == 8
    assert forwarded(bastion, node) > before  # bootstrap and run went through the bastion
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("behind", node)) == []


def test_the_guards_ssh_jumps_through_the_bastion_with_the_same_host_key_policy(
    cluster_nodes: ClusterNodes, bastion: Sshd, tmp_path: Path
) -> None:
    node = cluster_nodes.node(8)
    second = start_bastion(cluster_nodes, "127.0.0.21")
    record = InstanceRecord("i-1", "ec2", "us-east-1", "lab", None, "g4dn.xlarge", "us-east-1a", "spot", 0.2, 0.0,
                            None, "running", None, node.address)
    known = tmp_path / "known_hosts"
    known.write_text(bastion.known_hosts_line() + second.known_hosts_line() + node.known_hosts_line())
    before = forwarded(bastion, node)
    via = f"root@127.0.0.1:{bastion.port}"
    ssh_checkpointer("root", 60.0, cluster_nodes.user_key, node.port, [known], proxy_jump=via)([record])
    assert forwarded(bastion, node) == before + 1
    chain = f"{via},root@{second.address}:{second.port}"
    ssh_checkpointer("root", 60.0, cluster_nodes.user_key, node.port, [known], proxy_jump=chain)([record])
    assert forwarded(second, node) == 1 and forwarded(bastion, second) == 1
    # The bastion's key is checked as strictly as the slave's: unknown, refused, and said so.
    only_node = tmp_path / "node_only"
    only_node.write_text(node.known_hosts_line())
    with pytest.raises(GputuiError) as info:
        ssh_checkpointer("root", 60.0, cluster_nodes.user_key, node.port, [only_node], proxy_jump=via)([record])
    assert f"i-1: ssh exit 255: via bastion {via}: its host key is unknown" in str(info.value)
    dead = f"root@127.0.0.1:{free_port()}"
    with pytest.raises(GputuiError) as info:
        ssh_checkpointer("root", 60.0, cluster_nodes.user_key, node.port, [known], proxy_jump=dead)([record])
    assert f"via bastion 127.0.0.1:{dead.rsplit(':', 1)[1]}: unreachable (Connection refused)" in str(info.value)
    assert forwarded(bastion, node) == before + 1  # the refused tries never reached the slave
