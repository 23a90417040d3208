"""`gputui cloud guard` in the foreground, headless (no terminal on stdin), through the real
command: Ctrl-C leaves the slaves running, lists them and exits 1; a poll that fails is
said as an event and the guard goes on guarding."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gputui.cloud.ledger import Ledger
from gputui.model.cloud import InstanceInfo

from .conftest import cli_env, run_cli
from .moto_fixture import DEAD_PROXY, DUMMY_KEY_ID, DUMMY_SECRET, public_key_line
from .proc_support import Child

def write_profile(path: Path, budget: float) -> Path:
    path.write_text('[cloud]\nzones = ["us-east-1a", "us-east-1b"]\npublic_key = "id.pub"\n'
                    f'ssh_cidr = "198.51.100.7/32"\nbudget_usd = {budget!r}\n')
    return path


def _sigint_ignored() -> None:  # pragma: no cover - runs in the child before exec
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def guard(profile: Path, interval: float, *extra: str) -> Child:
    """The guard, headless (stdin not a terminal); its stdout lines are JSON with a "kind", not an "event".
    Started with SIGINT ignored, as a parent that ignores it (a test runner's worker, `nohup`) would pass
    on: the guard must still stop on it."""
    return Child([sys.executable, "-m", "gputui", "cloud", "guard", "--json", "--interval", repr(interval),
                  "--profile", str(profile), *extra],
                 env=cli_env(), name="gputui cloud guard", json_lines=False, stdin=subprocess.DEVNULL,
                 preexec_fn=_sigint_ignored)


def test_ctrl_c_leaves_the_slaves_lists_them_and_exits_1_headless(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUTUI_CLOUD", "sim")
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", "0")
    (tmp_path / "id.pub").write_text(public_key_line() + "\n")
    profile = write_profile(tmp_path / "demo.toml", 50.0)
    up = run_cli("cloud", "up", "--yes", "--no-guard", "--profile", str(profile))
    assert up.returncode == 0, up.stderr
    with Ledger() as ledger:
        (slave,) = ledger.instances(running=True)
    # A budget the first poll finds about 90% spent or committed (the seconds so far plus the
    # next 600 s interval), so the guard warns at once: an event to wait for.
    interval = 600.0
    write_profile(profile, round(slave.hourly_price * interval / 3600 / 0.9, 6))
    with guard(profile, interval) as child:
        warning = json.loads(child.wait_for_line(lambda line: json.loads(line)["kind"] == "budget_warning", 120,
                                                 "the budget warning of the first poll"))
        assert re.match(r"(8\d|9\d)% of the \$0\.\d\d budget spent or committed", warning["message"]), warning
        child.proc.send_signal(signal.SIGINT)  # the guard now waits 600 s for its next poll
        assert child.rest(60, "the end of the output after SIGINT") == []
        said = child.stderr_rest(60)
        assert child.proc.wait(timeout=60) == 1
    assert said[0].startswith("guarding cluster demo every 600 s") and "interrupted" in said, said
    assert said[-1].startswith("still running: 1 cloud instance running") and slave.instance_id in said[-1], said
    assert said[-1].endswith(f"; stop them with `gputui cloud down --all --yes --provider sim --profile {profile} --cluster demo`"), said
    with Ledger() as ledger:
        assert [r.instance_id for r in ledger.instances(running=True)] == [slave.instance_id]  # not terminated


def test_a_failed_poll_is_said_and_the_guard_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """EC2 unreachable (a closed loopback port): every poll fails, each says so, none ends the guard."""
    for name, value in {"AWS_ACCESS_KEY_ID": DUMMY_KEY_ID, "AWS_SECRET_ACCESS_KEY": DUMMY_SECRET,
                        "AWS_ENDPOINT_URL": DEAD_PROXY, "HTTPS_PROXY": DEAD_PROXY, "HTTP_PROXY": DEAD_PROXY,
                        "AWS_MAX_ATTEMPTS": "1", "GPUTUI_CLOUD": "ec2"}.items():
        monkeypatch.setenv(name, value)
    (tmp_path / "id.pub").write_text(public_key_line() + "\n")
    profile = write_profile(tmp_path / "lab.toml", 50.0)
    info = InstanceInfo("i-0123456789abcdef0", "g4dn.xlarge", "us-east-1a", "running", "spot", time.time(), "203.0.113.9")
    with Ledger() as ledger:  # a slave the records say runs (launched earlier, when AWS answered)
        ledger.record_launch(info, "ec2", "us-east-1", "lab", "me", 0.2)
    with guard(profile, 0.2) as child:
        failures = []
        for _ in range(3):
            line = json.loads(child.wait_for_line(lambda text: json.loads(text)["kind"] == "error", 120, "a failed poll"))
            failures.append(line)
        assert child.proc.poll() is None  # still guarding
        child.proc.send_signal(signal.SIGINT)
        child.rest(60, "the end of the output after SIGINT")
        said = child.stderr_rest(60)
        assert child.proc.wait(timeout=60) == 1  # headless, the slave still on record: exit 1
    for failure in failures:
        assert failure["message"].startswith("poll failed: cannot reach AWS for ec2:"), failure
        assert failure["cluster"] == "lab" and "\n" not in failure["message"]
    assert DUMMY_SECRET not in " ".join(said) + json.dumps(failures)
    assert said[-1].startswith("still running: ") and info.instance_id in said[-1], said
    with Ledger() as ledger:
        kinds = [e.kind for e in ledger.events()]
        assert kinds.count("error") >= 3 and ledger.instances(running=True)[0].instance_id == info.instance_id
