"""A cluster run is its own: slaves keep it under its nonce (two run folders of one name, or a
folder deleted and made again, never share a slave's checkpoint), workers resume only from
the checkpoint the master names, rank 0's events name the master's run directory, and the
master's copy of the checkpoint survives a failed fetch."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui.runs import store as runs
from gputui.cluster.launch import ClusterRun
from gputui.cluster.settings import load_cluster
from gputui.cluster.sshnode import SlaveConnection
from gputui.config.run import RunSettings

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env, json_lines, run_cli
from .proc_support import Child
from .sshd_fixture import Sshd

EVENT_TAG = "@@gputui-event "


@pytest.fixture(scope="module")
def slave(cluster_nodes: ClusterNodes) -> Sshd:
    return cluster_nodes.shared_node(0)


def slave_only(tmp_path: Path, slave: Sshd, cluster_nodes: ClusterNodes, gputui_home: Path) -> Path:
    """One static slave and no master node: rank 0 and every checkpoint live on the slave."""
    trust(gputui_home, slave)
    return cluster_profile(tmp_path / "cluster.toml", [slave], cluster_nodes.user_key, {"threads": 1}, master_trains=False)


def train(profile: Path, data: Path, run_dir: Path, epochs: int = 1) -> list[dict[str, Any]]:
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
            "--epochs", str(epochs), "--batch-size", "64", "--seed", "3", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(), name=f"gputui run {run_dir.name}") as child:
        code = child.finish(240, f"the run in {run_dir} to finish")
    assert code == 0, child.stderr
    return child.events


def test_runs_of_one_folder_name_never_share_a_slave_checkpoint(
    slave: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    profile = slave_only(tmp_path, slave, cluster_nodes, gputui_home)
    first = train(profile, small_data, tmp_path / "a" / "run")
    assert first[-1]["event"] == "done" and first[-1]["step"] == 8
    for run_dir in (tmp_path / "b" / "run", tmp_path / "a" / "run"):  # the same name elsewhere; then made again
        if run_dir.exists():
            shutil.rmtree(run_dir)
        seen = train(profile, small_data, run_dir)
        start = next(e for e in seen if e["event"] == "start")
        # Rank 0 runs on the slave: its start event is relayed as the master's run.
        assert (start["resumed_from_step"], start["run_dir"], start["run_id"]) == (None, str(run_dir), "run")
        assert [e["step"] for e in seen if e["event"] == "done"] == [8]
    assert len(remote_run_dirs("run", slave)) == 3  # run-<nonce> each time
    assert wait_no_leftovers(str(tmp_path), *remote_run_dirs("run", slave)) == []


def worker(run_dir: Path, *extra: str) -> list[dict[str, Any]]:
    """gputui.cluster.worker as one torchrun rank on this machine; its events."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=1",
                          f"--log-dir={run_dir.parent / 'torchrun-logs'}",  # not a torchelastic_* left in /tmp
                          "-m", "gputui.cluster.worker", "--gputui-run-dir", str(run_dir), "--gputui-node", "here", *extra],
                         capture_output=True, text=True, timeout=240, env=cli_env(OMP_NUM_THREADS="1"))
    assert out.returncode == 0, out.stderr[-3000:]
    return json_lines("\n".join(ln[len(EVENT_TAG):] for ln in out.stdout.splitlines() if ln.startswith(EVENT_TAG)))


def test_a_worker_resumes_only_from_the_checkpoint_the_master_names(small_data: Path, tmp_path: Path) -> None:
    done = run_cli("run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "64", "--device", "cpu",
                   "--threads", "1", "--run-dir", str(tmp_path / "old"))
    assert done.returncode == 0, done.stderr
    here = tmp_path / "node"
    here.mkdir()
    shutil.copy(tmp_path / "old" / "profile.toml", here / "profile.toml")
    shutil.copy(tmp_path / "old" / "ckpt.pt", here / "ckpt.pt")  # another run's, left in this directory
    fresh = worker(here)
    assert fresh[0]["event"] == "start" and fresh[0]["resumed_from_step"] is None
    assert fresh[-1]["event"] == "done" and fresh[-1]["step"] == 8  # it trained the whole epoch
    assert (here / "ckpt.pt.stale").is_file()  # set aside, not resumed
    os.replace(tmp_path / "old" / "ckpt.pt", here / "ckpt.pt")
    named = worker(here, "--gputui-resume", str(here / "ckpt.pt"))
    assert named[0]["event"] == "start" and named[0]["resumed_from_step"] == 8


def test_a_failed_checkpoint_fetch_is_a_warning_and_the_run_finishes(
    slave: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path, gputui_home: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    profile = slave_only(tmp_path, slave, cluster_nodes, gputui_home)
    real_get = SlaveConnection.get
    failed: list[str] = []

    def get_once_failing(self: SlaveConnection, remote: str, *args: Any, **kw: Any) -> bool:
        if not failed:  # the first fetch (epoch 1's): the SFTP channel drops
            failed.append(remote)
            raise EOFError("SFTP channel closed")
        return real_get(self, remote, *args, **kw)

    monkeypatch.setattr(SlaveConnection, "get", get_once_failing)
    shown: list[dict[str, Any]] = []
    view = type("View", (), {"show": lambda self, e: shown.append(e), "close": lambda self: None})()
    run = runs.create(tmp_path / "run")
    cfg = RunSettings(data=str(small_data), epochs=2, batch_size=64, seed=3, device="cpu", threads=1).resolve()
    assert ClusterRun(run, cfg, load_cluster(profile), view).execute(False) == "done"
    kinds = [e["event"] for e in shown]
    warning = next(e for e in shown if e["event"] == "warning")
    assert warning["reason"] == "checkpoint_fetch" and "checkpoint of step 8 from n0 not fetched" in warning["message"]
    assert failed and kinds.index("warning") < kinds.index("done")
    assert [e["epoch"] for e in shown if e["event"] == "epoch"] == [1, 2]
    from gputui.train import checkpoint

    assert checkpoint.load(run.checkpoint)["step"] == 16  # the later fetches came
    assert wait_no_leftovers(str(run.path), *remote_run_dirs("run", slave)) == []
