"""The simulated cloud, interruption and price-change detection on the master, leak
protection, and `gputui cloud ... --provider sim` end to end."""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import psutil
import pytest

from gputui.cli import main
from gputui.cloud.fleet import poll
from gputui.cloud.leaks import exit_check, note_running
from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import launch, plan_launch, wait_running
from gputui.cloud.pricing import PriceBook
from gputui.cloud.provider import CapacityError, LaunchRequest, instance_tags
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cloud import waiting
from gputui.cluster.sshnode import SlaveConnection
from gputui.cluster.stopping import Stopped
from gputui.model.errors import GputuiError, UserError
from gputui.config.hosts import HostSpec
from gputui.model.cloud import CloudEvent

from .conftest import cli_env
from .moto_fixture import cli, sim_cloud_profile
from .proc_support import Child, wait_until
from .test_cloud_budget import T0, make_context


def request(zone: str = "us-east-1a", count: int = 1, lifecycle: str = "spot") -> LaunchRequest:
    return LaunchRequest("g4dn.xlarge", count, zone, lifecycle, "ami-0123456789abcdef0", "k", "sg",
                         tags=instance_tags("c", "me"))


def test_sim_prices_are_seeded_and_move_hourly() -> None:
    now = [T0]
    a, b = SimProvider(script=SimScript(seed=1), clock=lambda: now[0]), SimProvider(script=SimScript(seed=1))
    other = SimProvider(script=SimScript(seed=2), clock=lambda: now[0])
    zones = ["us-east-1a", "us-east-1b"]
    first = a.spot_prices("g4dn.xlarge", zones)
    assert first == {z: a.spot_price("g4dn.xlarge", z, T0) for z in zones}
    assert first == {z: b.spot_price("g4dn.xlarge", z, T0) for z in zones}
    assert first != other.spot_prices("g4dn.xlarge", zones)
    assert all(0.25 * 0.526 * 0.9 <= p <= 0.45 * 0.526 * 1.1 for p in first.values())
    now[0] += 3600
    assert a.spot_prices("g4dn.xlarge", zones) != first


def test_sim_launch_delay_interruptions_and_capacity_errors() -> None:
    now = [T0]
    sim = SimProvider(script=SimScript(launch_delay_s=10, shutdown_delay_s=5, interruptions={1: 100},
                                       capacity_errors={"us-east-1b": "InsufficientInstanceCapacity"}),
                      clock=lambda: now[0])
    with pytest.raises(CapacityError) as info:
        sim.launch(request("us-east-1b"))
    assert info.value.code == "InsufficientInstanceCapacity" and not info.value.account_wide
    ids = [i.instance_id for i in sim.launch(request(count=2))]
    assert [i.state for i in sim.describe(ids)] == ["pending", "pending"]
    now[0] += 10
    assert [(i.state, bool(i.public_ip)) for i in sim.describe(ids)] == [("running", True)] * 2
    now[0] += 90
    second = sim.describe(ids)[1]
    assert second.state == "shutting-down" and second.interrupted
    now[0] += 5
    assert sim.describe(ids)[1].state == "terminated"
    sim.terminate([ids[0]])
    first = sim.describe(ids)[0]
    assert first.state == "shutting-down" and not first.interrupted
    assert {i.instance_id for i in sim.list_tagged({"gputui:cluster": "c"})} == set(ids)
    assert sim.list_tagged({"gputui:cluster": "other"}) == []


def test_sim_reclaims_spot_instances_after_so_many_polls_or_seconds() -> None:
    now = [T0]
    polled = SimProvider(script=SimScript(launch_delay_s=10, interrupt_after_polls=2), clock=lambda: now[0])
    spot = polled.launch(request())[0].instance_id
    steady = polled.launch(request(lifecycle="on-demand"))[0].instance_id
    assert [i.state for i in polled.describe([spot, spot, spot])] == ["pending"] * 3  # only running counts
    now[0] += 10
    assert polled.describe([spot])[0].state == "running"  # report 1
    assert {i.instance_id: i.state for i in polled.list_tagged({})}[spot] == "running"  # report 2
    reclaimed = polled.describe([spot])[0]
    assert reclaimed.state == "shutting-down" and reclaimed.interrupted
    now[0] += 3600
    assert polled.describe([steady] * 5)[0].state == "running"  # on-demand: never reclaimed
    timed = SimProvider(script=SimScript(launch_delay_s=0, shutdown_delay_s=0, interrupt_after_s=30), clock=lambda: now[0])
    later = timed.launch(request())[0].instance_id
    now[0] += 29.9
    assert timed.describe([later])[0].state == "running"
    now[0] += 0.1
    assert timed.describe([later])[0].interrupted


def test_sim_is_safe_to_share_between_threads(tmp_path: Path) -> None:
    sim = SimProvider(state_path=tmp_path / "sim.json")
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(10):
                ids = [i.instance_id for i in sim.launch(request())]
                sim.describe(ids)
                sim.spot_prices("g4dn.xlarge", [])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a thread still works on the sim after 60 s"
    assert not errors
    assert len({i.instance_id for i in sim.list_tagged({})}) == 60
    assert len(SimProvider(state_path=tmp_path / "sim.json").list_tagged({})) == 60  # persisted whole


def test_the_master_notices_interruptions_and_price_changes_on_every_poll(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=100.0, script=SimScript(seed=5, launch_delay_s=0, interruptions={0: 500}))
    seen: list[CloudEvent] = []
    ctx.listener = seen.append
    wait_running(ctx, launch(ctx, plan_launch(ctx, 2)))
    book = PriceBook(ctx.provider, clock=clock)
    clock.now += 400
    assert poll(ctx, book)[1] == []  # nothing new within the hour, before the interruption
    clock.now += 101
    _shown, events = poll(ctx, book)
    assert [e.kind for e in events] == ["interrupted"]
    interrupted = ctx.ledger.get(str(events[0].instance_id))
    assert interrupted is not None and interrupted.ended_by == "interrupted" and interrupted.terminated == clock.now
    assert poll(ctx, book)[1] == []  # recorded once
    # An hour later the surviving instance's spot price is re-read; a change opens a new price line.
    clock.now += 3600
    _shown, events = poll(ctx, book)
    (survivor,) = ctx.ledger.instances(running=True)
    assert [e.kind for e in events] == ["price"] and len(survivor.prices) == 2
    assert isinstance(ctx.provider, SimProvider)
    assert survivor.hourly_price == ctx.provider.spot_price("g4dn.xlarge", survivor.zone, clock.now)
    assert [e.kind for e in seen].count("interrupted") == 1  # the UI's listener saw it too
    assert [e.kind for e in ctx.ledger.events()] == [e.kind for e in seen]


def test_exit_check_asks_on_a_terminal_and_refuses_silence_headless(tmp_path: Path) -> None:
    ctx, _clock = make_context(tmp_path, budget=100.0)
    wait_running(ctx, launch(ctx, plan_launch(ctx, 2)))
    said: list[str] = []
    assert exit_check(ctx, False, lambda q: pytest.fail("headless must not ask"), said.append) == 1
    assert "still running: 2 cloud instances" in said[-1] and "gputui cloud down --all --yes" in said[-1]
    assert exit_check(ctx, True, lambda q: False, said.append) == 0
    assert said[-1].startswith("left running by your choice")
    assert len(ctx.ledger.instances(running=True)) == 2
    questions: list[str] = []

    def yes(question: str) -> bool:
        questions.append(question)
        return True

    assert exit_check(ctx, True, yes, said.append) == 0
    assert "Terminate them now?" in questions[0]
    assert ctx.ledger.instances(running=True) == []
    assert exit_check(ctx, False, lambda q: True, said.append) == 0


def test_on_start_gputui_reports_what_the_records_say_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert note_running() == 0  # no ledger: nothing, and none created
    with Ledger() as ledger:
        from gputui.model.cloud import InstanceInfo

        ledger.record_launch(InstanceInfo("i-0abc", "g4dn.xlarge", "us-east-1a", "running", "spot", T0),
                             "ec2", "us-east-1", "c1", "me", 0.2)
    assert main(["run", "--epochs", "0"]) == 2
    err = capsys.readouterr().err
    assert "note: 1 cloud instance running, $0.20/h: i-0abc (c1, ec2 us-east-1)" in err
    assert "gputui cloud down --all" in err


@pytest.fixture
def sim_profile(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return sim_cloud_profile(tmp_path, monkeypatch, "demo", 0.012, "0.3")


def test_cli_with_the_simulated_cloud(sim_profile: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = ["--profile", str(sim_profile)]
    assert main(["cloud", "up", "--count", "2", "--yes", "--no-guard", *p]) == 0
    out = capsys.readouterr()
    assert "launch spot in us-east-1" in out.err and out.out.count("203.0.113.") == 2
    assert main(["cloud", "ls", "--json", *p]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert listing["provider"] == "sim" and [i["state"] for i in listing["instances"]] == ["running", "running"]
    # A second launch would pass the budget: refused before anything starts.
    assert main(["cloud", "up", "--count", "2", "--yes", "--no-guard", *p]) == 2
    assert "budget reached for cluster demo" in capsys.readouterr().err
    # The guard: spent plus the next interval's cost pass $0.012, so its first poll stops both at once.
    # It runs as a child read with a deadline: were it to miss the stop, it would poll again in 120 s.
    with Child([sys.executable, "-m", "gputui", "cloud", "guard", "--interval", "120", "--grace", "0", "--json", *p],
               env=cli_env(), name="gputui cloud guard") as guard:
        guard.wait_for(lambda e: e["kind"] == "budget_stop", 60, "the guard's budget stop")
        assert guard.finish(60, "the guard to stop both slaves and exit") == 0, guard.stderr
    kinds = [e["kind"] for e in guard.events]
    assert kinds.count("budget_stop") == 1 and kinds.count("terminated") == 2, kinds
    assert "the guard stops" in guard.stderr
    with Ledger() as ledger:
        assert [r.ended_by for r in ledger.instances()] == ["budget", "budget"]


def test_cli_reports_interruptions(sim_profile: Path, monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("GPUTUI_SIM_LAUNCH_DELAY", "0")
    # `up` sees the slave running once; the simulation reclaims it on the next poll, which is `ls`'s.
    monkeypatch.setenv("GPUTUI_SIM_INTERRUPT_AFTER_POLLS", "1")
    p = ["--profile", str(sim_profile)]
    assert main(["cloud", "up", "--yes", "--no-guard", *p]) == 0
    up = capsys.readouterr()
    assert up.out.count("203.0.113.") == 1 and "interrupted" not in up.err + up.out
    assert main(["cloud", "ls", *p]) == 0
    err = capsys.readouterr().err
    assert "interrupted: " in err and "spot interruption" in err
    with Ledger() as ledger:
        assert [r.ended_by for r in ledger.instances()] == ["interrupted"]


def guards_of(profile: Path) -> list[int]:
    """Pids of live `gputui cloud guard` processes started for `profile`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmd = proc.info["cmdline"] or []
        if "guard" in cmd and str(profile) in cmd and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc.pid)
    return found


def test_up_leaves_a_guard_that_goes_when_the_slaves_do(sim_profile: Path, gputui_home: Path) -> None:
    # Budget for several slaves: the second `up` below launches, and finds the guard already there.
    sim_profile.write_text(sim_profile.read_text().replace("budget_usd = 0.012", "budget_usd = 5.0"))
    p = ["--profile", str(sim_profile)]
    up = cli("cloud", "up", "--yes", "--guard-interval", "0.3", *p)
    assert up.returncode == 0, up.stderr
    assert "budget guard running (pid" in up.stderr
    pid = int(up.stderr.split("budget guard running (pid ")[1].split(",")[0])
    log = gputui_home / "logs" / "guards" / "sim-us-east-1-demo.log"  # user_log_dir, under GPUTUI_HOME
    wait_until(lambda: log.is_file() and "guarding cluster demo" in log.read_text(), 60,
               "the guard to take the cluster's lock and say so", detail=lambda: log.read_text() if log.is_file() else "no log")
    assert guards_of(sim_profile.resolve()) == [pid]
    again = cli("cloud", "up", "--yes", "--count", "1", "--guard-interval", "0.3", "--profile", str(sim_profile),
                "--cluster", "demo")
    assert again.returncode == 0, again.stderr
    assert again.stdout.count("203.0.113.") == 1 and "note: 1 cloud instance running" in again.stderr
    assert "budget guard running" not in again.stderr  # one guard per cluster: the first one watches both
    assert guards_of(sim_profile.resolve()) == [pid]
    with Ledger() as ledger:
        assert len(ledger.instances(running=True)) == 2
    down = cli("cloud", "down", "--all", "--yes", *p)
    assert down.returncode == 0, down.stderr
    wait_until(lambda: not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, 60,
               "the guard to stop after the slaves went", detail=log.read_text)
    text = log.read_text()
    assert text.count("guarding cluster demo") == 1 and "the guard stops" in text


class Terminal:
    """stdin as a terminal whose user gives these answers."""

    def __init__(self, answers: list[str], asked: list[str]) -> None:
        self.answers, self.asked = iter(answers), asked

    def isatty(self) -> bool:
        return True

    def ask(self, question: str) -> str:
        self.asked.append(question)
        return next(self.answers)


def test_on_a_terminal_up_shows_the_price_and_asks_and_down_confirms(
        sim_profile: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    asked: list[str] = []
    terminal = Terminal(["n", "y", "", "yes"], asked)
    monkeypatch.setattr(sys, "stdin", terminal)
    monkeypatch.setattr("builtins.input", terminal.ask)
    p = ["--profile", str(sim_profile)]
    assert main(["cloud", "up", "--no-guard", *p]) == 1  # declined
    err = capsys.readouterr().err
    assert "1 x g4dn.xlarge: spot $" in err and "/h (sim) in us-east-1" in err and "nothing launched" in err
    assert "on-demand $0.5260/h (table 2024-06-01), saving" in err  # each price names its source
    assert asked[-1].startswith("Launch 1 x g4dn.xlarge at about $") and asked[-1].endswith("/h? [y/N] ")
    assert main(["cloud", "up", "--no-guard", *p]) == 0  # accepted
    assert main(["cloud", "down", "--all", *p]) == 1  # an empty answer is no
    assert asked[-1] == "Terminate 1 instance? [y/N] "
    assert main(["cloud", "down", "--all", *p]) == 0
    with Ledger() as ledger:
        assert [r.ended_by for r in ledger.instances()] == ["user"]


def test_the_one_backoff_helper_gives_up_at_once_when_waiting_cannot_help() -> None:
    looks: list[str] = []
    slept: list[float] = []
    answers = iter(["booting", "refused", "up"])

    def fetch() -> str:
        looks.append(next(answers))
        return looks[-1]

    with pytest.raises(ValueError, match="^refused$"):
        waiting.wait_until(fetch, lambda a: a == "up", "the slave", 600.0, sleep=slept.append,
                           delays=waiting.backoff(1.0, 1.6, 10.0),
                           hopeless=lambda a: a == "refused", error=ValueError)
    assert looks == ["booting", "refused"] and slept == [1.0]


def test_a_slave_connection_backs_off_until_a_stop_ends_the_wait() -> None:
    with socket.socket() as s:  # a port nothing listens on: connection refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conn = SlaveConnection(HostSpec("n0", "127.0.0.1", port, "root", connect_timeout=2.0))
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the bring-up's stop-aware sleep, asked to stop at the third wait
        slept.append(seconds)
        if len(slept) == 3:
            raise Stopped("SIGINT")

    with pytest.raises(Stopped):
        conn.open_or_raise(600.0, sleep=sleep)
    assert slept == pytest.approx([1.0, 1.6, 2.56])
    slept.clear()
    with pytest.raises(GputuiError, match=rf"^slave n0 \(root@127\.0\.0\.1:{port}\): connection refused by 127\.0\.0\.1:{port}") as err:
        conn.open_or_raise(0.0, sleep=sleep)
    assert slept == [] and not isinstance(err.value, UserError)
