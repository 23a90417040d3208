"""What the budget guard runs on a slave to ask its runs to checkpoint (gputui.cloud.remote), the
[cloud] stalled_minutes key, and the training heartbeat the slave's watchdog reads."""

from __future__ import annotations

import os
import stat
import subprocess
import time
from pathlib import Path

import pytest

from gputui.cloud.heartbeat import Heartbeat
from gputui.cloud.remote import remote_checkpoint, ssh_command
from gputui.cloud.settings import load_cloud_settings
from gputui.model.errors import UserError


def fake_venv(base: Path, log: Path) -> None:
    """A bootstrapped base: a venv python that notes which gputui home it was asked in, and home/."""
    python = base / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\n[ "$1" = -c ] && exit 0\necho "{base.name} ${{GPUTUI_HOME:-default}} $*" >> "{log}"\n')
    python.chmod(0o755)
    (base / "home").mkdir()


def asked(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_the_checkpoint_asks_the_remote_dir_home_the_default_one_and_the_login_s_once_each(tmp_path: Path) -> None:
    log = tmp_path / "asked.txt"
    fake_venv(tmp_path / "elsewhere", log)
    fake_venv(tmp_path / ".gputui-cluster", log)
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    done = subprocess.run(["sh", "-c", remote_checkpoint("~/elsewhere")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    flags = "-m gputui.cloud.watcher --checkpoint-all"
    assert asked(log) == [f"elsewhere {tmp_path}/elsewhere/home {flags}",
                          f".gputui-cluster {tmp_path}/.gputui-cluster/home {flags}",
                          f"elsewhere default {flags}"]  # the login's own data home, with the first gputui
    log.unlink()
    env["GPUTUI_HOME"] = f"{tmp_path}/elsewhere/home"  # the login's home is one of them: asked once
    subprocess.run(["sh", "-c", remote_checkpoint("~/elsewhere")], env=env, timeout=60, check=True)
    assert [line.split()[1] for line in asked(log)] == [f"{tmp_path}/elsewhere/home", f"{tmp_path}/.gputui-cluster/home"]


def test_a_failed_checkpoint_is_the_command_s_exit_status(tmp_path: Path) -> None:
    log = tmp_path / "asked.txt"
    fake_venv(tmp_path / ".gputui-cluster", log)
    python = tmp_path / ".gputui-cluster" / "venv" / "bin" / "python"
    python.write_text('#!/bin/sh\n[ "$1" = -c ] && exit 0\n[ -n "$GPUTUI_HOME" ] && exit 5\nexit 0\n')
    env = {"HOME": str(tmp_path), "PATH": os.environ["PATH"]}
    done = subprocess.run(["sh", "-c", remote_checkpoint()], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 5


def test_the_guard_s_command_follows_the_profile_s_remote_dir(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text('[cloud]\nbudget_usd = 5\n[cluster]\ncloud_slaves = 1\nremote_dir = "/scratch/gputui"\n')
    settings = load_cloud_settings(profile)
    assert settings.remote_dir == "/scratch/gputui"
    assert "/scratch/gputui/home" not in ssh_command("u", "203.0.113.9")[-1]
    command = ssh_command("u", "203.0.113.9", remote_dir=settings.remote_dir)[-1]
    assert "for base in /scratch/gputui " in command


def test_stalled_minutes_defaults_to_an_hour_and_goes_to_the_slaves_as_a_tag(tmp_path: Path) -> None:
    from gputui.cloud.lease import launch_tags
    from gputui.cloud.tags import TAG_STALLED
    from gputui.cloud.ledger import Ledger
    from gputui.cloud.context import CloudContext
    from gputui.cloud.sim import SimProvider

    profile = tmp_path / "p.toml"
    profile.write_text("[cloud]\nbudget_usd = 5\n")
    settings = load_cloud_settings(profile)
    assert settings.stalled_minutes == 60.0
    ctx = CloudContext(settings, SimProvider(), Ledger(tmp_path / "ledger.sqlite"), "c", "me")
    assert launch_tags(ctx, 1000.0, 0.5)[TAG_STALLED] == "3600"
    profile.write_text("[cloud]\nbudget_usd = 5\nstalled_minutes = 0\n")
    assert load_cloud_settings(profile).stalled_minutes == 0


def test_stalled_minutes_within_the_join_timeout_is_refused_naming_the_key(tmp_path: Path) -> None:
    profile = tmp_path / "p.toml"
    profile.write_text("[cloud]\nbudget_usd = 5\nstalled_minutes = 5\n[cluster]\ncloud_slaves = 1\njoin_timeout = 600\n")
    with pytest.raises(UserError, match=r"stalled_minutes.*longer than \[cluster\] join_timeout \(600 s\)"):
        load_cloud_settings(profile)


def test_the_heartbeat_writes_the_time_whole_privately_and_at_most_once_a_second(tmp_path: Path) -> None:
    ticks = iter([0.0, 0.5, 0.99, 1.0, 1.2])
    wall = iter([1000.7, 1001.9])
    path = tmp_path / "home" / "heartbeat"
    heart = Heartbeat(path, clock=lambda: next(wall), monotonic=lambda: next(ticks))
    heart.beat()
    assert path.read_text() == "1000\n" and stat.S_IMODE(path.stat().st_mode) == 0o600
    heart.beat()
    heart.beat()  # 0.5 and 0.99 s later: no write
    assert path.read_text() == "1000\n"
    heart.beat()  # a second after the last write
    assert path.read_text() == "1001\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["heartbeat"]  # the temporary file was renamed


def test_a_heartbeat_that_cannot_be_written_never_stops_training(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    Heartbeat(blocker / "heartbeat").beat()  # no exception


def test_a_sweep_worker_beats_the_heartbeat_in_its_gputui_home_as_it_trains(small_data: Path, tmp_path: Path,
                                                                              gputui_home: Path) -> None:
    from tests.test_sweep_worker import WAIT, send, trial, worker

    heartbeat = gputui_home / "heartbeat"
    with worker(small_data) as child:
        child.wait_for(lambda e: e.get("op") == "ready", WAIT, "the worker's ready line")
        assert not heartbeat.exists()  # no step yet
        send(child, trial(0, small_data, tmp_path, epochs=1, batch_size=64, seed=0))
        result = child.wait_for(lambda e: e.get("op") == "result", WAIT, "the trial's result")
        assert result["outcome"] == "done", result
        assert child.proc.stdin is not None
        child.proc.stdin.close()
        assert child.finish(WAIT) == 0
    written = int(heartbeat.read_text())
    assert abs(written - time.time()) < 3600 and stat.S_IMODE(heartbeat.stat().st_mode) == 0o600
