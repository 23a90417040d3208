"""The dashboard and runs (App.run_test): the numbers of a run replayed at any pace, attaching
to a run started elsewhere, the quit question that can leave a run going, the runs screen."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from gputui.runs import store as runs
from gputui.dashboard.setup import resolve_profile
from gputui.ui.app import create_app
from gputui.ui.events_panel import EventsLog
from gputui.ui.runs_screen import AttachScreen, RunDetailScreen, RunsScreen
from gputui.ui.screens import ChoiceScreen
from gputui.ui.training_actions import post_events
from gputui.ui.training_panel import TrainingSummary
from tests.conftest import REPO
from tests.dashboard_support import Clock, drive, make_backend, screen_text, wait_for
from tests.proc_support import Child, wait_until

H100_RUN = REPO / "tests" / "fixtures" / "h100" / "run-seed-40-epochs.jsonl"


def h100_events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in H100_RUN.read_text().splitlines()]


def summary(app: Any) -> str:
    return app.query_one(TrainingSummary).render().plain


def log_text(app: Any) -> str:
    return "\n".join(app.query_one(EventsLog).lines_written)


# -- numbers -------------------------------------------------------------------------------------------

def replay(speed: float) -> tuple[str, list[str]]:
    """The H100 40-epoch run's events posted at `speed` times their own pace, on a clock the test
    moves (no sleeping): the final summary, and the summaries seen after each event."""
    events = h100_events()
    clock = Clock(events[0]["time"])
    app = create_app(make_backend(clock=clock))
    frames: list[str] = []

    async def scenario(pilot: Any) -> str:
        state = None
        for event in events:
            clock.now = events[0]["time"] + (event["time"] - events[0]["time"]) / speed
            state = post_events([event], app.post_message, app.generation,
                                *(() if state is None else (state,)))
            await wait_for(pilot, lambda: app.training.step == state.step and app.training.status == state.status,
                           30, f"the event at {event['time']} to be shown")
            await pilot.pause()
            frames.append(summary(app))
        await wait_for(pilot, lambda: "done" in screen_text(app), 30, "the final frame on the screen")
        final = summary(app)
        assert final.splitlines()[1] in screen_text(app)
        await pilot.press("q")
        return final

    return drive(app, scenario, size=(200, 50)), frames


def test_the_h100_run_replayed_at_its_pace_and_at_100x_ends_right() -> None:
    final, frames = replay(1.0)
    assert replay(100.0)[0] == final  # the pace changes nothing: every number is the events' own
    head, second, third = final.splitlines()
    assert head.startswith("● done") and "seed · cuda:0 · single" in head
    assert second == "done: 40 epochs, 4,680 steps in 16s" and "ETA" not in final
    assert third.startswith("loss 0.0124  acc 98.86%  best 98.86%  16s trained")
    # Mid-run: the loss is the latest (epoch 39's mean, not the first step's 2.3213), and the rate
    # is measured on the run's own clock between its progress points: 115 steps of 512 in 0.501 s
    # before step 2104, not the 2,151,383/s that the old step event claimed.
    at_2104 = next(f for f in frames if "step 2,104/4,680" in f)
    assert "118k/s" in at_2104 and "2.2M/s" not in at_2104 and "ETA" in at_2104
    assert "loss 0.0125" in frames[-3]  # epoch 39
    assert all("2.3213" not in f for f in frames[3:])


def test_a_failed_run_says_why_and_shows_no_empty_progress() -> None:
    app = create_app(make_backend())
    error = {"event": "error", "message": "CUDA out of memory. Tried to allocate 2.00 GiB\nTraceback (more)",
             "exit_code": 1}

    async def scenario(pilot: Any) -> None:
        post_events([error], app.post_message, app.generation)
        await wait_for(pilot, lambda: app.training.status == "failed", 30, "the failure")
        await pilot.pause()
        shown = summary(app)
        assert "failed: CUDA out of memory. Tried to allocate 2.00 GiB" in shown and "Traceback" not in shown
        assert "epoch 0/?" not in shown and "ETA" not in shown and "n/a  n/a" not in shown
        await pilot.press("q")

    drive(app, scenario, size=(120, 40))


# -- attach, stop, and the quit question -------------------------------------------------------------

def run_elsewhere(data: Path, home: Path, profile: Path) -> tuple[Child, runs.RunDir]:
    """`gputui run` in "another terminal": a run of `profile` this test's dashboard did not start."""
    run = runs.RunDir(home / "runs" / "elsewhere")
    child = Child([sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--data", str(data),
                   "--epochs", "40", "--threads", "1", "--device", "cpu", "--run-dir", str(run.path)],
                  env=dict(os.environ))
    child.wait_for(lambda e: e["event"] in ("step", "epoch"), 180, "the run's first step")
    return child, run


def test_attach_to_a_run_started_elsewhere_and_t_attaches_rather_than_start_a_second(
        medium_data: Path, gputui_home: Path) -> None:
    profile = resolve_profile(None)
    child, run = run_elsewhere(medium_data, gputui_home, profile)
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("a")
        assert isinstance(app.screen, AttachScreen)
        await wait_for(pilot, lambda: app.screen.found is not None, 30, "the live runs listed")
        assert [path for path, _ in app.screen.found] == [str(run.path)]
        assert f"pid {child.proc.pid}" in screen_text(app) and "profile local.toml" in screen_text(app)
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.training.status == "running" and app.training.step, 60, "the run followed")
        assert app.child is None and app.attached == run and app.training.run_id == "elsewhere"
        assert "(attached)" in summary(app) and app.training.total_steps == child.events[0]["total_steps"]
        step = app.training.step
        await wait_for(pilot, lambda: app.training.step > step, 120, "later steps, as the run writes them")
        # t on the same profile while it runs: t stops the run it follows (and never starts a second)
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "interrupted", 120, "the run to checkpoint and stop")
        assert app.training.reason == "SIGTERM" and "r resumes it" in summary(app)
        await pilot.press("q")  # not started here: quits without asking

    drive(app, scenario, size=(160, 50))
    assert child.finish(60) == 0 and child.events[-1]["event"] == "interrupted"
    assert not run.pidfile.exists()  # the run removed it as it ended


def test_t_attaches_to_a_live_run_of_its_profile(medium_data: Path, gputui_home: Path) -> None:
    """Two dashboards (two `gputui serve` tabs) on one profile: the second `t` follows the first's run."""
    child, run = run_elsewhere(medium_data, gputui_home, resolve_profile(None))
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "running", 60, "the run followed")
        assert app.child is None and app.attached == run and "already going (elsewhere)" in log_text(app)
        await pilot.press("q")

    try:
        drive(app, scenario)
        assert child.proc.poll() is None  # the dashboard left it alone
        assert runs.live_runs(gputui_home / "runs") == [run]  # and started no second run
    finally:
        child.proc.send_signal(signal.SIGTERM)
        child.finish(60)


def test_quit_keeps_the_run_going_headless_and_a_later_dashboard_attaches(medium_data: Path) -> None:
    # Epochs enough that the run ends only when the second dashboard stops it (40 could all be
    # done, on a quiet machine, before the second dashboard pressed t: it then started a new run).
    args = ["--data", str(medium_data), "--epochs", "5000", "--threads", "1"]
    first = create_app(make_backend(train_args=args))

    async def start_then_keep(pilot: Any) -> Any:
        await pilot.press("t")
        await wait_for(pilot, lambda: first.training.status == "running" and first.training.step, 120,
                       "the run's first steps")
        await pilot.press("q")
        assert isinstance(first.screen, ChoiceScreen)
        shown = screen_text(first)
        assert "Keep it running" in shown and "Stop it (checkpoint)" in shown and "Cancel" in shown
        await pilot.press("escape")  # cancel: nothing happens
        assert first.is_running and first.child.running and not first.child.stop_requested
        await pilot.press("q", "k")
        await wait_for(pilot, lambda: not first.is_running, 30, "the app to exit")
        return first.child

    child = drive(first, start_then_keep)
    try:
        assert child.proc.poll() is None, "the run ended with the dashboard"
        assert os.getsid(child.pid) == child.pid != os.getsid(0)  # a session of its own: no terminal's signals
        assert f"pid {child.pid}" in str(first.exit_message) and "goes on" in str(first.exit_message)
        run = runs.RunDir(Path(first.training.run_dir))
        size = run.events.stat().st_size
        wait_until(lambda: run.events.stat().st_size > size, 120, "the run to go on writing events, headless")
        second = create_app(make_backend(train_args=args))

        async def attach_and_stop(pilot: Any) -> None:
            await pilot.press("t")  # its profile's run is live: t follows it
            try:
                await wait_for(pilot, lambda: second.training.status == "running" and second.attached == run, 60,
                               "the run followed again")
            except AssertionError as exc:  # what the app did instead (seen once beside two hogs)
                raise AssertionError(f"{exc}: status {second.training.status!r}, attached {second.attached}, "
                                     f"child {second.child}, run {run.path}, live {runs.live_process(run)}\n"
                                     f"{log_text(second)}") from None
            assert second.child is None and second.training.step >= first.training.step
            await pilot.press("t")
            await wait_for(pilot, lambda: second.training.status == "interrupted", 120, "the checkpoint")
            await pilot.press("q")

        drive(second, attach_and_stop)
        assert child.proc.wait(60) == 0
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait(30)


# -- the runs screen ------------------------------------------------------------------------------------

def fake_run(home: Path, run_id: str, events: list[dict[str, Any]]) -> runs.RunDir:
    run = runs.RunDir(home / "runs" / run_id)
    run.path.mkdir(parents=True)
    run.profile.write_text("[run]\nmodel = \"seed\"\nepochs = 40\n", encoding="utf-8")
    run.events.write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return run


def test_runs_screen_lists_overlays_and_deletes_only_after_asking(gputui_home: Path) -> None:
    events = h100_events()
    old = fake_run(gputui_home, "20260101-000000-aaaa", events)
    new = fake_run(gputui_home, "20260102-000000-bbbb", [dict(e, time=e["time"] + 86400) for e in events[:10]])
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("R")
        screen = app.screen
        assert isinstance(screen, RunsScreen)
        await wait_for(pilot, lambda: screen.loads, 30, "the runs listed")
        shown = screen_text(app)
        assert old.run_id in shown and new.run_id in shown and "98.86%" in shown and "done" in shown
        assert [s.run_id for s in screen.listed] == [new.run_id, old.run_id]  # newest first
        await pilot.press("enter")  # the newest in detail, as `gputui runs show` says it
        detail = app.screen
        assert isinstance(detail, RunDetailScreen)
        await wait_for(pilot, lambda: detail.lines is not None, 30, "the run's detail read")
        assert detail.lines and detail.lines[0].startswith(f"run {new.run_id} · stopped")
        assert f"  go on      gputui run --resume {new.run_id}" in detail.lines and new.run_id in screen_text(app)
        assert any(line.startswith("  model      seed · ") for line in detail.lines)
        await pilot.press("escape")
        assert app.screen is screen
        await pilot.press("down")  # the older, finished run
        await pilot.press("space")
        assert list(app.overlay_runs) == [str(old.path)]
        await pilot.press("x")
        assert isinstance(app.screen, ChoiceScreen) and old.run_id in screen_text(app)
        await pilot.press("c")  # cancel: nothing is deleted
        assert app.screen is screen and old.path.is_dir()
        await pilot.press("x", "d")
        await wait_for(pilot, lambda: not old.path.exists() and screen.loads >= 2, 30, "the run deleted, the list read")
        assert [s.run_id for s in screen.listed] == [new.run_id] and new.path.is_dir()
        assert list(app.overlay_runs) == []  # a deleted run is no overlay any more
        await pilot.press("escape")
        assert not isinstance(app.screen, RunsScreen)
        await pilot.press("q")

    drive(app, scenario, size=(200, 50))


def test_resume_from_the_runs_screen_of_a_complete_run_says_so(gputui_home: Path) -> None:
    """r on a finished run: `gputui run --resume` says it is already complete and does nothing; the
    dashboard says that too, and shows how the run ended (it did not fail)."""
    done = fake_run(gputui_home, "20260101-000000-aaaa", h100_events())
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("R")
        screen = app.screen
        await wait_for(pilot, lambda: screen.loads, 30, "the runs listed")
        await pilot.press("r")
        assert not isinstance(app.screen, RunsScreen) and app.child is not None
        assert app.child.argv[5:7] == ["--resume", str(done.path)]
        await wait_for(pilot, lambda: "already complete" in log_text(app), 120, "the run's answer")
        await pilot.pause()
        assert app.training.status == "done" and app.training.run_id == "bg"
        assert "done: 40 epochs" in summary(app) and "failed" not in summary(app)
        await pilot.press("q")

    drive(app, scenario, size=(160, 50))


def test_an_attached_run_killed_without_a_last_word_shows_stopped(gputui_home: Path) -> None:
    """The followed run's process dies (SIGKILL: no `interrupted`, no `done`): the panel says it
    stopped and how to go on, not "running" forever."""
    import subprocess

    run = fake_run(gputui_home, "20260103-000000-cccc", h100_events()[:12])
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"])
    runs.write_pid(run, proc.pid)
    app = create_app(make_backend())

    async def scenario(pilot: Any) -> None:
        await pilot.press("a")
        await wait_for(pilot, lambda: app.screen.found, 30, "the live run listed")
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.training.status == "running" and app.training.step == 1170, 30,
                       "the run's events folded")
        assert "ETA" in summary(app) and "(attached)" in summary(app)
        proc.kill()
        await wait_for(pilot, lambda: app.training.status == "stopped", 30, "the run seen gone")
        await pilot.pause()
        assert "stopped (its process ended without a last event) at epoch 10/40" in summary(app)
        assert "ETA" not in summary(app)
        await pilot.press("q")

    try:
        drive(app, scenario, size=(200, 50))
    finally:
        proc.kill()
        proc.wait()


def test_an_exit_without_the_question_leaves_the_run_going_and_the_app_ends(medium_data: Path) -> None:
    """`gputui serve` quits a dashboard whose tab was closed without q (no question can be asked):
    the app ends at once, following nothing, and its run goes on by itself, as if kept."""
    args = ["--data", str(medium_data), "--epochs", "40", "--threads", "1"]
    app = create_app(make_backend(train_args=args))

    async def scenario(pilot: Any) -> Any:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "running" and app.training.step, 120, "the first steps")
        app.exit()  # what textual-serve's closed tab does: no action_quit
        return app.child

    child = drive(app, scenario)  # returns: no worker is left waiting for the run
    try:
        assert child.detached and child.follower.stopped
        assert child.proc.poll() is None, "the run ended with the dashboard"
    finally:
        child.proc.send_signal(signal.SIGTERM)
        assert child.proc.wait(120) == 0  # it checkpoints and exits as any run does
