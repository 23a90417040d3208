"""Another account that reaches a run's rendezvous store runs no code there.

The attacker knows what `ps` shows every account (`--rdzv-endpoint`, `--rdzv-id`), connects to
the store without any credential and writes a pickle where torchrun's c10d rendezvous reads its
state (`torch.rendezvous.<id>`, base64). gputui's launcher never unpickles anything from the
store: the payload (it makes a directory) never runs, and the run finishes."""

from __future__ import annotations

import base64
import io
import os
import pickle
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import psutil
import pytest

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env, run_cli
from .proc_support import Child
from .sshd_fixture import Sshd


class Payload:
    """Unpickling this makes the directory `marker`: code run by whoever unpickles it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.mkdir, (str(self.marker),)


def state(marker: Path) -> bytes:
    """The payload as torch's c10d rendezvous backend keeps its state: a pickle, base64."""
    return base64.b64encode(pickle.dumps(Payload(marker)))


def rendezvous_of(*markers: str) -> set[tuple[str, str]]:
    """(endpoint, run id) of every process naming one of `markers`, read as any account reads `ps`."""
    found = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if not any(m in " ".join(cmd) for m in markers):
            continue
        args = dict(a.split("=", 1) for a in cmd if a.startswith(("--rdzv-endpoint=", "--rdzv-id=")))
        if "--rdzv-endpoint" in args and "--rdzv-id" in args:
            found.add((args["--rdzv-endpoint"], args["--rdzv-id"]))
    return found


def plant(marker: Path, *markers: str) -> set[tuple[str, str]]:
    """Write the payload into every store the run's processes name; the stores it reached."""
    import torch.distributed as tdist

    targets = rendezvous_of(*markers)
    assert targets, f"no process of the run names a rendezvous ({markers})"
    planted = state(marker)
    for endpoint, run_id in targets:
        host, port = endpoint.rsplit(":", 1)
        store = tdist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=30))
        store.set(f"torch.rendezvous.{run_id}", planted)  # what dynamic_rendezvous.py would unpickle
        store.set(run_id, planted)
    return targets


def test_the_payload_runs_when_unpickled(tmp_path: Path) -> None:
    """The check can fail: unpickling the planted bytes, as torch's rendezvous would, makes the marker."""
    marker = tmp_path / "ran"
    pickle.Unpickler(io.BytesIO(base64.b64decode(state(marker)))).load()
    assert marker.is_dir()


def test_a_pickle_written_into_a_ddp_runs_store_never_runs(medium_data: Path, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "ddp"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--data", str(medium_data), "--epochs", "2",
            "--batch-size", "16", "--seed", "1", "--strategy", "ddp", "--nproc", "2", "--device", "cpu",
            "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(OMP_NUM_THREADS="1"), name="gputui run --strategy ddp") as run:
        run.wait_for(lambda e: e["event"] == "step", 180, "the first step")  # the agents are past their rendezvous
        targets = plant(marker, str(run_dir))
        run.wait_for(lambda e: e["event"] == "epoch", 180, "an epoch after the payload was written")
        code = run.finish(240, "the ddp run")
    assert not marker.exists(), "a pickle from another process ran in the run's launcher"
    assert targets and all(e.startswith("127.0.0.1:") for e, _id in targets), targets
    assert code == 0, run.stderr + (run_dir / "launcher.log").read_text()[-3000:]
    assert run.events[-1]["event"] == "done"


def test_the_launcher_without_its_token_says_so_in_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in cli_env().items() if not k.startswith("GPUTUI_RDZV_")}
    import subprocess

    out = subprocess.run([sys.executable, "-m", "gputui.train.launch", "--nnodes=1", "--rdzv-backend=gputui",
                          "--rdzv-endpoint=127.0.0.1:1", "--rdzv-id=x", "--rdzv-conf=rank=0", "-m", "json.tool"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        "gputui launcher: no rendezvous token (GPUTUI_RDZV_TOKEN or GPUTUI_RDZV_TOKEN_FILE): start the run with gputui"]


def test_the_launcher_that_cannot_make_its_directory_says_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import errno
    import tempfile

    from gputui.train import launch
    from gputui.train.rdzv import TOKEN_ENV, new_token

    def full(*_a: object, **_k: object) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setenv(TOKEN_ENV, new_token())
    monkeypatch.setattr(tempfile, "mkdtemp", full)
    assert launch.main(["--nnodes=1", "-m", "json.tool"]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"gputui launcher: cannot make torchrun's directory in {tempfile.gettempdir()}: No space left on device; "
        "free space there or point TMPDIR elsewhere"]


def test_a_launch_removes_the_torchrun_directories_killed_launchers_left_and_nothing_else(tmp_path: Path) -> None:
    from gputui.train.launch import LOG_DIR_PREFIX, sweep_log_dirs

    gone = int(Path("/proc/sys/kernel/pid_max").read_text()) + 1  # no process has this pid
    dead = tmp_path / f"{LOG_DIR_PREFIX}{gone}-abc"
    (dead / "run_0" / "attempt_0" / "0").mkdir(parents=True)
    live = tmp_path / f"{LOG_DIR_PREFIX}{os.getpid()}-def"  # a launcher still running
    live.mkdir()
    target = tmp_path / "someone-elses"
    (target / "keep").mkdir(parents=True)
    link = tmp_path / f"{LOG_DIR_PREFIX}{gone}-link"  # planted: a link is never followed or removed
    link.symlink_to(target)
    odd = tmp_path / f"{LOG_DIR_PREFIX}notapid-x"
    odd.mkdir()
    other = tmp_path / f"torchelastic_{gone}"  # not gputui's
    other.mkdir()
    sweep_log_dirs(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, target.name, link.name, odd.name, other.name])
    assert (target / "keep").is_dir()


@pytest.fixture(scope="module")
def node(cluster_nodes: ClusterNodes) -> Sshd:
    return cluster_nodes.node(0)


def test_a_pickle_written_into_a_cluster_runs_stores_never_runs(
    node: Sshd, cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, node)
    profile = cluster_profile(tmp_path / "c.toml", [node], cluster_nodes.user_key, {"threads": 1})
    marker = tmp_path / "pwned"
    run_dir = tmp_path / "two"
    argv = [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(medium_data),
            "--epochs", "2", "--batch-size", "16", "--seed", "2", "--device", "cpu", "--run-dir", str(run_dir)]
    with Child(argv, env=cli_env(), name="cluster run (master + n0)") as run:
        cluster = run.wait_for(lambda e: e["event"] == "cluster", 240, "the cluster event")
        run.wait_for(lambda e: e["event"] == "step", 240, "the first step")
        # The master's store, and the slave's way to it (the reverse forward on its loopback).
        targets = plant(marker, str(run_dir), *remote_run_dirs("two", node))
        run.wait_for(lambda e: e["event"] == "epoch", 240, "an epoch after the payload was written")
        code = run.finish(240, "the cluster run")
    assert not marker.exists(), "a pickle from another process ran in a node's launcher"
    endpoints = {e for e, _id in targets}
    assert cluster["rdzv"] in endpoints and len(endpoints) == 2, (cluster["rdzv"], targets)
    assert code == 0, run.stderr
    assert run.events[-1]["event"] == "done"
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("two", node)) == []
