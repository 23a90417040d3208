"""The dashboard's data layer, without Textual: training state, drawings, hosts feed, slaves."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.settings import CloudSettings
from gputui.cloud.sim import SimProvider, SimScript
from gputui.dashboard.child import TrainingChild, run_argv
from gputui.dashboard.demo import DEAD_HOST, DemoSource
from gputui.dashboard.hosts import HostFeed
from gputui.dashboard.setup import Backend, DashboardOptions, demo_public_key, list_profiles, resolve_profile
from gputui.dashboard.slaves import BudgetRefusal, SlaveControl
from gputui.dashboard.training import TrainingState, event_line
from gputui.model.errors import UserError
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState
from gputui.sources.sim import SimSource
from gputui.ui.draw import bar, sparkline
from gputui.model.units import duration
from tests.conftest import REPO

EVENTS = [json.loads(line) for line in (REPO / "tests" / "data" / "seed_run_events.jsonl").read_text().splitlines()]


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_training_state_folds_a_real_run() -> None:
    state = TrainingState().replay(EVENTS)
    assert state.status == "done" and state.run_id == EVENTS[0]["run_id"]
    assert (state.model, state.device, state.strategy) == ("seed", "cpu", "single")
    assert state.step == state.total_steps == 234
    assert state.best_acc == EVENTS[-1]["best_acc"]
    assert len(state.loss_points) == sum(e["event"] == "step" for e in EVENTS)
    assert [a for _, a in state.acc_points] == [e["test_acc"] for e in EVENTS if e["event"] in ("eval", "epoch")]
    assert state.eta_s is None  # done: nothing left


def test_training_eta_and_progress_mid_run() -> None:
    state = TrainingState().replay(EVENTS[:10])
    step = EVENTS[9]
    assert state.status == "running" and state.step == step["step"]
    before = [e for e in EVENTS[:9] if e["event"] in ("step", "epoch", "eval")][-1]  # the previous progress point
    recent = (step["step"] - before["step"]) / (step["elapsed_s"] - before["elapsed_s"])  # steps/s on the run's clock
    assert state.samples_per_s == pytest.approx(recent * 256)
    assert state.samples_per_s == pytest.approx(step["samples_per_s"], rel=0.01)  # what the trainer said, too
    assert state.eta_s == pytest.approx((234 - step["step"]) / recent)
    assert state.fraction == pytest.approx(step["step"] / 234)


def test_resume_keeps_the_curves_and_a_new_run_drops_them() -> None:
    first = TrainingState().replay(EVENTS[:10])
    resumed = dict(EVENTS[0], resumed_from_step=first.step)
    state = first.fold(resumed)
    assert state.loss_points == first.loss_points and state.step == first.step and state.status == "running"
    fresh = first.fold(dict(EVENTS[0], run_id="another"))
    assert fresh.loss_points == () and fresh.step == 0


def test_exit_codes_become_states() -> None:
    running = TrainingState().replay(EVENTS[:5])
    failed = running.exited(2, "gputui: error: bad profile")
    assert failed.status == "failed" and failed.error == "gputui: error: bad profile"
    assert running.exited(1, None).error == "exited with code 1"
    assert running.exited(-signal.SIGTERM, None, stop_requested=True).status == "stopped"
    done = TrainingState().replay(EVENTS).exited(0, None)
    assert done.status == "done" and done.exit_code == 0


def test_event_lines_for_the_log() -> None:
    assert "started" in event_line(EVENTS[0]) and "seed on cpu" in event_line(EVENTS[0])
    epoch = next(e for e in EVENTS if e["event"] == "epoch")
    assert f"{epoch['test_acc']:.2f}%" in event_line(epoch) and "checkpoint" in event_line(epoch)
    assert event_line(EVENTS[1]) is None  # steps are drawn, not logged
    assert "interrupted (SIGTERM)" in event_line({"event": "interrupted", "reason": "SIGTERM", "step": 3, "checkpoint": "c"})


def test_bars_sparklines_durations() -> None:
    assert bar(0.5, 4) == "██  " and bar(1.0, 3) == "███" and bar(None, 3) == "···"
    assert bar(0.0, 2, fill="░") == "░░" and bar(0.5, 1) == "▌" and bar(3 / 8, 1) == "▍"
    assert sparkline([0, 50, 100, None], 4) == "▁▅█ " and sparkline([100], 3) == "  █"
    assert (duration(None), duration(5), duration(125), duration(7500)) == ("n/a", "5s", "2m05s", "2h05m")


def test_host_feed_keeps_utilisation_history() -> None:
    clock = Clock()
    feed = HostFeed(SimSource(hosts=2, gpus=3, seed=1, clock=clock), clock=clock, spark_len=5)
    for _ in range(7):
        frame = feed.poll()
        clock.now += 1
    assert [h.name for h in frame.hosts] == ["sim-0", "sim-1"] and frame.gpu_count == 6
    history = frame.util[("sim-1", 2)]
    assert len(history) == 5 and history[-1] == frame.hosts[1].gpus[2].util_pct
    feed.training(True)
    assert feed.source.is_active(0)


def test_the_sparklines_skip_the_rounds_a_host_missed_and_know_only_the_last_rounds_gpus() -> None:
    from gputui.dashboard.hosts import Sparks

    def snap(name: str, *utils: float | None, up: bool = True) -> HostSnapshot:
        gpus = tuple(GpuSample(i, util_pct=u) for i, u in enumerate(utils)) if up else ()
        return HostSnapshot(name, HostState.OK if up else HostState.UNREACHABLE, 0.0, gpus=gpus)

    class Rounds:
        def __init__(self) -> None:
            self.rounds = [[snap("a", 1.0, 2.0), snap("b", 5.0)], [snap("a", 3.0, None), snap("b", up=False)],
                           [snap("a", 4.0, 6.0), snap("b", 7.0), snap("c", 8.0)]]

        def poll(self) -> list[HostSnapshot]:
            return self.rounds.pop(0)

        def close(self) -> None:
            pass

    feed = HostFeed(Rounds(), clock=Clock(), spark_len=3)
    frames = [feed.poll() for _ in range(3)]
    util = frames[-1].util
    assert isinstance(util, Sparks) and sorted(util) == [("a", 0), ("a", 1), ("b", 0), ("c", 0)] and len(util) == 4
    assert util[("a", 0)] == (1.0, 3.0, 4.0) and util[("a", 1)] == (2.0, None, 6.0)  # n/a kept in its place
    assert util[("b", 0)] == (5.0, 7.0) and util[("c", 0)] == (8.0,)  # b missed a round: no value for it
    with pytest.raises(KeyError):
        util[("a", 2)]
    assert dict(frames[1].util) == {("a", 0): (1.0, 3.0), ("a", 1): (2.0, None)}  # b down: not in that round's keys


def cloud(tmp_path: Path, budget: float = 2.0, clock: Clock | None = None) -> tuple[SlaveControl, SimProvider, list[str]]:
    clock = clock or Clock()
    provider = SimProvider(script=SimScript(launch_delay_s=0.0, shutdown_delay_s=0.0), clock=clock)
    settings = CloudSettings(budget_usd=budget, ami="ami-0123456789abcdef0", public_key=str(demo_public_key()),
                             ssh_cidr="198.51.100.7/32")
    said: list[str] = []
    ctx = CloudContext(settings, provider, Ledger(tmp_path / "ledger.sqlite3"), "demo", "me@here", clock=clock,
                       sleep=lambda s: None)
    return SlaveControl(ctx, 1.0, said.append), provider, said


def test_slaves_launch_cost_and_terminate(tmp_path: Path) -> None:
    slaves, provider, said = cloud(tmp_path)
    ids = slaves.launch_one()
    assert len(ids) == 1 and "launch" in provider.calls
    assert said and "at $" in said[0] and "budget lasts" in said[0]
    slaves.ctx.clock.now += 3600  # type: ignore[attr-defined]
    frame = slaves.poll()
    [line] = frame.slaves
    assert line.instance_id == ids[0] and line.state == "running" and line.instance_type == "g4dn.xlarge"
    assert frame.usd_per_hour == pytest.approx(line.usd_per_hour)
    launch_rate = slaves.ctx.ledger.get(ids[0]).prices[0].usd_per_hour
    assert frame.budget.spent_usd == pytest.approx(launch_rate, rel=1e-3)  # one hour at the launch price
    assert line.usd_per_hour == slaves.ctx.ledger.get(ids[0]).hourly_price  # the price in force now
    assert line.uptime_s(frame.time) == pytest.approx(3600)
    assert frame.projected(1800) == pytest.approx(frame.budget.spent_usd + frame.usd_per_hour / 2)
    assert frame.projected(None) is None
    assert slaves.terminate(ids) == 1 and "terminate" in provider.calls
    assert slaves.poll().live == ()


def test_a_launch_that_breaks_the_budget_is_refused(tmp_path: Path) -> None:
    slaves, provider, _said = cloud(tmp_path, budget=0.001)
    with pytest.raises(BudgetRefusal, match="would break the \\$0.0010 budget"):
        slaves.launch_one()
    assert "launch" not in provider.calls


def test_terminate_all(tmp_path: Path) -> None:
    slaves, provider, _said = cloud(tmp_path)
    slaves.launch_one()
    slaves.launch_one()
    assert len(slaves.poll().live) == 2
    assert slaves.terminate_all() == 2
    assert slaves.poll().live == () and slaves.guard.running() == []


def test_demo_source_shows_slaves_and_a_dead_host(tmp_path: Path) -> None:
    slaves, _provider, _said = cloud(tmp_path)
    slaves.launch_one()
    frame = slaves.poll()
    clock = Clock()
    source = DemoSource(SimSource(1, 2, clock=clock), lambda: frame.slaves, clock=clock)
    hosts = {h.name: h for h in source.poll()}
    assert hosts[DEAD_HOST].state is HostState.UNREACHABLE and "timed out" in hosts[DEAD_HOST].message
    slave = hosts[frame.slaves[0].instance_id]
    assert slave.state is HostState.OK and slave.gpus[0].name == "Tesla T4 (simulated)"
    assert slave.gpus[0].mem_used_mib <= slave.gpus[0].mem_total_mib == 15360


def test_backend_commands_and_cloud_settings(tmp_path: Path) -> None:
    local = resolve_profile(None)
    demo = Backend(DashboardOptions(profile=local, demo=True))
    argv = demo.training_argv(resume=False)
    assert argv[:5] == [sys.executable, "-m", "gputui", "run", "--json"]
    assert argv[5:] == ["--profile", str(local), "--device", "cpu", "--evals-per-epoch", "4"]
    assert demo.training_argv(resume=True)[5:] == ["--resume", "last", "--device", "cpu"]
    assert demo.cloud_settings().budget_usd > 0 and demo.cloud_settings().ssh_cidr
    real = Backend(DashboardOptions(profile=local))
    assert real.cloud_settings() is None  # local.toml has no [cloud]: no slaves, no account needed
    assert run_argv(local, False) == [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(local)]
    with pytest.raises(UserError, match="profile not found"):
        resolve_profile(tmp_path / "nope.toml")


def test_training_child_reports_the_error_line(tmp_path: Path) -> None:
    child = TrainingChild(run_argv(None, False, ["--epochs", "0"]))
    child.start()
    assert list(child.events()) == []
    assert child.wait() == 2
    assert child.last_error().startswith("gputui: error: --epochs 0")


def test_a_run_refused_before_it_starts_leaves_no_directory_but_its_error_line(tmp_path: Path) -> None:
    """`t` makes the run's directory for its stderr.log; a run that a check refuses (exit 2, no
    profile.toml) left it behind, empty but for that file. A directory that was there (a resume) stays."""
    run_dir = tmp_path / "run"
    child = TrainingChild(run_argv(None, False, ["--epochs", "0", "--run-dir", str(run_dir)]), run_dir=run_dir)
    child.start()
    assert child.wait() == 2
    assert child.last_error().startswith("gputui: error: --epochs 0")
    assert not run_dir.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    child = TrainingChild(run_argv(None, False, ["--epochs", "0", "--run-dir", str(kept)]), run_dir=kept)
    child.start()
    assert child.wait() == 2 and child.last_error().startswith("gputui: error: --epochs 0")
    assert (kept / "stderr.log").is_file()


def test_p_lists_the_profiles_of_the_current_directory_that_are_this_accounts(tmp_path: Path) -> None:
    """`gputui` opened in a project folder: its train.toml beside train.py was not in `p`'s list
    (only profiles/ was). Other TOML files (pyproject.toml, broken ones) and another account's
    profiles in a shared directory are not listed."""
    import os

    (tmp_path / "train.toml").write_text('[run]\ncommand = ["python", "train.py"]\n')
    (tmp_path / "hosts.toml").write_text('[[hosts]]\nname = "a"\naddress = "10.0.0.1"\n')
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    (tmp_path / "broken.toml").write_text("[run\n")
    (tmp_path / "empty.toml").write_text("")
    (tmp_path / "big.toml").write_text("[run]\n" + "# padding\n" * 7_000)  # over 64 KiB: not looked into
    (tmp_path / "notes.txt").write_text("[run]\n")
    listed = list_profiles(None, here=tmp_path)
    assert [p.name for p in listed[:2]] == ["hosts.toml", "train.toml"]
    assert {"pyproject.toml", "broken.toml", "empty.toml", "big.toml", "notes.txt"}.isdisjoint(p.name for p in listed)
    assert (REPO / "profiles" / "local.toml").resolve() in listed  # the shipped ones follow
    assert len(list_profiles(None, here=REPO / "profiles")) == len(set(list_profiles(None, here=REPO / "profiles")))
    if os.getuid() == 0:  # root can give a file to another account
        os.chown(tmp_path / "train.toml", 12345, 12345)
        assert "train.toml" not in [p.name for p in list_profiles(None, here=tmp_path)]
    chosen = tmp_path / "elsewhere" / "mine.toml"  # the current one is listed, wherever it is
    chosen.parent.mkdir()
    chosen.write_text("[run]\nepochs = 1\n")
    assert list_profiles(chosen, here=tmp_path)[0] == chosen.resolve()


def test_bad_dashboard_flags_are_one_line_errors(tmp_path: Path) -> None:
    for args in (["--profile", str(tmp_path / "missing.toml")], ["ui", "--profile", str(tmp_path / "missing.toml")]):
        done = subprocess.run([sys.executable, "-m", "gputui", *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 2
        assert done.stderr.startswith("gputui: error: ") and done.stderr.count("\n") == 1
        assert "Traceback" not in done.stderr


IMPORT_CHECK = """
import sys
{imports}
bad = sorted(m for m in {forbidden!r} if m in sys.modules)
print(",".join(bad))
"""


@pytest.mark.parametrize("imports, forbidden", [
    ("import gputui.cli, gputui.commands.ui, gputui.ui.app, gputui.dashboard.setup, gputui.dashboard.slaves",
     ("torch", "boto3", "paramiko", "pynvml")),
    ("import gputui.jobs.run, gputui.runs.store, gputui.model.telemetry, gputui.model.cloud, gputui.sources.sim, "
     "gputui.sources.ssh, gputui.cloud.lifecycle, gputui.cloud.sim, gputui.cloud.ledger, gputui.dashboard.setup, "
     "gputui.dashboard.slaves, gputui.dashboard.cost, gputui.dashboard.child, gputui.dashboard.demo, gputui.monitor.polling",
     ("textual",)),
])
def test_imports_stay_apart(imports: str, forbidden: tuple[str, ...]) -> None:
    code = IMPORT_CHECK.format(imports=imports, forbidden=forbidden)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""


def test_host_feed_meters_gpu_energy_into_the_ledger(tmp_path: Path) -> None:
    """With kwh_price set, every round's GPU power is integrated and written to the ledger."""
    from gputui.cloud.energy import EnergyMeter
    from gputui.cloud.ledger import Ledger
    from gputui.dashboard.hosts import ENERGY_FLUSH_S, HostFeed
    from gputui.sources.sim import SimSource

    now = [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    ledger = Ledger(tmp_path / "ledger.sqlite3")
    meter = EnergyMeter(ledger, kwh_price=0.30, kinds=("sim",))
    feed = HostFeed(SimSource(hosts=1, gpus=2, seed=1, clock=clock), clock=clock, meter=meter)
    feed.poll()
    for _ in range(int(ENERGY_FLUSH_S) - 1):  # one round a second, as the dashboard polls
        now[0] += 1
        feed.poll()
    assert ledger.energy() == []  # nothing written before a flush interval has passed
    now[0] += 2
    feed.poll()
    lines = ledger.energy()
    assert sorted(line[0] for line in lines) == ["sim-0/gpu0", "sim-0/gpu1"]
    for subject, _cluster, _run, start, end, kwh, rate in lines:
        assert end - start == pytest.approx(ENERGY_FLUSH_S + 1)
        assert 0.30 * kwh < 1  # a simulated GPU's minute costs cents, not dollars
        assert kwh > 0 and rate == 0.30
    now[0] += 1
    feed.poll()
    feed.close()  # the rest is flushed on close
    assert len(ledger.energy()) == 4
