"""Cluster "nodes" on one machine: one OpenSSH sshd per loopback address (127.0.0.2, ...).

Each node has its own HOME (so its gputui venv, data and run directories are its own), the
sftp subsystem, and this interpreter's directory first on PATH (the slaves' python3 is the
one with torch). Profiles for the tests are written by `cluster_profile`. `leftovers`
lists processes of a cluster run still alive (the tests assert there are none).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from .sshd_fixture import SSHD, Sshd, SshdFactory, free_port

PYTHON_DIR = str(Path(sys.executable).parent)
SFTP = ("Subsystem sftp internal-sftp",)


class ClusterNodes(SshdFactory):
    """sshd servers on 127.0.0.2, 127.0.0.3, ... sharing host and user keys (one set per test
    session: the factory, like the wheel, is built once per session and xdist worker)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self._shared: dict[int, Sshd] = {}

    def shared_node(self, index: int) -> Sshd:
        """The session's node at 127.0.0.(index + 2), default PATH: bootstrapped by the first module
        that brings a run up on it, found bootstrapped by the next (the bootstrap's marker matches,
        as on a real slave used twice). For tests that do not care what an earlier run left there;
        `node` gives a fresh one."""
        server = self._shared.get(index)
        if server is None or server.process is None or server.process.poll() is not None:
            server = self._shared[index] = self.node(index)
        return server

    def node(self, index: int, path: str | None = None, fixture: str | None = None) -> Sshd:
        """A new node at 127.0.0.(index + 2) with its own HOME (`path`: its PATH): nothing
        bootstrapped it before."""
        root = self.root / f"node{len(self.servers)}"
        root.mkdir()
        server = Sshd(root, [free_port()], self.host_key, self.user_key, fixture,
                      address=f"127.0.0.{index + 2}", path=path or f"{PYTHON_DIR}:/usr/local/bin:/usr/bin:/bin",
                      extra_config=SFTP, home=root / "home")
        self.servers.append(server)
        return server.start()


@pytest.fixture(scope="session")
def cluster_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterNodes]:
    if not Path(SSHD).exists():
        pytest.fail("OpenSSH's sshd is needed (apt-get install openssh-server; .ci/run does it)")
    factory = ClusterNodes(tmp_path_factory.mktemp("cluster"))
    try:
        yield factory
    finally:
        factory.stop()


@pytest.fixture(scope="session")
def cluster_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This gputui as a wheel, built once per test session (really: pip wheel, as the master does).
    Built from the tree as it is when the first cluster test starts: edits made during a session
    reach the slaves in the next one."""
    from gputui.cluster.wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheels")).path


@pytest.fixture()
def pinned_wheel(cluster_wheel: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Runs use the session's wheel (other engineers editing the tree must not change it mid-test)."""
    monkeypatch.setenv("GPUTUI_WHEEL", str(cluster_wheel))
    return cluster_wheel


def trust(home: Path, *servers: Sshd) -> None:
    """Record the servers' host keys in gputui's known_hosts under GPUTUI_HOME."""
    home.mkdir(parents=True, exist_ok=True)
    with open(home / "known_hosts", "a", encoding="ascii") as fh:
        for server in servers:
            fh.write(server.known_hosts_line())


def cluster_profile(path: Path, servers: list[Sshd], key: Path, run: dict[str, Any] | None = None,
                    **cluster: Any) -> Path:
    """A profile with one [[hosts]] per server and a [cluster] using them all."""
    def value(v: Any) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, (list, tuple)):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = ["[run]"] + [f"{k} = {value(v)}" for k, v in (run or {}).items()]
    for i, server in enumerate(servers):
        lines += ["", "[[hosts]]", f'name = "n{i}"', f'address = "{server.address}"', f"port = {server.port}",
                  'user = "root"', f'identity_file = "{key}"']
    cluster.setdefault("hosts", [f"n{i}" for i in range(len(servers))])
    cluster.setdefault("rdzv_port", 0)
    cluster.setdefault("socket_ifname", "lo")
    lines += ["", "[cluster]"] + [f"{k} = {value(v)}" for k, v in cluster.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def leftovers(*markers: str) -> list[str]:
    """Command lines of live processes mentioning any of `markers` (run directories, here or on a node)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or [])
            if any(m in cmd for m in markers) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(cmd)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def wait_no_leftovers(*markers: str, timeout: float = 30.0) -> list[str]:
    """Leftover processes after up to `timeout` seconds (stopping takes a moment)."""
    deadline = time.monotonic() + timeout
    while True:
        found = leftovers(*markers)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def remote_run_dirs(run_id: str, *servers: Sshd) -> list[str]:
    """Where the nodes keep a run (their processes name it): `runs/<run id>-<nonce>` there."""
    return [str(path) for server in servers if server.home is not None
            for path in sorted((server.home / ".gputui-cluster" / "runs").glob(f"{run_id}-*"))]
