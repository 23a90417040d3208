"""Stopping a cluster run with cloud slaves on the simulated cloud: Ctrl-C during bring-up ends
it without training and without claiming a checkpoint, further Ctrl-Cs cannot skip the
release of the slaves, and slaves launched before a failure are released too.

The simulated slaves' addresses (203.0.113.x) never answer SSH, so a run started here stays
in its bring-up (waiting up to 300 s for SSH) until it is stopped: every signal is sent on an
event of the run, and the teardown is held inside the release of the slaves by holding the
simulated cloud's state-file lock, which every cloud call of the run takes.
"""

from __future__ import annotations

import fcntl
import json
import signal
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.runs import store as runs
from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster.launch import ClusterRun
from gputui.cluster.manager import SlaveManager
from gputui.cluster.settings import cluster_settings
from gputui.model.errors import GputuiError
from gputui.config.run import RunSettings
from gputui.config.profile import parse_profile

from .conftest import cli_env, run_cli
from .moto_fixture import sim_cloud_profile
from .proc_support import Child

RELEASING_TWO = "stopping: 2 slaves being released"


@pytest.fixture
def sim_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two cloud slaves on the simulated cloud (launched at once, running at once), the master trains too."""
    return sim_cloud_profile(tmp_path, monkeypatch, "stop", 50, "0",
                             "trust_on_first_use = true\n\n[cluster]\nname = \"stop\"\ncloud_slaves = 2\nmaster_addr = \"127.0.0.1\"\n")


def start_run(profile: Path, data: Path, run_dir: Path) -> Child:
    return Child([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
                  "--epochs", "1", "--device", "cpu", "--run-dir", str(run_dir)], env=cli_env(), name="gputui run (sim cloud)")


def live_instances(profile: Path) -> list[dict[str, Any]]:
    """What `gputui cloud ls` shows still pending or running."""
    listed = run_cli("cloud", "ls", "--json", "--profile", str(profile), timeout=120)
    assert listed.returncode == 0, listed.stderr
    return [i for i in json.loads(listed.stdout)["instances"] if i["state"] in ("pending", "running")]


@pytest.fixture
def cloud_lock(gputui_home: Path) -> Iterator[Any]:
    """Take (with `hold`) and give back the simulated cloud's state-file lock."""
    path = gputui_home / "cloud-sim.json"

    class Lock:
        fh: Any = None

        def hold(self) -> None:
            self.fh = open(path, "a+", encoding="utf-8")
            fcntl.flock(self.fh, fcntl.LOCK_EX)

        def release(self) -> None:
            if self.fh is not None:
                fcntl.flock(self.fh, fcntl.LOCK_UN)
                self.fh.close()
                self.fh = None

    lock = Lock()
    try:
        yield lock
    finally:
        lock.release()


def test_ctrl_c_during_bring_up_ends_the_run_without_training_and_releases_the_slaves(
    sim_cluster: Path, small_data: Path, tmp_path: Path,
) -> None:
    run_dir = tmp_path / "r"
    with start_run(sim_cluster, small_data, run_dir) as run:
        started = run.wait_for(lambda e: e["event"] == "slaves_started", 120, "the slaves to start")
        run.proc.send_signal(signal.SIGINT)  # the master now waits (up to 300 s) for the slaves' SSH
        code = run.finish(60, "the run to end after Ctrl-C in its bring-up")
    kinds = run.kinds()
    assert code == 0, run.stderr
    assert "cluster" not in kinds and "start" not in kinds, kinds  # no node was started
    interrupted = next(e for e in run.events if e["event"] == "interrupted")
    assert interrupted["reason"] == "SIGINT" and interrupted.get("checkpoint") is None
    stopping = next(e for e in run.events if e["event"] == "stopping")
    assert stopping["slaves"] == 2 and stopping["reason"] == "SIGINT" and "2 slaves being released" in stopping["message"]
    terminated = next(e for e in run.events if e["event"] == "slaves_terminated")
    assert sorted(terminated["instances"]) == sorted(started["instances"]) and len(started["instances"]) == 2
    assert "checkpoint saved" not in run.stderr and "Traceback" not in run.stderr
    assert "interrupted before training started: nothing to save" in run.stderr
    assert not (run_dir / "ckpt.pt").exists()
    assert live_instances(sim_cluster) == []
    with Ledger() as ledger:
        assert {r.instance_id: r.ended_by for r in ledger.instances(cluster="stop")} == \
            {i: "run-end" for i in started["instances"]}


def test_a_third_ctrl_c_during_teardown_still_releases_every_slave(
    sim_cluster: Path, small_data: Path, tmp_path: Path, cloud_lock: Any,
) -> None:
    with start_run(sim_cluster, small_data, tmp_path / "r") as run:
        started = run.wait_for(lambda e: e["event"] == "slaves_started", 120, "the slaves to start")
        cloud_lock.hold()  # the run's next cloud call (the release, in its teardown) waits for this lock

        def stopping(count: int) -> Any:
            return lambda e: e["event"] == "stopping" and run.kinds().count("stopping") == count

        run.proc.send_signal(signal.SIGINT)
        # Two: the answer to Ctrl-C (in whatever phase it came) and the teardown's own, as it begins.
        run.wait_for(stopping(2), 60, "the teardown to begin")
        for nth in (2, 3):  # each one answered at once, the teardown going on
            run.proc.send_signal(signal.SIGINT)
            said = run.wait_for(stopping(nth + 1), 60, f"the answer to Ctrl-C number {nth}")
            assert (said["message"], said["slaves"], said["processes"], said["reason"]) == (RELEASING_TWO, 2, 0, "SIGINT")
        assert run.proc.poll() is None, "the run ended while its teardown was held"
        cloud_lock.release()
        code = run.finish(60, "the teardown to finish once the cloud answers")
    assert code == 0, run.stderr
    assert "Traceback" not in run.stderr and "checkpoint saved" not in run.stderr
    assert run.kinds().count("stopping") == 4  # three Ctrl-Cs and the teardown's start
    terminated = next(e for e in run.events if e["event"] == "slaves_terminated")
    assert sorted(terminated["instances"]) == sorted(started["instances"])
    assert live_instances(sim_cluster) == []


def test_a_slave_launched_before_its_wait_to_run_timed_out_is_released(tmp_path: Path, gputui_home: Path) -> None:
    key = tmp_path / "id.pub"
    from .moto_fixture import public_key_line

    key.write_text(public_key_line() + "\n")
    text = (f'[cloud]\nbudget_usd = 5.0\nzones = ["us-east-1a"]\nssh_cidr = "198.51.100.7/32"\npublic_key = "{key}"\n'
            '[cluster]\nname = "slow"\ncloud_slaves = 1\nmaster_addr = "127.0.0.1"\n')
    settings = cluster_settings(parse_profile(text, tmp_path / "p.toml"))
    assert settings is not None and settings.cloud is not None
    provider = SimProvider(script=SimScript(launch_delay_s=1e9))  # launched, and never running
    ctx = CloudContext(settings.cloud, provider, Ledger(gputui_home / "ledger.sqlite3"), "slow", "me",
                       wait_timeout_s=0.0)
    shown: list[dict[str, Any]] = []
    view = type("View", (), {"show": lambda self, e: shown.append(e), "close": lambda self: None})()
    run = runs.create(tmp_path / "run")
    cfg = RunSettings(epochs=1, device="cpu").resolve()
    with pytest.raises(GputuiError, match="timed out after 0 s waiting for 1 instance"):
        ClusterRun(run, cfg, settings, view, manager=SlaveManager(settings, ctx)).execute(False)
    (launched,) = provider.list_tagged({})
    assert provider.describe([launched.instance_id])[0].state in ("shutting-down", "terminated")
    record = ctx.ledger.get(launched.instance_id)
    assert record is not None and record.ended_by == "run-end"
    assert [e["instances"] for e in shown if e["event"] == "slaves_terminated"] == [[launched.instance_id]]
