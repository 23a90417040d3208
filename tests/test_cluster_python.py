"""Slaves train with whatever Python has torch there: the suite's own interpreter (a venv
when the README's command runs it) or one named by absolute path in [cluster] python.

The first test is also the suite's guard against depending on the system interpreter: the
loopback slaves run exactly the interpreter under test, and the venv they get must import
torch from that interpreter's own site directories (a venv's, when the suite runs in one).
"""

from __future__ import annotations

import shlex
import site
import sys
from pathlib import Path

from gputui.cluster.bootstrap import PTH, Bootstrapper, local_dataset, site_pth
from gputui.cluster.sshnode import SlaveConnection
from gputui.cluster.wheel import given_wheel
from gputui.config.hosts import HostSpec

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_wheel, trust,
)


def test_site_pth_is_one_line_that_site_can_run(tmp_path: Path) -> None:
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "nested.pth").write_text(str(tmp_path / "nested") + "\n")
    (tmp_path / "nested").mkdir()
    text = site_pth([str(extra), "bad\nline", 3])  # type: ignore[list-item]
    assert text.count("\n") == 1 and "bad" not in text
    (tmp_path / "sp").mkdir()
    (tmp_path / "sp" / PTH).write_text(text)
    before = list(sys.path)
    try:
        site.addsitedir(str(tmp_path / "sp"))
        # The directory and the .pth files inside it are both honoured.
        assert str(extra) in sys.path and str(tmp_path / "nested") in sys.path
    finally:
        sys.path[:] = before


def test_slaves_run_the_interpreter_under_test_and_import_its_torch(
    cluster_nodes: ClusterNodes, cluster_wheel: Path, small_data: Path, gputui_home: Path,
) -> None:
    node = cluster_nodes.node(0)  # PATH starts with this interpreter's directory
    trust(gputui_home, node)
    spec = HostSpec("n0", node.address, node.port, "root", cluster_nodes.user_key)
    boot = Bootstrapper("~/.gputui-cluster", "python3", given_wheel(cluster_wheel), local_dataset(small_data))
    conn = SlaveConnection(spec).open_or_raise()
    try:
        ready = boot.bootstrap(conn)
        assert Path(ready.python).parent == Path(sys.executable).parent, (ready.python, sys.executable)
        out = conn.check(f"cd {shlex.quote(ready.base)} && {shlex.quote(ready.venv_python)} -c "
                         + shlex.quote("import torch, gputui; print(torch.__file__); print(gputui.__file__)"))
    finally:
        conn.close()
    torch_file, gputui_file = out.strip().splitlines()[-2:]
    # torch comes from the interpreter under test (its venv's site-packages when it is a venv),
    # gputui from the wheel installed in the slave's own venv.
    assert torch_file.startswith(tuple(site.getsitepackages())), (torch_file, site.getsitepackages())
    assert gputui_file.startswith(f"{ready.base}/venv/"), gputui_file


def test_an_interpreter_named_by_absolute_path_is_the_one_used(
    cluster_nodes: ClusterNodes, cluster_wheel: Path, small_data: Path, gputui_home: Path,
) -> None:
    node = cluster_nodes.node(1, path="/usr/local/bin:/usr/bin:/bin")  # its python3 has no torch
    trust(gputui_home, node)
    spec = HostSpec("n1", node.address, node.port, "root", cluster_nodes.user_key)
    boot = Bootstrapper("~/.gputui-cluster", sys.executable, given_wheel(cluster_wheel), local_dataset(small_data))
    conn = SlaveConnection(spec).open_or_raise()
    try:
        ready = boot.bootstrap(conn)
        out = conn.check(f"cd {shlex.quote(ready.base)} && {shlex.quote(ready.venv_python)} -c "
                         + shlex.quote("import torch; print(torch.__file__)"))
    finally:
        conn.close()
    assert ready.python == sys.executable and not ready.skipped
    assert out.strip().splitlines()[-1].startswith(tuple(site.getsitepackages()))
