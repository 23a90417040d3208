"""A slave's (or a sweep host's) checkpoint is data: only a regular file is fetched, and the copy
is bounded as it goes, so a `ckpt.pt` that links to /dev/zero cannot fill the master's disk or
hang its reader. A real sshd on loopback with the sftp subsystem stands in for the host."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Iterator

import pytest

from gputui.cluster.sshnode import SlaveConnection
from gputui.model.errors import GputuiError
from gputui.config.hosts import HostSpec

from .cluster_fixture import ClusterNodes, cluster_nodes, trust  # noqa: F401

# The old copy of a /dev/zero link never ended: this bounds the failing run, far above a refusal's cost.
pytestmark = pytest.mark.timeout(90)


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


@pytest.fixture()
def slave(cluster_nodes: ClusterNodes, gputui_home: Path) -> Iterator[tuple[SlaveConnection, Path]]:
    """A connection to a loopback slave, and a directory there (the slave's own files)."""
    server = cluster_nodes.shared_node(0)
    trust(gputui_home, server)
    conn = SlaveConnection(HostSpec("s1", server.address, server.port, "root", cluster_nodes.user_key)).open_or_raise()
    assert server.home is not None
    there = server.home / f"run-{os.getpid()}-{len(list(server.home.glob('run-*')))}"
    there.mkdir(parents=True)
    try:
        yield conn, there
    finally:
        conn.close()


def test_a_checkpoint_linked_to_dev_zero_is_refused_and_the_previous_one_kept(
        slave: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    conn, there = slave
    (there / "ckpt.pt").symlink_to("/dev/zero")
    here = tmp_path / "master"
    here.mkdir()
    local = here / "ckpt.pt"
    local.write_bytes(b"the previous checkpoint")
    with pytest.raises(GputuiError, match="not a regular file"):
        conn.get(str(there / "ckpt.pt"), local, max_bytes=64 << 20)  # the checkpoints' cap
    assert local.read_bytes() == b"the previous checkpoint"
    assert sorted(p.name for p in here.iterdir()) == ["ckpt.pt"]  # no partial copy left behind


def test_a_file_that_says_it_is_empty_but_reads_on_is_cut_at_the_cap(
        slave: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    # /proc/cpuinfo is a regular file whose size reads 0 while its read goes on: what a file that
    # grows under the copy looks like; the cap counts the bytes read, not what stat() said
    conn, _there = slave
    here = tmp_path / "master"
    here.mkdir()
    local = here / "ckpt.pt"
    with pytest.raises(GputuiError, match="passed 16 bytes"):
        conn.get("/proc/cpuinfo", local, max_bytes=16)
    assert list(here.iterdir()) == []  # the partial copy is deleted
    assert conn.get("/proc/cpuinfo", local, max_bytes=1 << 20) and local.stat().st_size > 16  # under the cap: copied


def test_a_sweep_host_s_dev_zero_checkpoint_is_a_warning_and_the_retry_keeps_the_one_pulled_before(
        slave: tuple[SlaveConnection, Path], tmp_path: Path) -> None:
    import threading

    from gputui.sweep.remote import SSHHandle

    conn, there = slave
    (there / "ckpt.pt").symlink_to("/dev/zero")
    local = tmp_path / "trial-00003"
    local.mkdir()
    (local / "ckpt.pt").write_bytes(b"pulled at an earlier death")
    handle: Any = SSHHandle.__new__(SSHHandle)  # the reader's side only: no worker channel is needed
    handle.host = SimpleNamespace(conn=conn, files=threading.Lock(), name="h1", code=None)  # a net's sweep: no code dir
    handle._current, handle.pulled, handle.warnings = (str(local), str(there)), [], []
    handle._pull_checkpoint()
    assert handle.pulled == [] and (local / "ckpt.pt").read_bytes() == b"pulled at an earlier death"
    assert len(handle.warnings) == 1, handle.warnings
    assert "not a regular file" in handle.warnings[0] and "the one pulled before" in handle.warnings[0]


def test_the_sweep_s_pull_cap_is_the_checkpoint_loader_s_cap() -> None:
    from gputui.runs.store import MAX_CHECKPOINT
    from gputui.sweep import remote
    from gputui.train import checkpoint

    assert checkpoint.MAX_BYTES == MAX_CHECKPOINT == 64 << 20
    assert "MAX_CHECKPOINT" not in vars(remote) or remote.MAX_CHECKPOINT is MAX_CHECKPOINT
