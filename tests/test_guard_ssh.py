"""The budget guard's checkpoint over real OpenSSH to a loopback sshd ("slave" 127.0.0.2).

A real `gputui run` trains on the slave and is registered with its spot watcher as a cluster node
registers (GPUTUI_HOME=<remote_dir>/home); the guard, on a
simulated cloud whose slave record points at the sshd, trips on a tiny budget and reaches
the slave with the `ssh` client the way it would reach an EC2 slave: the private half of
[cloud] public_key (here under a non-default file name, so ssh would not find it alone),
host keys from gputui's known_hosts under GPUTUI_HOME, strict checking.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import launch, plan_launch, wait_running
from gputui.cloud.context import CloudContext
from gputui.cloud.budget import BudgetGuard
from gputui.cloud.remote import cloud_checkpointer, private_key, ssh_checkpointer, ssh_command
from gputui.cloud.settings import CloudSettings
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster.bootstrap import Bootstrapped
from gputui.cluster.manager import default_host_spec
from gputui.cluster.settings import cluster_settings
from gputui.model.errors import GputuiError
from gputui.model.cloud import InstanceInfo, InstanceRecord
from gputui.config.profile import parse_profile

from .cluster_fixture import ClusterNodes, cluster_nodes, trust  # noqa: F401 - fixture
from .proc_support import Child
from .sshd_fixture import Sshd
from .test_cloud_budget import Clock


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """GPUTUI_HOME with a space and a '%' in it: both mean something to ssh_config."""
    path = tmp_path / "gputui home %h"
    monkeypatch.setenv("GPUTUI_HOME", str(path))
    return path


@pytest.fixture
def lab_key(cluster_nodes: ClusterNodes, tmp_path: Path) -> Path:
    """The nodes' authorised key pair under a name ssh never tries by itself; returns the .pub."""
    folder = tmp_path / "keys %d"
    folder.mkdir()
    private = folder / "lab-slaves"
    shutil.copy(cluster_nodes.user_key, private)
    shutil.copy(cluster_nodes.user_key.with_suffix(".pub"), folder / "lab-slaves.pub")
    private.chmod(0o600)
    return folder / "lab-slaves.pub"


def guard_on(node: Sshd, public_key: Path, tmp_path: Path) -> tuple[BudgetGuard, CloudContext, str]:
    """A guard over one simulated slave whose record's address is `node`, a budget already spent."""
    clock = Clock()
    settings = CloudSettings(budget_usd=0.001, zones=("us-east-1a",), ssh_cidr="198.51.100.7/32", ssh_user="root",
                             public_key=str(public_key), source=tmp_path / "p.toml")
    provider = SimProvider(script=SimScript(seed=3, launch_delay_s=0, shutdown_delay_s=0), clock=clock)
    ctx = CloudContext(settings, provider, Ledger(), "lab", "me", clock=clock, sleep=clock.sleep)
    wait_running(ctx, launch(ctx, plan_launch(ctx, 1)))
    (record,) = ctx.ledger.instances(running=True)
    ctx.ledger.update_instance(record.instance_id, "running", node.address)
    return BudgetGuard(ctx, 60.0, cloud_checkpointer(settings, port=node.port), grace_s=0.0), ctx, record.instance_id


def node_boot(node: Sshd) -> Bootstrapped:
    """The node as `gputui cluster` bootstraps it at [cluster] remote_dir's default: a venv whose python
    has gputui (here: this interpreter) and the home/ its nodes and sweep workers run with as GPUTUI_HOME."""
    assert node.home is not None
    boot = Bootstrapped("node0", str(node.home / ".gputui-cluster"),
                        "python3", "", str(node.home / ".gputui-cluster" / "data"), False)
    venv_python = Path(boot.venv_python)
    venv_python.parent.mkdir(parents=True, exist_ok=True)
    venv_python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    venv_python.chmod(0o755)
    Path(boot.home).mkdir(parents=True, exist_ok=True)
    return boot


@pytest.fixture
def slave_run(cluster_nodes: ClusterNodes, small_data: Path, tmp_path: Path) -> Iterator[tuple[Sshd, Child, Path]]:
    """A node, and a real training run on it registered the way a cluster node registers its torchrun
    (gputui.cluster.node --spot-watcher): the spot watcher, run by the node's venv python with
    GPUTUI_HOME=<remote_dir>/home, after the run's first checkpoint."""
    node = cluster_nodes.node(0)
    boot = node_boot(node)
    run_dir = tmp_path / "slave-run"
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--data", str(small_data), "--epochs", "1000",
                "--batch-size", "64", "--threads", "1", "--run-dir", str(run_dir)],
               env={**os.environ, "GPUTUI_HOME": str(tmp_path / "slave-home")}, name="gputui run on the slave") as run:
        # After an epoch a checkpoint exists and its signal handlers are in place.
        run.wait_for(lambda e: e["event"] == "epoch", 120, "an 'epoch' event")
        env = {**os.environ, "HOME": str(node.home), "GPUTUI_HOME": boot.home}
        spot = subprocess.Popen([boot.venv_python, "-m", "gputui.cloud.watcher", "--pid", str(run.proc.pid),
                                 "--imds", "http://127.0.0.1:9"], env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            entry = Path(boot.home) / "watched" / str(run.proc.pid)
            deadline = time.monotonic() + 60
            while not entry.exists():
                assert spot.poll() is None, f"the spot watcher exited ({spot.returncode}) before registering the run"
                assert time.monotonic() < deadline, f"gave up after 60 s waiting for the spot watcher to write {entry}"
                time.sleep(0.05)
            yield node, run, entry
        finally:
            spot.kill()
            spot.wait()


def test_the_guard_checkpoints_a_real_run_over_ssh_with_the_profiles_key(
    slave_run: tuple[Sshd, Child, Path], lab_key: Path, home: Path, tmp_path: Path
) -> None:
    node, run, _entry = slave_run
    trust(home, node)
    guard, ctx, instance = guard_on(node, lab_key, tmp_path)
    raised = guard.check()
    assert len(raised) == 1, [e.message for e in raised]
    # The remote watcher SIGTERMed it: it checkpointed.
    stopped = run.wait_for(lambda e: e["event"] == "interrupted", 60, "an 'interrupted' event")
    assert run.proc.wait(timeout=60) == 0
    assert stopped["reason"] == "SIGTERM" and Path(stopped["checkpoint"]).is_file()
    messages = [e.message for e in raised]
    assert len(messages) == 1 and "checkpointing runs, terminating 1 slave" in messages[0], messages
    record = ctx.ledger.get(instance)
    assert record is not None and record.ended_by == "budget" and not record.running


def test_an_unknown_host_key_fails_the_checkpoint_and_the_guard_says_so(
    slave_run: tuple[Sshd, Child, Path], lab_key: Path, home: Path, tmp_path: Path
) -> None:
    node, run, _entry = slave_run
    guard, ctx, instance = guard_on(node, lab_key, tmp_path)  # the node's host key is trusted nowhere
    guard.check()
    kinds = [(e.kind, e.message) for e in ctx.ledger.events()]
    stops = [m for k, m in kinds if k == "budget_stop"]
    assert len(stops) == 2 and stops[1].startswith(f"could not ask the runs to checkpoint: {instance}: ssh exit 255: "
                                                   f"host key of [{node.address}]:{node.port} is unknown or has changed: "
                                                   "refused (strict checking)"), stops
    # What it did next, in this order: said so, then terminated the slave anyway (the budget is spent).
    said = kinds.index(("budget_stop", stops[1]))
    assert [k for k, _m in kinds[said + 1:]] == ["terminated"]
    record = ctx.ledger.get(instance)
    assert record is not None and record.ended_by == "budget"
    # Nothing reached the slave's run: two more epochs end with no stop (a SIGTERM sent before
    # check() returned would have stopped it at its next step).
    for _ in range(2):
        event = run.wait_for(lambda e: e["event"] in ("epoch", "interrupted"), 60, "an epoch")
        assert event["event"] == "epoch", event
    assert not (home / "known_hosts").exists()  # the unknown key was not recorded either


def test_without_the_private_key_authentication_fails_with_a_reason(
    cluster_nodes: ClusterNodes, home: Path, tmp_path: Path
) -> None:
    """The old command (no -i) against a key under a non-default name: what the guard now avoids."""
    node = cluster_nodes.node(0)
    trust(home, node)
    record = InstanceRecord("i-1", "ec2", "us-east-1", "lab", None, "g4dn.xlarge", "us-east-1a", "spot", 0.2, 0.0,
                            None, "running", None, node.address)
    with pytest.raises(GputuiError) as info:
        ssh_checkpointer("root", identity=None, port=node.port)([record])
    assert f"i-1: ssh exit 255: authentication failed for root@[{node.address}]:{node.port}" in str(info.value)


def test_the_command_uses_the_cluster_managers_key_and_strict_host_keys(lab_key: Path, home: Path) -> None:
    text = f'[cloud]\nbudget_usd = 5\nssh_cidr = "198.51.100.7/32"\npublic_key = "{lab_key}"\n[cluster]\ncloud_slaves = 1\n'
    found = cluster_settings(parse_profile(text, lab_key.parent / "p.toml"))
    assert found is not None and found.cloud is not None
    info = InstanceInfo("i-1", "g4dn.xlarge", "us-east-1a", "running", "spot", 0.0, "203.0.113.9")
    manager_key = default_host_spec(found)(info).identity_file
    assert manager_key == private_key(found.cloud) == lab_key.with_suffix("")
    command = ssh_command("ubuntu", "203.0.113.9", private_key(found.cloud), known_hosts=[home / "known_hosts"])
    options = [command[i + 1] for i, word in enumerate(command) if word == "-o"]
    assert {"BatchMode=yes", "IdentitiesOnly=yes", "StrictHostKeyChecking=yes"} <= set(options)
    assert f'UserKnownHostsFile="{str(home / "known_hosts").replace("%", "%%")}"' in options
    assert f'IdentityFile="{str(lab_key.with_suffix("")).replace("%", "%%")}"' in options
    assert not any("accept-new" in o or o.endswith("=no") for o in options)
    default = ssh_command("ubuntu", "203.0.113.9")  # the project's two files: ~/.ssh's and gputui's
    assert any(o.startswith("UserKnownHostsFile=") and "known_hosts" in o and "%%" in o for o in default)
