"""Every hint gputui prints is a command that works as printed, for the provider, profile,
region and cluster at hand: each test triggers a hint on the simulated cloud, runs the
printed command in a subprocess, and checks that it did what the hint said. And the
simulated cloud needs no network; a real cloud's ssh_cidr comes by flag or environment."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.cloud.leaks import exit_check
from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.provider import instance_tags
from gputui.cloud.factory import make_provider
from gputui.cloud.settings import load_cloud_settings
from gputui.cloud.sim import SimProvider

from .conftest import cli_env, run_cli
from .moto_fixture import Aws, aws, moto_server, public_key_line  # noqa: F401 - fixtures


def write_profile(path: Path, region: str = "us-east-1", extra: str = "") -> Path:
    (path.parent / "id.pub").write_text(public_key_line() + "\n")
    path.write_text(f'[cloud]\nregion = "{region}"\npublic_key = "id.pub"\nbudget_usd = 50\n{extra}')
    return path


@pytest.fixture
def sim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The simulated cloud, named by flag only (nothing in the environment picks it)."""
    monkeypatch.delenv("GPUTUI_CLOUD", raising=False)
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", "0")
    monkeypatch.setenv("GPUTUI_PUBLIC_IP_URL", "http://127.0.0.1:9/")  # closed: a lookup would fail


def hint(text: str, after: str = "stop them with") -> str:
    """The command quoted in backticks after `after` (the first one)."""
    found = re.search(re.escape(after) + r"[^`]*`([^`]+)`", text)
    assert found, f"no `command` after {after!r} in: {text}"
    return found.group(1)


def run_hint(command: str) -> subprocess.CompletedProcess[str]:
    """Run a printed command as a user would (without a terminal), `gputui` being this checkout's."""
    words = shlex.split(command)
    assert words[0] == "gputui", command
    assert ";" not in command, command
    return subprocess.run([sys.executable, "-m", "gputui", *words[1:]], capture_output=True, text=True, timeout=120,
                          env=cli_env(), stdin=subprocess.DEVNULL)


def up(profile: Path, *extra: str) -> list[str]:
    """Launch on the simulated cloud; the ids launched."""
    with Ledger() as ledger:
        before = {r.instance_id for r in ledger.instances()}
    done = run_cli("cloud", "up", "--provider", "sim", "--profile", str(profile), "--yes", "--no-guard", *extra,
                   timeout=120)
    assert done.returncode == 0, done.stderr
    with Ledger() as ledger:
        return [r.instance_id for r in ledger.instances() if r.instance_id not in before]


def running() -> list[str]:
    with Ledger() as ledger:
        return [r.instance_id for r in ledger.instances(running=True)]


def test_the_leak_note_on_every_command_names_commands_that_work(sim: None, tmp_path: Path) -> None:
    # Slaves in two regions of the simulated cloud, one of them not the default profile's.
    home = up(write_profile(tmp_path / "east.toml"))
    away = up(write_profile(tmp_path / "west.toml", region="eu-west-1"))
    note = run_cli("runs", timeout=120).stderr  # any command that does not watch the cloud itself
    assert "note: 2 cloud instances running" in note, note
    for command in hint(note, "see").split("; "):
        listed = run_hint(command)
        assert listed.returncode == 0, (command, listed.stderr)
        assert "gputui instances in" in listed.stdout, (command, listed.stdout)
    stops = hint(note).split("; ")
    assert len(stops) == 2 and all("--provider sim" in s for s in stops), stops
    assert any("--region eu-west-1" in s for s in stops), stops
    for command in stops:
        done = run_hint(command)
        assert done.returncode == 0, (command, done.stderr)
    assert running() == []
    assert set(home + away) <= {r for r in _ended()}


def _ended() -> list[str]:
    with Ledger() as ledger:
        return [r.instance_id for r in ledger.instances(running=False) if r.ended_by == "user"]


def test_up_and_the_guards_exit_name_the_cluster_and_profile(sim: None, tmp_path: Path) -> None:
    profile = write_profile(tmp_path / "lab.toml")
    mine = up(profile, "--cluster", "mine", "--count", "2")
    other = up(profile, "--cluster", "other")
    done = run_cli("cloud", "up", "--provider", "sim", "--profile", str(profile), "--yes", "--no-guard",
                   "--cluster", "third", timeout=120)
    assert done.returncode == 0, done.stderr
    third = sorted(set(running()) - set(mine) - set(other))
    # `up` says how to stop what it started: that cluster only.
    printed = re.search(r"stop them with: (gputui cloud down [^\n(]*?)\s+\(costs", done.stderr)
    assert printed, done.stderr
    result = run_hint(printed.group(1))
    assert result.returncode == 0, (printed.group(1), result.stderr)
    assert sorted(set(running()) & set(third)) == []
    assert set(mine + other) <= set(running())
    # The guard's exit, headless, with the cluster's slaves up: the same kind of command.
    settings = load_cloud_settings(profile)
    ctx = CloudContext(settings, make_provider("sim", settings.region), Ledger(), "mine", "me")
    said: list[str] = []
    try:
        assert exit_check(ctx, False, lambda q: False, said.append) == 1
        assert exit_check(ctx, True, lambda q: False, said.append) == 0  # "left running by your choice"
    finally:
        ctx.ledger.close()
    headless, kept = hint(said[0]), hint(said[1], "stop them later with")
    assert headless == kept and "--cluster mine" in headless and "--provider sim" in headless
    result = run_hint(headless)
    assert result.returncode == 0, (headless, result.stderr)
    assert sorted(running()) == sorted(other)  # the other cluster was left alone


def test_the_orphan_caption_names_a_sweep_that_works(sim: None, tmp_path: Path, gputui_home: Path) -> None:
    profile = write_profile(tmp_path / "lab.toml", region="eu-west-1")
    up(profile)
    # An instance carrying gputui's tags that the records do not know (launched by another machine).
    from gputui.cloud.provider import LaunchRequest, default_owner

    provider = SimProvider("eu-west-1", state_path=gputui_home / "cloud-sim.json")
    (orphan,) = provider.launch(LaunchRequest("g4dn.xlarge", 1, "eu-west-1a", "spot", "ami-0123456789abcdef0", "k", "sg",
                                              tags=instance_tags("lab", default_owner())))
    listed = run_cli("cloud", "ls", "--provider", "sim", "--profile", str(profile), timeout=120)
    assert listed.returncode == 0 and "ORPHAN" in listed.stdout, listed.stdout + listed.stderr
    caption = " ".join(listed.stdout.split())  # the table may fold the caption
    sweep = re.search(r"`(gputui cloud sweep[^`]*)` terminates them", caption)
    assert sweep, listed.stdout
    result = run_hint(sweep.group(1))
    assert result.returncode == 0, (sweep.group(1), result.stderr)
    assert provider.describe([orphan.instance_id])[0].state in ("shutting-down", "terminated")
    assert len(running()) == 1  # the known slave stays


class Recorder(BaseHTTPRequestHandler):
    asked: list[str] = []

    def do_GET(self) -> None:  # noqa: N802
        Recorder.asked.append(self.path)
        body = b"192.0.2.44\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def echo(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """A stand-in for checkip on loopback that records every request."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    Recorder.asked = []
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("GPUTUI_PUBLIC_IP_URL", f"http://127.0.0.1:{server.server_address[1]}/")
    try:
        yield Recorder.asked
    finally:
        server.shutdown()
        server.server_close()


def ssh_rule(gputui_home: Path, cluster: str) -> str:
    state = json.loads((gputui_home / "cloud-sim.json").read_text())
    (rule,) = [r for r in state["groups"][f"gputui-{cluster}"]["rules"] if r[1] == 22]
    return str(rule[2])


def test_the_simulated_cloud_never_asks_the_network_for_our_address(
    sim: None, echo: list[str], tmp_path: Path, gputui_home: Path,
) -> None:
    up(write_profile(tmp_path / "quiet.toml"))  # no ssh_cidr in the profile
    assert echo == []
    assert ssh_rule(gputui_home, "quiet") == "127.0.0.1/32"


def test_ssh_cidr_by_flag_or_environment(sim: None, tmp_path: Path, gputui_home: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    profile = write_profile(tmp_path / "net.toml")
    up(profile, "--ssh-cidr", "203.0.113.8/29")
    assert ssh_rule(gputui_home, "net") == "203.0.113.8/29"
    monkeypatch.setenv("GPUTUI_SSH_CIDR", "198.51.100.0/24")
    up(profile)
    assert ssh_rule(gputui_home, "net") == "198.51.100.0/24"
    up(profile, "--ssh-cidr", "192.0.2.1")  # the flag wins; a bare address is its /32
    assert ssh_rule(gputui_home, "net") == "192.0.2.1/32"
    bad = run_cli("cloud", "up", "--provider", "sim", "--profile", str(profile), "--yes", "--no-guard",
                  "--ssh-cidr", "203.0.113.7/24", timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "--ssh-cidr '203.0.113.7/24': expected a network in CIDR form" in bad.stderr


def test_a_real_clouds_ssh_cidr_by_flag_or_environment_and_the_error_says_so(
    aws: Aws, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    from gputui.cli import main

    aws.write_profile(ssh_cidr=None)  # the shipped profile leaves it out too; the lookup URL is closed
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "--ssh-cidr 203.0.113.7/32" in err and "GPUTUI_SSH_CIDR=203.0.113.7/32" in err, err

    def rule() -> list[str]:
        group = aws.ec2().describe_security_groups(Filters=[{"Name": "group-name", "Values": ["gputui-cluster"]}])
        return [r["CidrIp"] for p in group["SecurityGroups"][0]["IpPermissions"] if p["IpProtocol"] == "tcp"
                for r in p["IpRanges"]]

    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard", "--ssh-cidr", "203.0.113.16/28"]) == 0
    assert rule() == ["203.0.113.16/28"]
    monkeypatch.setenv("GPUTUI_SSH_CIDR", "198.51.100.9/32")
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard"]) == 0
    assert rule() == ["198.51.100.9/32"]


def test_the_stop_by_id_and_list_hints_for_a_run_work(sim: None, tmp_path: Path) -> None:
    from gputui.cloud.leaks import down_ids_command, ls_command

    profile = write_profile(tmp_path / "ids.toml", region="eu-west-1")
    first, second = up(profile, "--count", "2")
    settings = load_cloud_settings(profile)
    ctx = CloudContext(settings, make_provider("sim", settings.region), Ledger(), "ids", "me")
    try:
        stop, listing = down_ids_command(ctx, [first]), ls_command(ctx)
    finally:
        ctx.ledger.close()
    listed = run_hint(listing)
    assert listed.returncode == 0 and first in listed.stdout, (listing, listed.stderr)
    result = run_hint(stop)
    assert result.returncode == 0, (stop, result.stderr)
    assert running() == [second]
