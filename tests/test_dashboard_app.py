"""The dashboard driven by its keys (App.run_test): what it did and what it shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from textual.message import Message

from gputui.cloud.ledger import Ledger
from gputui.model.errors import UserError
from gputui.ui.app import create_app
from gputui.ui.bindings import KEYS
from gputui.ui.cost_panel import SlavesTable
from gputui.ui.events_panel import EventsLog
from gputui.ui.messages import CloudEventPosted, TrainingLine, TrainingUpdate
from gputui.ui.screens import ChoiceScreen, HelpScreen, ProfileScreen
from gputui.ui.status import StatusBar
from tests.dashboard_support import (HangingProvider, HangingSource, drive, make_backend, screen_text, sim_provider,
                                     wait_for)


def log_text(app: Any) -> str:
    return "\n".join(app.query_one(EventsLog).lines_written)


def rows(app: Any) -> int:
    return app.query_one(SlavesTable).row_count


def test_u_launches_d_terminates_the_selected_D_all(gputui_home: Path) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))
    posted: list[Message] = []

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls and app.hosts_polls, what="first polls")
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 1, what="one slave")
        assert provider.calls.count("launch") == 1
        assert "g4dn.xlarge spot in us-east-1" in log_text(app) and "budget lasts" in log_text(app)
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 2, what="two slaves")
        first = app.query_one(SlavesTable).selected
        await wait_for(pilot, lambda: first in screen_text(app) and "running" in screen_text(app))
        await pilot.press("d")
        await wait_for(pilot, lambda: rows(app) == 1, what="the selected slave gone")
        assert first not in {k.value for k in app.query_one(SlavesTable).rows}
        await pilot.press("D")
        assert isinstance(app.screen, ChoiceScreen)
        await pilot.press("c")  # cancel: nothing happens
        assert not isinstance(app.screen, ChoiceScreen) and provider.calls.count("terminate") == 1
        await pilot.press("D", "t")
        await wait_for(pilot, lambda: rows(app) == 0, what="every slave gone")
        assert provider.calls.count("terminate") == 2
        await pilot.press("q")  # nothing runs any more: quits without asking
        kinds = [m.event.kind for m in posted if isinstance(m, CloudEventPosted)]
        assert kinds.count("launched") == 2 and kinds.count("terminated") == 2

    drive(app, scenario, message_hook=posted.append)
    assert app.return_code == 0
    assert Ledger(gputui_home / "ledger.sqlite3").instances(running=True) == []


def test_a_launch_past_the_budget_is_refused(tmp_path: Path) -> None:
    profile = tmp_path / "tight.toml"
    profile.write_text("[cloud]\nbudget_usd = 0.001\ninstance_type = \"g4dn.xlarge\"\n", encoding="utf-8")
    provider = sim_provider()
    app = create_app(make_backend(profile, provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls)
        await pilot.press("u")
        await wait_for(pilot, lambda: "launch refused" in log_text(app), what="the refusal")
        assert "would break the $0.0010 budget" in log_text(app)
        assert "launch" not in provider.calls and rows(app) == 0
        await pilot.press("q")

    drive(app, scenario)


@pytest.mark.parametrize("answer", ["t", "k"])
def test_quit_with_a_slave_asks_first(gputui_home: Path, answer: str) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls)
        await pilot.press("u")
        await wait_for(pilot, lambda: rows(app) == 1)
        await pilot.press("q")
        assert isinstance(app.screen, ChoiceScreen)
        assert "1 slave running" in screen_text(app) and "Keep them" in screen_text(app)
        await pilot.press("escape")  # cancel
        assert not isinstance(app.screen, ChoiceScreen) and app.is_running
        await pilot.press("q", answer)
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
    running = Ledger(gputui_home / "ledger.sqlite3").instances(running=True)
    if answer == "t":  # terminate them
        assert "terminate" in provider.calls and running == []
    else:  # keep them
        assert "terminate" not in provider.calls and len(running) == 1
        assert "left running by your choice" in str(app.exit_message)


def test_t_trains_stops_and_r_resumes_through_the_child(medium_data: Path) -> None:
    args = ["--data", str(medium_data), "--epochs", "40", "--threads", "1"]
    app = create_app(make_backend(train_args=args))
    posted: list[Message] = []

    async def scenario(pilot: Any) -> Any:
        await pilot.press("t")
        # Epoch events are never throttled (step events are: a fast epoch may give the loss curve one point).
        await wait_for(pilot, lambda: app.training.status == "running" and len(app.training.acc_points) >= 3
                       and app.training.loss_points, 90, "three epochs")
        child = app.child
        assert child is not None and child.running
        assert child.argv[1:6] == ["-m", "gputui", "run", "--json", "--profile"]
        await wait_for(pilot, lambda: "sim-0" in screen_text(app))
        assert app.feed.source.sim.is_active(0)  # the simulation knows our run is on
        shown = screen_text(app)
        assert f"step {app.training.step}/" in shown and "seed · cpu · single" in shown
        await pilot.press("t")
        assert app.training.status in ("stopping", "interrupted")
        await wait_for(pilot, lambda: app.training.exit_code is not None, 60, "the checkpoint and the exit")
        assert app.training.status == "interrupted"
        assert child.proc.returncode == 0 and "interrupted (SIGTERM)" in log_text(app)
        first_part = app.training.loss_points, app.training.acc_points
        await pilot.press("r")
        await wait_for(pilot, lambda: app.training.resumed_from_step is not None and app.training.status == "running",
                       90, "the resumed run")
        assert app.child is not child and app.child.argv[5:7] == ["--resume", str(child.run_dir)]  # the run on screen
        # the curves go on from the first part: its points, first ones included, then only later steps
        for before, now in zip(first_part, (app.training.loss_points, app.training.acc_points)):
            assert now[: len(before)] == before
            assert all(step > before[-1][0] for step, _ in now[len(before):])
        second = app.child
        await pilot.press("q", "s")  # the quit question: stop it with a checkpoint
        await wait_for(pilot, lambda: not app.is_running, 60, "exit")
        return second

    second = drive(app, scenario, message_hook=posted.append)
    assert second.proc.returncode == 0  # stopped with a checkpoint on quit, not left behind
    assert any(isinstance(m, TrainingLine) and "started" in m.text for m in posted)
    assert any(isinstance(m, TrainingLine) and "resumed at step" in m.text for m in posted)
    assert any(isinstance(m, TrainingUpdate) and m.state.resumed_from_step is not None for m in posted)


def run_events(losses: list[float]) -> list[dict[str, Any]]:
    """A run's start and one step event per loss, as `gputui run --json` writes them."""
    n = len(losses)
    start = {"event": "start", "run_id": "r-chart", "model": "seed", "device": "cpu", "strategy": "single",
             "world_size": 1, "epochs": 1, "batch_size": 64, "steps_per_epoch": n, "total_steps": n,
             "resumed_from_step": None, "run_dir": None}
    return [start] + [{"event": "step", "epoch": 1, "step": k + 1, "loss": loss, "samples_per_s": 1000.0, "lr": 0.01,
                       "elapsed_s": round(k * 0.01, 3)} for k, loss in enumerate(losses)]


def test_a_crashed_run_shows_its_error_line() -> None:
    app = create_app(make_backend(train_args=["--epochs", "0"]))

    async def scenario(pilot: Any) -> None:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "failed", 60, "the failure")
        assert "gputui: error: --epochs 0" in screen_text(app)
        assert "run failed (exit 2)" in log_text(app)
        await pilot.press("q")

    drive(app, scenario)


def test_help_screen_lists_every_key_and_the_footer_shows_them() -> None:
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: "Quit" in screen_text(app).splitlines()[-1], what="the footer")
        footer = screen_text(app).splitlines()[-1]
        for key in KEYS:
            assert key.label in footer
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        shown = screen_text(app)
        for key in KEYS:
            assert key.help.split(".")[0][:40] in " ".join(shown.split())
        await pilot.press("u")  # the dashboard's keys do nothing under a dialog
        await pilot.press("escape")
        assert not isinstance(app.screen, HelpScreen)
        assert "launching" not in log_text(app)
        await pilot.press("q")

    drive(app, scenario, size=(200, 50))  # every key's label fits the footer at 200 columns


def test_p_chooses_another_profile() -> None:
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("p")
        await wait_for(pilot, lambda: isinstance(app.screen, ProfileScreen), what="the profiles listed")
        screen = app.screen
        assert isinstance(screen, ProfileScreen)
        target = next(i for i, p in enumerate(screen.profiles) if p.name == "fast.toml")
        from textual.widgets import OptionList

        screen.query_one(OptionList).highlighted = target
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.backend.profile.name == "fast.toml")
        assert app.query_one(StatusBar).profile == "fast.toml"
        assert str(app.backend.profile) in app.backend.training_argv(resume=False)
        assert "profile fast.toml" in log_text(app)
        await pilot.press("q")

    drive(app, scenario)


def test_the_screen_repaints_while_a_host_hangs_and_a_launch_is_in_progress() -> None:
    source, provider = HangingSource(), HangingProvider()
    app = create_app(make_backend(source=source, provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: source.started.is_set() and app.cloud_polls)
        await pilot.press("u")
        await wait_for(pilot, provider.launching.is_set, what="the launch to hang")
        status = app.query_one(StatusBar)
        renders, polls = status.renders, app.cloud_polls
        # the 1 s tick keeps drawing and the cloud polls go on beside the hanging launch and host
        await wait_for(pilot, lambda: status.renders >= renders + 3, 30, "three repaints while the launch hangs")
        await wait_for(pilot, lambda: app.cloud_polls >= polls + 2, 30, "two cloud polls while the launch hangs")
        assert provider.launching.is_set() and not provider.release.is_set() and not source.release.is_set()
        assert "hosts: no answer for" in screen_text(app)
        await pilot.press("question_mark")  # keys still answer at once
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        source.release.set()
        provider.release.set()
        await wait_for(pilot, lambda: rows(app) == 1 and app.hosts_polls, what="the launch and the poll to land")
        assert "no answer" not in screen_text(app)
        await pilot.press("q", "t")
        await wait_for(pilot, lambda: not app.is_running)

    drive(app, scenario)


class BrokenCloud:
    """A provider whose every call fails, as an account without credentials does."""

    name, region = "sim", "us-east-1"

    def __getattr__(self, _name: str) -> Any:
        def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise UserError("no AWS credentials found (simulated)")

        return fail


def test_a_lasting_cloud_failure_stays_on_screen_and_is_logged_once() -> None:
    app = create_app(make_backend(provider=BrokenCloud(), interval=0.1))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls >= 4, what="several failed polls")
        assert "no AWS credentials found" in screen_text(app).split("Cost & slaves")[1]
        assert log_text(app).count("no AWS credentials found") == 1
        await pilot.press("u")
        await wait_for(pilot, lambda: "launch failed" in log_text(app))
        await pilot.press("q")

    drive(app, scenario)


def test_a_poll_timer_that_fires_while_the_app_closes_does_nothing() -> None:
    """A host or cloud poll timer can fire after the app's screens are gone (seen in CI as an
    IndexError from every later test's teardown): it must do nothing then."""
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("q")

    drive(app, scenario)
    assert app.screen_stack == []
    app.start_poll("hosts", lambda: None)  # raised IndexError before
    app.poll_cloud()


def test_what_a_worker_posted_as_the_app_closed_is_dropped_after_its_screens_are_gone() -> None:
    """A poll's report queued before quit can be handled after the screens are popped (seen in CI:
    IndexError from `on_hosts_polled` in a lab test's teardown): every report handler drops it then."""
    from gputui.dashboard.training import TrainingState
    from gputui.ui.messages import (CloudNote, CostPolled, EventLine, HostsPolled, ProcessSignalled, RunStopping,
                                    SlavesChanged, TrainingExited)
    from gputui.ui.training_actions import RunGone

    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("q")

    drive(app, scenario)
    assert app.screen_stack == []
    polls = app.hosts_polls
    app.on_hosts_polled(HostsPolled(None, "late"))  # raised IndexError before
    app.on_cost_polled(CostPolled(None, "late"))
    app.on_cloud_note(CloudNote("late"))
    app.on_slaves_changed(SlavesChanged())
    app.on_run_stopping(RunStopping(app.child, "late", True))
    app.on_event_line(EventLine("late", "warning"))
    app.on_process_signalled(ProcessSignalled("late", True))
    app.on_training_update(TrainingUpdate(TrainingState(), app.generation))
    app.on_training_line(TrainingLine("late", "error", app.generation))
    app.on_training_exited(TrainingExited(0, "", app.generation))
    app.on_run_gone(RunGone(app.generation))
    assert app.hosts_polls == polls  # dropped, not half-handled


def test_a_report_handled_while_textual_takes_the_screen_apart_is_dropped() -> None:
    """Textual's shutdown stops running, then removes a screen's widgets while the screen is still
    on the stack: a report handled then found no StatusBar (NoMatches, seen in a profiling run).
    The state is rebuilt after quit: a screen without the dashboard's widgets on the stack."""
    from textual.screen import Screen

    from gputui.ui.messages import CostPolled, HostsPolled

    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("q")

    drive(app, scenario)
    app._screen_stacks["_default"].append(Screen())  # as in Textual's _close_all, mid-way
    assert app.screen_stack and not app.is_running
    polls = app.hosts_polls
    app.on_hosts_polled(HostsPolled(None, "late"))  # raised NoMatches('StatusBar') before
    app.on_cost_polled(CostPolled(None, "late"))
    app.poll_hosts()  # a timer that fires then starts no poll
    assert app.hosts_polls == polls and not [w for w in app.workers if w.name == "hosts-poll"]


def test_an_empty_cloud_is_polled_at_ec2s_pace_and_a_launch_brings_the_fast_one_back(gputui_home: Path) -> None:
    from gputui.dashboard.setup import EC2_PACE_S, Backend, DashboardOptions, resolve_profile

    options = DashboardOptions(profile=resolve_profile(None), demo=True, sim_hosts=2, sim_gpus=2, host_interval_s=0.2)
    assert options.cloud_pace(0) == EC2_PACE_S and options.cloud_pace(1) == options.cloud_interval == 2.0
    assert DashboardOptions(profile=options.profile, demo=False).cloud_pace(0) == EC2_PACE_S
    assert DashboardOptions(profile=options.profile, cloud_interval_s=0.5).cloud_pace(0) == 0.5  # set on purpose: kept
    provider = sim_provider()
    app = create_app(Backend(options, provider=provider))

    def pace() -> float:
        timer = app._cloud_timer
        assert timer is not None
        return float(timer._interval)

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        assert pace() == EC2_PACE_S  # nothing up: the next poll in 15 s
        polls = app.cloud_polls
        await pilot.press("u")  # the launch polls at once, and the slave keeps the demo's pace
        await wait_for(pilot, lambda: app.cloud_polls > polls and rows(app) == 1, what="a poll showing the slave")
        assert pace() == 2.0
        await pilot.press("D", "t")
        await wait_for(pilot, lambda: rows(app) == 0, what="the slave gone")
        assert pace() == EC2_PACE_S
        await pilot.press("q")

    drive(app, scenario)


FAKE_RUN = """
import signal, sys
from pathlib import Path
marker = Path(sys.argv[1])
def stop(*_):
    marker.write_text("SIGTERM")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
marker.with_suffix(".ready").write_text("ready")
sys.stdin.read()  # until SIGTERM, or the test's end closes the pipe: it never outlives the test
"""


@pytest.mark.parametrize("keys", [("d",), ("D", "t")])
def test_d_on_a_slave_a_live_run_trains_on_stops_the_run_first_then_the_slave_goes(gputui_home: Path, tmp_path: Path,
                                                                                    keys: tuple[str, ...]) -> None:
    import subprocess
    import sys
    import time

    from gputui.model.paths import runs_home
    from gputui.runs import store as runs

    provider = sim_provider()
    at_terminate: list[int | None] = []
    terminate = provider.terminate

    def watched(ids: Any) -> None:
        at_terminate.append(run.poll())  # the run's exit code when the slave is terminated (None: still going)
        terminate(ids)

    provider.terminate = watched  # type: ignore[method-assign]
    app = create_app(make_backend(provider=provider))
    marker = tmp_path / "run.stop"
    run = subprocess.Popen([sys.executable, "-c", FAKE_RUN, str(marker)], stdin=subprocess.PIPE)
    try:
        run_dir = runs.create(runs_home() / "20261128-120000-abcd")
        runs.write_pid(run_dir, run.pid)

        async def scenario(pilot: Any) -> None:
            await wait_for(pilot, lambda: app.cloud_polls and marker.with_suffix(".ready").exists(), what="polls, the run")
            await pilot.press("u")
            await wait_for(pilot, lambda: rows(app) == 1, what="one slave")
            # the run trains on the dashboard's cluster (a cluster run records it so, gputui.cluster.bringup)
            with Ledger(gputui_home / "ledger.sqlite3") as ledger:
                ledger.start_run(run_dir.run_id, "demo", time.time())
            await pilot.press(*keys)  # d: the selected slave; D, t: every slave
            await wait_for(pilot, lambda: rows(app) == 0, what="the slave gone")
            assert marker.read_text() == "SIGTERM"
            assert at_terminate == [0], at_terminate  # the run had ended when the slave went
            said = f"{keys[0]}: " + ("every slave" if keys[0] == "D" else "")
            assert said in log_text(app) and f"trains run {run_dir.run_id}: the run stops first" in log_text(app), log_text(app)
            assert ("then the slaves go" if keys[0] == "D" else "then the slave goes") in log_text(app)
            await pilot.press("q")

        drive(app, scenario)
    finally:
        run.kill()
        run.wait(timeout=30)
        assert run.stdin is not None
        run.stdin.close()


def test_the_runs_going_on_a_slave_are_those_of_its_cluster_not_ended_and_never_a_local_run(gputui_home: Path) -> None:
    from gputui.model.cloud import InstanceInfo

    with Ledger(gputui_home / "ledger.sqlite3") as ledger:
        for instance_id, cluster in (("i-1", "lab"), ("i-2", "local"), ("i-3", "other")):
            ledger.record_launch(InstanceInfo(instance_id, "g4dn.xlarge", "us-east-1a", "running", "spot", 0.0), "sim",
                                 "us-east-1", cluster, "me", 0.5)
        ledger.start_run("r-going", "lab", 1.0)
        ledger.start_run("r-ended", "lab", 2.0)
        ledger.end_run("r-ended", 3.0, "done")
        ledger.start_run("r-local", "local", 4.0)
        ledger.start_run("r-later", "lab", 5.0)
        assert ledger.runs_going_on("i-1") == ["r-going", "r-later"]
        assert ledger.runs_going_on("i-2") == []  # a cloud cluster named "local" is not a local run's
        assert ledger.runs_going_on("i-3") == [] and ledger.runs_going_on("i-unknown") == []


def test_a_launch_that_ends_while_a_cloud_poll_runs_is_polled_again_at_once(gputui_home: Path) -> None:
    import threading

    from gputui.dashboard.setup import EC2_PACE_S, Backend, DashboardOptions, resolve_profile
    from gputui.ui.messages import SlavesChanged

    options = DashboardOptions(profile=resolve_profile(None), demo=True, sim_hosts=2, sim_gpus=2, host_interval_s=0.2)
    provider = sim_provider()
    listing, release = threading.Event(), threading.Event()
    list_tagged = provider.list_tagged

    def held(tags: Any) -> Any:  # a poll that is still asking the cloud
        listing.set()
        release.wait(60)
        return list_tagged(tags)

    app = create_app(Backend(options, provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        provider.list_tagged = held  # type: ignore[method-assign]
        app.poll_cloud()
        await wait_for(pilot, listing.is_set, what="a cloud poll in flight")
        polls = app.cloud_polls
        app.post_message(SlavesChanged())  # a launch ended meanwhile: this poll may not show its slave
        await wait_for(pilot, lambda: app._cloud_again, what="the change noted while the poll is in flight")
        provider.list_tagged = list_tagged  # type: ignore[method-assign]
        release.set()
        # the poll in flight ends, and the next one follows at once, not at the idle pace
        await wait_for(pilot, lambda: app.cloud_polls >= polls + 2, EC2_PACE_S * 2 / 3, "a poll right after the held one")
        await pilot.press("q")

    drive(app, scenario)
