"""Broken clusters fail with one clear line naming the slave and the fix, and leave nothing running."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gputui.cluster.settings import cluster_settings
from gputui.model.errors import UserError
from gputui.config.profile import parse_profile

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, trust, wait_no_leftovers,
)
from .conftest import run_cli
from .sshd_fixture import free_port, keygen


def one_line_error(result: object, code: int) -> str:
    stderr = getattr(result, "stderr")
    assert getattr(result, "returncode") == code, stderr
    assert "Traceback" not in stderr
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def run(profile: Path, small_data: Path, run_dir: Path) -> object:
    return run_cli("run", "--json", "--profile", str(profile), "--data", str(small_data), "--epochs", "1",
                   "--device", "cpu", "--run-dir", str(run_dir), timeout=120)


def test_a_slave_without_torch(cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path,
                               gputui_home: Path) -> None:
    node = cluster_nodes.node(0, path="/usr/local/bin:/usr/bin:/bin")  # the system python3 has no torch
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key)
    line = one_line_error(run(profile, small_data, tmp_path / "r"), 2)
    assert "slave n0: torch is not installed for /usr/bin/python3" in line
    assert "pip install 'torch==2.13.*'" in line
    assert wait_no_leftovers(str(tmp_path / "r")) == []


def test_a_slave_without_python(cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path,
                                gputui_home: Path) -> None:
    tools = tmp_path / "tools"  # a PATH with the shell tools and no Python at all
    tools.mkdir()
    for name in ("mkdir", "cat"):
        os.symlink(f"/bin/{name}", tools / name)
    node = cluster_nodes.node(0, path=str(tools))
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key)
    line = one_line_error(run(profile, small_data, tmp_path / "r"), 2)
    assert "slave n0: no `python3` there: install Python 3.10+ with torch" in line
    assert "[cluster] python" in line


def test_an_unreachable_slave(cluster_nodes: ClusterNodes, small_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    node = cluster_nodes.node(0)
    trust(gputui_home, node)
    node.ports = [free_port()]  # nothing listens there
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key)
    line = one_line_error(run(profile, small_data, tmp_path / "r"), 1)
    assert line.startswith("gputui: error: slave n0 (root@127.0.0.2:")
    assert "connection refused" in line and "check the port and that sshd runs there" in line


def test_a_wrong_key(cluster_nodes: ClusterNodes, small_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    node = cluster_nodes.node(0)
    trust(gputui_home, node)
    wrong = keygen(tmp_path / "wrong_key")
    profile = cluster_profile(tmp_path / "c.toml", [node], wrong)
    line = one_line_error(run(profile, small_data, tmp_path / "r"), 2)
    assert "slave n0" in line and "authentication failed for root@127.0.0.2 (tried wrong_key)" in line
    assert "authorized_keys" in line


def test_an_unknown_host_key(cluster_nodes: ClusterNodes, small_data: Path, tmp_path: Path) -> None:
    node = cluster_nodes.node(0)  # not trusted
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key)
    line = one_line_error(run(profile, small_data, tmp_path / "r"), 2)
    assert "slave n0" in line and "host key of [127.0.0.2]" in line and "ssh-keyscan" in line


HOSTS = '[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n\n[[hosts]]\nname = "b"\naddress = "10.0.0.2"\n'


@pytest.mark.parametrize("table, message", [
    ('hosts = ["a", "c"]', r"p.toml:\d+: \[cluster\] hosts: no \[\[hosts\]\] table named 'c' \(this profile has: a, b\)"),
    ('hosts = ["a", "a"]', r"\[cluster\] hosts: a host is listed twice"),
    ('hosts = ["a"]\nnodes = 3', r"\[cluster\] nodes: 3 nodes wanted but only 2 available \(master 1 \+ 1 hosts \+ 0 cloud"),
    ('hosts = ["a", "b"]\nmin_nodes = 4', r"\[cluster\] min_nodes: min_nodes 4 is more than nodes 3"),
    ("cloud_slaves = 2", r"\[cluster\] cloud_slaves: cloud slaves need a \[cloud\] table"),
    ("master_trains = false", r"\[cluster\] master_trains: no node to train on"),
    ("nproc_per_node = 0", r"p.toml:\d+: \[cluster\] nproc_per_node: expected a whole number >= 1"),
    ("idle_stop_minutes = -1", r"\[cluster\] idle_stop_minutes: expected a number >= 0"),
    ("nodez = 2", r"\[cluster\] nodez: unknown key, did you mean `nodes`\? \(known keys: cloud_slaves, hosts, idle_stop_minutes"),
    ('socket_ifname = "eth 0"', r"\[cluster\] socket_ifname: expected an interface name"),
])
def test_broken_cluster_tables_name_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    path = tmp_path / "p.toml"
    path.write_text(HOSTS + "\n[cluster]\n" + table + "\n")
    with pytest.raises(UserError, match=message):
        cluster_settings(parse_profile(path.read_text(), path))


def test_cluster_defaults() -> None:
    settings = cluster_settings(parse_profile(HOSTS + '\n[cluster]\nhosts = ["a", "b"]\nmin_nodes = 2\n'))
    assert settings is not None
    assert (settings.nodes, settings.min_nodes, settings.nproc_per_node, settings.slaves_needed) == (3, 2, 1, 2)
    assert (settings.keep_slaves, settings.idle_stop_minutes, settings.max_restarts) == (False, 30.0, 3)
    assert [h.name for h in settings.hosts] == ["a", "b"] and settings.cloud is None
