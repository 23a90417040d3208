"""The slaves' lease: the tags and user data of a launch (moto's EC2 server), the renewer,
release, the simulated watchdog on a hand-driven clock, self-stops in the ledger, and end to
end: `gputui cloud up` on the simulated cloud, then the guard and the command SIGKILLed."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.cloud.ec2 import Ec2Provider
from gputui.cloud.fleet import poll
from gputui.cloud.lease import LeaseRenewer, ended_how, renew
from gputui.cloud.tags import SELF_STOP_CODE, TAG_BUDGET, TAG_IDLE, TAG_LAUNCHED, TAG_LEASE, TAG_MAX
from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import launch, plan_launch, terminate, wait_running
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import PriceBook
from gputui.cloud.settings import CloudSettings, load_cloud_settings
from gputui.cloud.sim import SimProvider, SimScript
from gputui.model.cloud import InstanceInfo
from gputui.model.paths import data_home
from gputui.model.pids import process_alive

from .conftest import cli_env
from .moto_fixture import (DUMMY_KEY_ID, DUMMY_SECRET, DUMMY_TOKEN, REGION, Aws, aws,  # noqa: F401
                           moto_server, public_key_line, sim_cloud_profile)
from .proc_support import wait_until

T0 = 1_900_000_000.0
LEASE_S, RENEW_S, CHECK_S = 600.0, 120.0, 30.0


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


# moto's EC2 server --------------------------------------------------------------------
def raw_instances(aws: Aws) -> list[dict[str, Any]]:
    pages = aws.ec2().describe_instances(Filters=[{"Name": "tag:gputui:cluster", "Values": ["cluster"]}])
    return [i for r in pages["Reservations"] for i in r["Instances"]]


def tags_of(raw: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in raw.get("Tags", ())}


def test_launch_terminates_on_shutdown_reads_tags_from_metadata_and_installs_the_watchdog(aws: Aws) -> None:
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard", "--count", "2"]) == 0
    found = raw_instances(aws)
    assert len(found) == 2
    ec2 = aws.ec2()
    for raw in found:
        options = raw["MetadataOptions"]
        assert options["HttpTokens"] == "required" and options["InstanceMetadataTags"] == "enabled"
        behaviour = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="instanceInitiatedShutdownBehavior")
        assert behaviour["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
        data = ec2.describe_instance_attribute(InstanceId=raw["InstanceId"], Attribute="userData")["UserData"]["Value"]
        script = base64.b64decode(data).decode()
        assert script.startswith("#!/bin/sh") and "systemctl enable --now gputui-watchdog.service" in script
        tags = tags_of(raw)
        launched = float(tags[TAG_LAUNCHED])
        assert float(tags[TAG_LEASE]) == pytest.approx(launched + LEASE_S, abs=1)  # the budget ends later
        assert float(tags[TAG_BUDGET]) > float(tags[TAG_LEASE]) and tags[TAG_IDLE] == "1800" and TAG_MAX not in tags
        # nothing secret leaves the master: not the credentials, in the user data or in any tag
        text = script + json.dumps(tags)
        for secret in (DUMMY_KEY_ID, DUMMY_SECRET, DUMMY_TOKEN, "AWS_SECRET", "PRIVATE KEY"):
            assert secret not in text


def test_max_hours_is_a_tag_from_launch(aws: Aws) -> None:
    aws.write_profile(max_hours=1.5)
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard"]) == 0
    tags = tags_of(raw_instances(aws)[0])
    assert float(tags[TAG_MAX]) == pytest.approx(float(tags[TAG_LAUNCHED]) + 5400, abs=1)


def test_renewal_updates_the_tag_and_release_stops_renewing(aws: Aws) -> None:
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard", "--count", "2"]) == 0
    first = {r["InstanceId"]: float(tags_of(r)[TAG_LEASE]) for r in raw_instances(aws)}
    clock = Clock(max(first.values()) - LEASE_S + 300)  # five minutes after launch
    ctx = CloudContext(load_cloud_settings(aws.profile), Ec2Provider(REGION, clock=clock), Ledger(), "cluster", "me",
                       sleep=lambda s: None)
    assert ctx.clock is clock  # the context keeps the cloud's time
    renewer = LeaseRenewer(ctx)
    assert sorted(renewer.renew_once()) == sorted(first)
    renewed = {r["InstanceId"]: float(tags_of(r)[TAG_LEASE]) for r in raw_instances(aws)}
    assert renewed == {i: float(int(clock.now + LEASE_S)) for i in first}
    assert all(renewed[i] > first[i] for i in first)
    # release (gputui cloud down) closes the records: the renewer has nothing left to renew
    assert main(["cloud", "down", "--profile", str(aws.profile), "--yes", "--all"]) == 0
    clock.now += RENEW_S
    assert renewer.renew_once() == []
    assert {r["InstanceId"]: float(tags_of(r)[TAG_LEASE]) for r in raw_instances(aws)} == renewed


def test_the_renewer_thread_stops_when_told(aws: Aws) -> None:
    assert main(["cloud", "up", "--profile", str(aws.profile), "--yes", "--no-guard"]) == 0
    ctx = CloudContext(load_cloud_settings(aws.profile), Ec2Provider(REGION), Ledger(), "cluster", "me")
    renewer = LeaseRenewer(ctx, interval_s=0.05).start()
    wait_until(lambda: renewer.renewals >= 3, 30, "three renewals")
    thread = renewer._thread
    assert thread is not None and thread.is_alive() and thread.name == "gputui-lease-cluster"
    renewer.stop()
    assert not thread.is_alive(), "the renewer's thread still runs after stop()"
    assert not [t for t in threading.enumerate() if t.name == "gputui-lease-cluster"]
    done = renewer.renewals
    assert renewer.renew_once() == [] and renewer.renewals == done


# the simulated cloud with its watchdog, on a hand-driven clock ----------------------------
def sim_context(tmp_path: Path, budget: float = 50.0, **settings: Any) -> tuple[CloudContext, Clock, SimProvider]:
    clock = Clock()
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    s = CloudSettings(budget_usd=budget, zones=("us-east-1a",), ssh_cidr="198.51.100.7/32", public_key=str(key),
                      source=tmp_path / "p.toml", **settings)
    provider = SimProvider(script=SimScript(seed=3, launch_delay_s=0, shutdown_delay_s=0, watchdog=True), clock=clock)
    return CloudContext(s, provider, Ledger(tmp_path / "l.sqlite3"), "c1", "me", sleep=clock.sleep), clock, provider


def up(ctx: CloudContext, count: int) -> list[InstanceInfo]:
    return wait_running(ctx, launch(ctx, plan_launch(ctx, count))).instances


def test_sim_watchdog_stops_a_slave_whose_lease_is_not_renewed(tmp_path: Path) -> None:
    ctx, clock, sim = sim_context(tmp_path)
    a, b = up(ctx, 2)
    for _ in range(4):  # renewed every two minutes for eight minutes
        clock.now += RENEW_S
        assert renew(ctx) == [a.instance_id, b.instance_id]
    last = clock.now
    clock.now = last + LEASE_S - 1
    assert all(i.live for i in sim.describe([a.instance_id, b.instance_id]))
    clock.now = last + LEASE_S + CHECK_S
    assert sim.self_stops() == {a.instance_id: (last + LEASE_S, "lease"), b.instance_id: (last + LEASE_S, "lease")}
    info = sim.describe([a.instance_id])[0]
    assert info.state == "terminated" and info.state_reason == SELF_STOP_CODE
    assert "gputui-watchdog: stopping: lease" in sim.console_output(a.instance_id)
    # a renewal that comes too late does not bring it back
    clock.now += 1
    sim.set_tags([a.instance_id], {TAG_LEASE: str(int(clock.now + LEASE_S))})
    assert sim.describe([a.instance_id])[0].state == "terminated"


def test_master_gone_right_after_a_renewal_every_slave_stops_within_lease_plus_one_renewal(tmp_path: Path) -> None:
    ctx, clock, sim = sim_context(tmp_path)
    ids = [i.instance_id for i in up(ctx, 3)]
    clock.now += 17  # off the watchdog's 30 s grid: its worst case
    renew(ctx)
    died = clock.now
    while any(i.live for i in sim.describe(ids)):
        clock.now += 1
        assert clock.now <= died + LEASE_S + RENEW_S, "a slave outlived lease + one renewal interval"
    gone_after = max(at for at, _why in sim.self_stops().values()) - died
    assert LEASE_S <= gone_after <= LEASE_S + CHECK_S
    print(f"MEASURED master gone: every slave stopped {gone_after:.0f} s after the last renewal "
          f"(lease {LEASE_S:.0f} s, bound {LEASE_S + RENEW_S:.0f} s)")


def test_the_lease_never_passes_the_budget_and_the_slave_says_budget(tmp_path: Path) -> None:
    ctx, clock, sim = sim_context(tmp_path, budget=0.02)
    ids = [i.instance_id for i in up(ctx, 2)]
    rate = sum(r.hourly_price for r in ctx.ledger.instances(running=True))
    tags = sim.describe(ids)[0].tags
    budget_end = float(tags[TAG_BUDGET])
    assert budget_end == pytest.approx(T0 + 0.02 / rate * 3600, abs=1) and budget_end < T0 + LEASE_S
    assert tags[TAG_LEASE] == tags[TAG_BUDGET]  # the lease is capped by the budget's end
    clock.now = T0 + LEASE_S
    assert {why for _at, why in sim.self_stops().values()} == {"budget"}
    poll(ctx, PriceBook(ctx.provider, clock=clock))
    spent = sum(r.cost(clock.now) for r in ctx.ledger.instances())
    over = spent - 0.02
    assert over <= rate * RENEW_S / 3600
    print(f"MEASURED budget with the master gone: spent ${spent:.5f} of $0.02, over by ${over:.5f} "
          f"(fleet ${rate:.4f}/h; one renewal interval of it: ${rate * RENEW_S / 3600:.5f})")


def test_idle_and_max_hours_on_the_sim(tmp_path: Path) -> None:
    ctx, clock, sim = sim_context(tmp_path, max_hours=1.0, idle_stop_minutes=20.0)
    a, b = (i.instance_id for i in up(ctx, 2))
    for _ in range(40):  # the master renews for 80 minutes; b runs gputui all along
        clock.now += RENEW_S
        renew(ctx)
        sim.mark_busy([b])
    stops = sim.self_stops()
    assert stops[a] == (T0 + 1200, "idle") and stops[b] == (T0 + 3600, "max_hours")


def test_a_self_stop_is_recorded_with_its_reason_and_time_at_the_next_poll(tmp_path: Path) -> None:
    ctx, clock, sim = sim_context(tmp_path)
    (a,) = (i.instance_id for i in up(ctx, 1))
    clock.now = T0 + 5 * 3600  # the laptop slept five hours
    _shown, events = poll(ctx, PriceBook(ctx.provider, clock=clock))
    assert [(e.kind, e.instance_id) for e in events] == [("self_stop", a)]
    assert "stopped itself: the master's lease passed (gputui-watchdog)" in events[0].message
    rec = ctx.ledger.get(a)
    assert rec is not None and rec.ended_by == "self:lease" and rec.terminated == T0 + LEASE_S  # not five hours
    assert [r.instance_id for r in ctx.ledger.self_stops()] == [a]
    assert [e.kind for e in ctx.ledger.events(kinds=("self_stop",))] == ["self_stop"]


def test_the_reason_comes_from_the_tags_when_the_console_is_empty() -> None:
    info = InstanceInfo("i-1", "g4dn.xlarge", "us-east-1a", "terminated", "spot", T0, None, SELF_STOP_CODE,
                        {TAG_LEASE: str(int(T0 + 900)), TAG_BUDGET: str(int(T0 + 600)), TAG_IDLE: "1800"})
    end = ended_how(None, info, T0 + 7200, console=lambda i: "")
    assert (end.kind, end.ended_by, end.when) == ("self_stop", "self:budget", T0 + 600)
    user = InstanceInfo("i-2", "g4dn.xlarge", "us-east-1a", "terminated", "spot", T0, None, "Client.UserInitiatedShutdown",
                        {TAG_LEASE: str(int(T0 + 900))})
    assert ended_how(None, user, T0 + 7200).ended_by == "external"


# end to end: the command line on the simulated cloud -----------------------------------
def cli_up(profile: Path, count: int) -> tuple[int, int]:
    """`gputui cloud up` until it says its guard runs: (the command's pid, the guard's)."""
    command = subprocess.Popen([sys.executable, "-m", "gputui", "cloud", "up", "--provider", "sim", "--profile",
                                str(profile), "--yes", "--count", str(count), "--guard-interval", "1"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=cli_env())
    assert command.stderr is not None
    seen = []
    for line in command.stderr:
        seen.append(line)
        if line.startswith("budget guard running (pid "):
            return command.pid, int(line.split("(pid ")[1].split(",")[0])
    command.wait(timeout=60)
    raise AssertionError("cloud up never said its guard runs:\n" + "".join(seen))


def kill_master(command: int, guard: int) -> None:
    for pid in (command, guard):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.waitpid(command, 0)
    except ChildProcessError:
        pass
    wait_until(lambda: not process_alive(guard), 30, "the SIGKILLed guard to be gone")


@pytest.fixture
def sim_clock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, gputui_home: Path) -> Path:
    path = tmp_path / "sim-clock"
    path.write_text(f"{T0}\n")
    monkeypatch.setenv("GPUTUI_SIM_CLOCK", str(path))
    monkeypatch.delenv("GPUTUI_SIM_WATCHDOG", raising=False)
    return path


def walk_clock(path: Path, sim: SimProvider, ids: list[str], start: float, limit: float) -> float:
    """Move the shared clock on in 10 s steps until every slave has ended; when they had."""
    now = start
    while any(i.live for i in sim.describe(ids)):
        now += 10
        assert now <= limit, f"slaves still running {now - start:.0f} s after the master died"
        path.write_text(f"{now}\n")
    return max(at for at, _why in sim.self_stops().values())


def test_cloud_up_then_guard_and_command_sigkilled_every_slave_stops_by_itself(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_clock: Path) -> None:
    profile = sim_cloud_profile(tmp_path, monkeypatch, "spot", 50.0, "0")
    command, guard = cli_up(profile, 3)
    kill_master(command, guard)
    sim = SimProvider.from_env(REGION, data_home() / "cloud-sim.json")
    ids = list(sim.self_stops()) or [r.instance_id for r in Ledger().instances(running=True)]
    assert len(ids) == 3
    stopped = walk_clock(sim_clock, sim, ids, T0, T0 + LEASE_S + RENEW_S)
    assert {why for _at, why in sim.self_stops().values()} == {"lease"}
    print(f"MEASURED e2e master gone: last slave stopped {stopped - T0:.0f} s after the SIGKILL "
          f"(bound {LEASE_S + RENEW_S:.0f} s)")
    listing = subprocess.run([sys.executable, "-m", "gputui", "cloud", "ls", "--provider", "sim", "--profile",
                              str(profile), "--json"], capture_output=True, text=True, timeout=120, env=cli_env())
    assert listing.returncode == 0, listing.stderr
    shown = json.loads(listing.stdout)
    assert not [i for i in shown["instances"] if i["state"] in ("pending", "running")]  # nothing left running
    assert sorted(e["instance_id"] for e in shown["events"] if e["kind"] == "self_stop") == sorted(ids)
    with Ledger() as ledger:
        assert {r.ended_by for r in ledger.instances()} == {"self:lease"}
        assert not ledger.instances(running=True)


def test_budget_with_the_master_gone_overspends_at_most_one_renewal_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sim_clock: Path) -> None:
    budget = 0.02
    profile = sim_cloud_profile(tmp_path, monkeypatch, "spot", budget, "0")
    command, guard = cli_up(profile, 2)
    kill_master(command, guard)
    sim = SimProvider.from_env(REGION, data_home() / "cloud-sim.json")
    with Ledger() as ledger:
        ids = [r.instance_id for r in ledger.instances(running=True)]
        rate = sum(r.hourly_price for r in ledger.instances(running=True))
    walk_clock(sim_clock, sim, ids, T0, T0 + LEASE_S + RENEW_S)
    assert {why for _at, why in sim.self_stops().values()} == {"budget"}
    assert subprocess.run([sys.executable, "-m", "gputui", "cloud", "ls", "--provider", "sim", "--profile", str(profile)],
                          capture_output=True, text=True, timeout=120, env=cli_env()).returncode == 0
    now = float(sim_clock.read_text())
    with Ledger() as ledger:
        spent = sum(r.cost(now) for r in ledger.instances())
        assert {r.ended_by for r in ledger.instances()} == {"self:budget"}
    over = spent - budget
    assert over <= rate * RENEW_S / 3600
    print(f"MEASURED e2e budget: spent ${spent:.5f} of ${budget}, over by ${over:.5f}; fleet ${rate:.4f}/h, "
          f"one renewal interval of it ${rate * RENEW_S / 3600:.5f}")


def test_lease_settings_default_and_renewal_must_be_shorter_than_the_lease(tmp_path: Path) -> None:
    from gputui.model.errors import UserError

    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    profile = tmp_path / "p.toml"
    profile.write_text('[cloud]\nbudget_usd = 5\npublic_key = "id.pub"\n')
    s = load_cloud_settings(profile)
    assert (s.lease_minutes, s.renew_minutes, s.max_hours, s.idle_stop_minutes) == (10.0, 2.0, None, 30.0)
    profile.write_text('[cloud]\nbudget_usd = 5\nlease_minutes = 5\nrenew_minutes = 5\n')
    with pytest.raises(UserError, match=r"p.toml:4: \[cloud\] renew_minutes: must be shorter than lease_minutes"):
        load_cloud_settings(profile)
    profile.write_text('[cloud]\nbudget_usd = 5\n[cluster]\nidle_stop_minutes = 0\n')
    assert load_cloud_settings(profile).idle_stop_minutes == 0.0  # the slaves' idle stop is the cluster's


def test_gputui_cost_lists_each_self_stop_with_its_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ctx, clock, _sim = sim_context(tmp_path)
    ctx.ledger.close()
    ctx = CloudContext(ctx.settings, ctx.provider, Ledger(), "c1", "me", sleep=clock.sleep)  # the ledger `cost` reads
    (a,) = (i.instance_id for i in up(ctx, 1))
    clock.now = T0 + 5 * 3600
    poll(ctx, PriceBook(ctx.provider, clock=clock))
    ctx.ledger.close()
    assert main(["cost", "--json"]) == 0
    stops = json.loads(capsys.readouterr().out)["self_stops"]
    assert stops == [{"instance_id": a, "cluster": "c1", "reason": "lease", "ended": T0 + LEASE_S}]
    assert main(["cost"]) == 0
    said = capsys.readouterr()
    assert f"{a} (c1) powered itself off: lease at " in said.out + said.err
