"""Multi-node training on one machine: sshd "nodes" on 127.0.0.2/.3, a wheel-bootstrapped
venv on each, torchrun with gloo and gputui's static rendezvous in a store the master serves."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
import torch

from gputui.cluster.bootstrap import Bootstrapper, local_dataset
from gputui.cluster.sshnode import SlaveConnection
from gputui.cluster.wheel import build_wheel
from gputui.config.hosts import HostSpec

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env, json_lines, make_dataset, run_cli
from .proc_support import Child
from .sshd_fixture import Sshd

RUN = ["--batch-size", "64", "--seed", "3", "--device", "cpu"]


@pytest.fixture(scope="module")
def two_nodes(cluster_nodes: ClusterNodes) -> list[Sshd]:
    return [cluster_nodes.node(0), cluster_nodes.node(1)]


def weights(run_dir: Path) -> dict[str, Any]:
    return dict(torch.load(run_dir / "ckpt.pt", weights_only=True))


def logs(run_dir: Path) -> str:
    folder = run_dir / "nodes"
    return "".join(f"\n--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("*.log"))) if folder.is_dir() else ""


def finish(child: Child, timeout: float, what: str, run_dir: Path) -> int:
    """`child.finish`, with the nodes' logs in the message when it times out."""
    try:
        return child.finish(timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{logs(run_dir)}") from None


def test_two_nodes_train_to_the_same_weights_as_one_process(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    node = two_nodes[0]
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key, {"threads": 1})
    common = ["--data", str(small_data), "--epochs", "1", *RUN]
    single = run_cli("run", "--json", *common, "--threads", "1", "--run-dir", str(tmp_path / "single"))
    assert single.returncode == 0, single.stderr
    run_dir = tmp_path / "multi"
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), *common, "--run-dir", str(run_dir)],
               env=cli_env(), name="gputui run (master + n0)") as child:
        code = finish(child, 240, "the two-node run to finish", run_dir)
    assert code == 0, child.stderr + logs(run_dir)

    events = child.events
    kinds = [e["event"] for e in events]
    boot = next(e for e in events if e["event"] == "node")
    assert boot["node"] == "n0" and not boot["skipped"]
    assert "venv" in boot["steps"] and any("installed" in s for s in boot["steps"])
    assert any("md5 verified" in s for s in boot["steps"])
    cluster = next(e for e in events if e["event"] == "cluster")
    assert cluster["nodes"] == ["master", "n0"] and cluster["world_size"] == 2
    start = next(e for e in events if e["event"] == "start")
    assert (start["world_size"], start["nodes"], start["strategy"]) == (2, 2, "ddp")
    assert kinds[-1] == "done" and events[-1]["step"] == 8
    # The master's run directory holds the relayed events (the same stream) and the checkpoint.
    assert [e["event"] for e in json_lines((run_dir / "events.jsonl").read_text())] == kinds
    a, b = weights(tmp_path / "single"), weights(run_dir)
    assert a["step"] == b["step"] == 8
    for key in a["model"]:
        torch.testing.assert_close(a["model"][key], b["model"][key], rtol=1e-4, atol=1e-5, msg=key)
    torch.manual_seed(3)
    from gputui.train import nets

    init = nets.build("seed", (28, 28), 10).state_dict()
    assert any(not torch.allclose(init[k], a["model"][k]) for k in init)  # it really trained
    # The slave's own copy (every node's local rank 0 keeps one) agrees.
    (remote,) = remote_run_dirs("multi", node)  # runs/multi-<nonce>
    torch.testing.assert_close(torch.load(Path(remote) / "ckpt.pt", weights_only=True)["model"], b["model"])
    # The slave's venv imports the installed wheel, not this source tree.
    venv_py = node.home / ".gputui-cluster" / "venv" / "bin" / "python"  # type: ignore[operator]
    where = subprocess.run([str(venv_py), "-c", "import gputui; print(gputui.__file__)"], capture_output=True,
                           text=True, cwd=str(node.home), env={"PATH": "/usr/bin:/bin"})
    assert str(venv_py.parent.parent) in where.stdout, where
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("multi", node)) == []


def test_bootstrap_installs_once_then_skips_and_a_new_data_set_is_only_copied(
    cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    # How long each bootstrap takes (fresh, and already bootstrapped: target <= 2 s) is measured by
    # benchmarks/bench_cluster.py; here: what each one does.
    node = cluster_nodes.node(2)  # a node of its own: nothing bootstrapped it before
    trust(gputui_home, node)
    spec = HostSpec("n2", node.address, node.port, "root", cluster_nodes.user_key)
    wheel = build_wheel()

    def bootstrap(data: Path) -> Any:
        conn = SlaveConnection(spec).open_or_raise()
        try:
            return Bootstrapper("~/.gputui-cluster", "python3", wheel, local_dataset(data)).bootstrap(conn)
        finally:
            conn.close()

    first = bootstrap(small_data)
    assert not first.skipped
    assert "venv" in first.steps and any("installed" in step for step in first.steps), first.steps
    assert any("md5 verified" in step for step in first.steps), first.steps

    again = bootstrap(small_data)
    assert again.skipped and again.steps == []
    assert again.base == first.base and again.data_dir == first.data_dir

    # Another data set (other images, so another digest): checked and copied, the venv left as it is.
    other = make_dataset(tmp_path / "other", 256, 128)
    assert local_dataset(other).digest != local_dataset(small_data).digest
    third = bootstrap(other)
    assert not third.skipped
    assert "venv" not in third.steps and not any("installed" in step for step in third.steps), third.steps
    assert [step for step in third.steps if "md5 verified" in step] == third.steps and third.steps, third.steps
    assert third.data_dir != first.data_dir and third.base == first.base
    # Both data sets are now on the node: either one skips everything.
    assert bootstrap(small_data).skipped and bootstrap(other).skipped


def _worker_pids(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        # the trainer itself, not its node supervisor or torchrun (whose command lines name it too)
        if "-m gputui.cluster.worker" in cmd and marker in cmd and "gputui.cluster.node" not in cmd \
                and "gputui.train.launch" not in cmd:
            found.append(proc)
    return found


def test_a_killed_trainer_restarts_and_the_run_resumes_from_its_checkpoint(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, *two_nodes)
    # No master node: both ranks run on slaves; rank 0's events and checkpoints come back over SSH.
    profile = cluster_profile(tmp_path / "cluster.toml", two_nodes, cluster_nodes.user_key, {"threads": 1},
                              master_trains=False)
    run_dir = tmp_path / "killed"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(medium_data),
            "--epochs", "3", "--batch-size", "16", "--seed", "5", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(), name="gputui run (two slaves)") as child:
        epoch = child.wait_for(lambda e: e["event"] == "epoch" and e["epoch"] == 1, 240, "the end of epoch 1")
        victims = _worker_pids(str(two_nodes[1].home))
        assert victims, "no trainer of node n1 found"
        killed = epoch["step"]
        for victim in victims:
            victim.kill()
        code = finish(child, 240, "the restarted run to finish", run_dir)
    seen, err = child.events, child.stderr
    assert code == 0, err + logs(run_dir)
    kinds = [e["event"] for e in seen]
    restarted = next(e for e in seen if e["event"] == "restarted")
    assert restarted["restart"] >= 1 and restarted["resumed_from_step"] == killed
    resumed = next(e for e in seen if e["event"] == "resumed")
    steps_per_epoch = next(e for e in seen if e["event"] == "start")["steps_per_epoch"]
    assert resumed["from_step"] == killed and 0 <= resumed["lost_steps"] <= steps_per_epoch
    starts = [e for e in seen if e["event"] == "start"]
    assert len(starts) >= 2 and starts[-1]["resumed_from_step"] == killed
    assert kinds[-1] == "done" and seen[-1]["step"] == 3 * steps_per_epoch
    assert [e["epoch"] for e in seen if e["event"] == "epoch"] == [1, 2, 3]
    # The checkpoint came back to the master's run directory.
    assert weights(run_dir)["step"] == 3 * steps_per_epoch
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("killed", *two_nodes)) == []
