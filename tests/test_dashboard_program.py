"""The dashboard and a run of the user's own program (issue 31): `t` starts the profile's
[run] command as a `gputui run` child; the training panel shows the program's latest metrics;
the curves plot any reported metric (m picks which, loss-like names first) against step or
time; o shows the tail of its output.log; the GPUs it holds are marked in the hosts panel.

Most tests feed a synthetic program run's events through the same fold and messages as a
followed run's (post_events); one starts a real program with `t` and stops it with `t`.
"""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from gputui.dashboard.child import LOCAL_STOP_S, PROGRAM_STOP_MARGIN_S, TrainingChild
from gputui.runs.output import MAX_LINE, TAIL_LINES, read_tail
from gputui.dashboard.training import TrainingState, event_line
from gputui.runs.curves import MetricCurves, load_metrics, metric_order
from gputui.ui.app import DashboardApp, create_app
from gputui.ui.curves_panel import CurvesPanel
from gputui.ui.hosts_panel import HostsView
from gputui.ui.output_screen import OutputScreen
from gputui.ui.screens import HelpScreen
from gputui.ui.training_actions import post_events
from gputui.ui.training_panel import TrainingSummary
from tests.dashboard_support import Clock, RecordedSource, drive, make_backend, screen_text, settled, wait_for
from tests.dashboard_support import utc  # noqa: F401 - an autouse fixture: the screen's clock in UTC

RUN_ID = "20260101-000000-prog"


def program_events(n: int = 60, run_dir: str = "/nonexistent/run", gpus: tuple[int, ...] = (0,)) -> list[dict[str, Any]]:
    """A program run's start and `n` metrics events (loss falling, val_acc rising), as
    gputui.jobs.program writes them; deterministic."""
    events: list[dict[str, Any]] = [{
        "event": "start", "run_id": RUN_ID, "run_dir": run_dir, "program": "python train.py --lr 0.01",
        "workdir": "/tmp", "device": "cuda" if gpus else "cpu", "device_choice": "--gpus", "gpus": list(gpus),
        "strategy": "single", "world_size": 1, "resumed": False, "direction": "maximize"}]
    for i in range(1, n + 1):
        events.append({"event": "metrics", "step": i * 10, "epoch": 1 + i // 20,
                       "values": {"val_acc": round(1 - 1 / (1 + i / 8), 4),
                                  "train_loss": round(2.3 * math.exp(-i / 15) + 0.05, 4), "lr": 0.01},
                       "elapsed_s": i * 0.5, "source": "report"})
    return events


def program_app() -> DashboardApp:
    """The dashboard on a recorded local host with one H100 (profile local.toml), polls an hour apart."""
    clock = Clock()
    return create_app(make_backend(demo=False, source=RecordedSource(clock, ("vm",)), clock=clock, interval=3600))


async def replay(pilot: Any, events: list[dict[str, Any]]) -> None:
    app = pilot.app
    await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
    post_events(events, app.post_message, app.generation)
    last = events[-1]
    await wait_for(pilot, lambda: app.training.status != "idle" and (last.get("step") is None
                                                                      or app.training.step == last["step"]),
                   what="the replayed events")
    panel = app.query_one(CurvesPanel)
    panel.redraw()  # the curves redraw on a timer: draw the last state now
    await settled(pilot, lambda: panel._drawn == panel._key(), "the curves drawn")


# -- the run's state, without the UI ---------------------------------------------------------------

def test_a_program_runs_state_is_its_latest_metrics_step_time_and_steps_per_second() -> None:
    state = TrainingState().replay(program_events(60))
    assert state.program == "python train.py --lr 0.01" and state.gpus == (0,)
    assert [name for name, _ in state.metrics] == ["train_loss", "val_acc", "lr"]  # loss-like, accuracy-like, rest
    assert dict(state.metrics)["train_loss"] == round(2.3 * math.exp(-4) + 0.05, 4)
    assert state.step == 600 and state.epoch == 4 and state.elapsed_s == 30.0
    assert state.steps_per_s == 20.0  # 10 steps every 0.5 s of the run's clock
    assert state.metric_curves.names() == ["train_loss", "val_acc", "lr"]
    assert len(state.metric_curves.series("val_acc")) == 60


def test_one_by_one_and_in_batches_fold_to_the_same_state() -> None:
    events = program_events(30) + [{"event": "done", "exit_code": 0, "elapsed_s": 15.5, "step": 300}]
    one = TrainingState()
    for event in events:
        one = one.fold(event)
    assert one == TrainingState().replay(events)
    assert one.status == "done" and one.exit_code == 0 and one.step == 300


def test_metric_order_puts_loss_like_then_accuracy_like_names_first() -> None:
    assert metric_order(["lr", "val_acc", "grad_norm", "train_loss", "Loss", "top1_acc"]) == [
        "train_loss", "Loss", "val_acc", "top1_acc", "lr", "grad_norm"]


def test_a_resume_of_the_same_run_keeps_its_metric_curves_a_new_run_starts_afresh() -> None:
    events = program_events(5)
    curves = MetricCurves().fold_all(events)
    resumed = dict(events[0], resumed=True)
    more = [dict(e, step=e["step"] + 50, elapsed_s=e["elapsed_s"] + 10) for e in events[1:]]
    assert len(curves.fold_all([resumed] + more).series("train_loss")) == 10
    assert len(curves.fold_all([dict(events[0], run_id="another")] + more).series("train_loss")) == 5


def test_another_ranks_reports_are_their_own_series_not_the_panels_numbers() -> None:
    events = program_events(2) + [{"event": "metrics", "step": 20, "values": {"train_loss": 9.0}, "rank": 1,
                                   "elapsed_s": 1.0}]
    state = TrainingState().replay(events)
    assert dict(state.metrics)["train_loss"] != 9.0
    assert [p.value for p in state.metric_curves.series("train_loss (rank 1)")] == [9.0]


def test_a_program_runs_log_lines_name_the_program_and_its_end() -> None:
    assert event_line(program_events(1)[0]) == (f"run {RUN_ID} started: python train.py --lr 0.01 on cuda "
                                                "(single, GPU 0)")
    assert event_line({"event": "done", "exit_code": 0, "elapsed_s": 75.0, "step": 3}) == (
        "run done: the program exited 0 after 1m15s")
    assert "garbage" in str(event_line({"event": "warning", "reason": "bad_report", "message": "garbage in"}))


def test_the_child_of_a_program_run_is_local_and_waits_for_the_programs_grace(tmp_path: Path) -> None:
    """A program's metrics events are not a cluster master's: the stop bound is the program's own
    grace plus the run's margin, not a cluster's teardown."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "profile.toml").write_text('[run]\ncommand = ["python", "t.py"]\nstop_grace_s = 100.0\n')
    child = TrainingChild(["true"], run_dir=run_dir)
    for event in program_events(2, str(run_dir)):
        child._seen(event)
    assert child.cluster is False
    assert child.stop_bound() == max(LOCAL_STOP_S, 100.0 + PROGRAM_STOP_MARGIN_S) == 135.0


def test_the_output_tail_is_bounded_cut_and_plain(tmp_path: Path) -> None:
    lines = [f"line {i} [bold red]not markup[/] \x1b[31mred\x1b[0m" for i in range(1000)]
    (tmp_path / "output.log").write_text("\n".join(lines) + "\n" + "x" * (4 << 20))  # then 4 MiB without a newline
    tail = read_tail(tmp_path)  # only the file's last 256 KiB are read: the huge line's end, cut
    assert tail.size > 4 << 20 and len(tail.lines) == 1
    assert len(tail.lines[0]) == MAX_LINE and tail.lines[0].endswith("…")
    (tmp_path / "output.log").write_text("\n".join(lines) + "\n")
    tail = read_tail(tmp_path)
    assert tail.lines[-1] == "line 999 [bold red]not markup[/] red" and tail.lines[0].startswith("line 800 ")
    assert read_tail(tmp_path / "none").note == "no output yet"


# -- the dashboard, on a synthetic run -------------------------------------------------------------

@pytest.mark.parametrize(("size", "head"), [
    ((120, 40), "● running  GPU 0 · python train.py --lr 0.01"),  # room for the command: the run id goes
    ((200, 50), f"● running  {RUN_ID}  cuda · single · GPU 0 · python train.py --lr 0.01"),
], ids=["120x40", "200x50"])
def test_the_training_panel_shows_the_programs_metrics_not_loss_acc_and_samples(size: tuple[int, int],
                                                                                 head: str) -> None:
    app = program_app()

    async def scenario(pilot: Any) -> str:
        await replay(pilot, program_events(60))
        return "\n".join(line.plain for line in app.query_one(TrainingSummary).render().split("\n"))

    text = drive(app, scenario, size=size)
    assert text.splitlines()[0] == head
    assert "step 600  epoch 4  30s  20 steps/s" in text
    assert "train_loss = 0.0921  val_acc = 0.8824  lr = 0.01" in text
    assert "samples/s" not in text and "best" not in text and "ETA" not in text


def test_m_picks_the_metric_loss_like_first_and_x_goes_between_step_and_time() -> None:
    app = program_app()

    async def scenario(pilot: Any) -> list[Any]:
        await replay(pilot, program_events(60))
        panel = app.query_one(CurvesPanel)
        seen: list[Any] = [(panel.shown_metric(), panel.axis)]
        for key in ("m", "m", "m", "x", "x"):
            await pilot.press(key)
            seen.append((panel.shown_metric(), panel.axis))
        panel.redraw()
        await settled(pilot, lambda: panel._drawn == panel._key(), "the curves drawn")
        seen.append(str(panel.query_one("#curves-legend").render()))
        return seen

    seen = drive(app, scenario)
    assert seen[:6] == [("train_loss", "step"), ("val_acc", "step"), ("lr", "step"), ("train_loss", "step"),
                        ("train_loss", "time"), ("train_loss", "step")]
    assert "train_loss" in seen[6] and "metric 1/3 (m: next)" in seen[6]


def test_the_curve_is_the_metric_picked(tmp_path: Path) -> None:
    """The plot's left axis is the picked metric's: val_acc's ticks are below 1, train_loss's reach 2."""
    app = program_app()

    async def scenario(pilot: Any) -> tuple[str, str]:
        await replay(pilot, program_events(60))
        panel = app.query_one(CurvesPanel)
        first = screen_text(app)
        await pilot.press("m")
        panel.redraw()
        await settled(pilot, lambda: panel._drawn == panel._key(), "the curves drawn")
        return first, screen_text(app)

    loss, acc = drive(app, scenario)
    assert "2.0┤" in loss and "train_loss (log)" in loss
    assert "0.8┤" in acc and "2.0┤" not in acc and "val_acc" in acc


def test_an_overlaid_program_run_lays_the_same_metric_over(tmp_path: Path) -> None:
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in program_events(20, str(earlier))))
    assert load_metrics(earlier).names() == ["train_loss", "val_acc", "lr"]
    app = program_app()

    async def scenario(pilot: Any) -> Any:
        await replay(pilot, program_events(60))
        panel = app.query_one(CurvesPanel)
        app.set_overlay([str(earlier)])
        await wait_for(pilot, lambda: panel.overlay_metrics, what="the overlay to load")
        panel.redraw()
        await settled(pilot, lambda: panel._drawn == panel._key(), "the curves drawn")
        return str(panel.query_one("#curves-legend").render()), panel._overlay_xy

    legend, drawn = drive(app, scenario)
    assert RUN_ID in legend
    assert len(drawn[(0, "metric:train_loss", "step", 0.6)][0]) == 20  # the earlier run's 20 points, smoothed


def test_the_gpus_the_run_holds_are_marked_on_the_local_host_while_it_runs() -> None:
    app = program_app()

    async def scenario(pilot: Any) -> tuple[list[str], list[str]]:
        await replay(pilot, program_events(3))
        running = list(app.query_one(HostsView).text_lines)
        await replay(pilot, [{"event": "done", "exit_code": 0, "elapsed_s": 2.0, "step": 30}])
        return running, list(app.query_one(HostsView).text_lines)

    running, ended = drive(app, scenario)
    assert running[1].startswith("▸0 "), running
    assert ended[1].startswith(" 0 "), ended


def test_o_shows_the_programs_last_lines_as_text_never_markup(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "output.log").write_text("".join(f"epoch {i} [bold]done[/bold]\n" for i in range(300)))
    app = program_app()

    async def scenario(pilot: Any) -> tuple[str, Any]:
        await replay(pilot, program_events(3, str(run_dir)))
        await pilot.press("o")
        await wait_for(pilot, lambda: isinstance(app.screen, OutputScreen) and getattr(app.screen, "tail", None),
                       what="the output read")
        screen: Any = app.screen
        with (run_dir / "output.log").open("a") as fh:
            fh.write("the last line\n")
        await wait_for(pilot, lambda: screen.tail is not None and screen.tail.lines[-1] == "the last line",
                       what="the new line read")
        await settled(pilot, lambda: "the last line" in screen_text(app), "the new line shown")
        text = screen_text(app)
        await pilot.press("escape")
        return text, screen.tail

    text, tail = drive(app, scenario)
    assert len(tail.lines) == TAIL_LINES and tail.lines[0] == "epoch 101 [bold]done[/bold]"
    assert "epoch 299 [bold]done[/bold]" in text and "the last line" in text


def test_m_and_o_show_only_with_a_program_run_on_screen() -> None:
    app = program_app()

    async def scenario(pilot: Any) -> tuple[bool, bool, str, bool]:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        before = bool(app.check_action("curves_metric", ())) or bool(app.check_action("output", ()))
        await replay(pilot, program_events(3))
        after = bool(app.check_action("curves_metric", ())) and bool(app.check_action("output", ()))
        footer = (await settled(pilot, what="the footer")).splitlines()[-1]
        await pilot.press("question_mark")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen), what="the help")
        return before, after, footer, bool(app.screen.query("#help-program-keys"))

    before, after, footer, help_lists = drive(app, scenario)
    assert not before and after and help_lists
    assert "m Metric" in footer and "o Output" in footer


# -- the real thing: t starts the profile's program, t stops it ------------------------------------

PROGRAM = textwrap.dedent("""\
    import pathlib, time
    from gputui import report
    print("program up [bold]data[/bold]", flush=True)
    deadline = time.monotonic() + 600  # a bound only: the test stops it (t) once its curve is drawn
    step = 0
    while not report.should_stop():
        if time.monotonic() > deadline:
            raise SystemExit("never asked to stop")
        step += 1
        report.log(step=step, loss=1.0 / step, val_acc=min(1.0, step / 3000))
        time.sleep(0.01)  # the program's own pace (a report a step), not a wait of the test's
    (report.checkpoint_dir() / "state.txt").write_text(str(step))
    print("saved at step", step, flush=True)
""")


def test_t_starts_the_profiles_program_shows_its_metric_curve_and_t_stops_it_with_a_checkpoint(
        tmp_path: Path) -> None:
    profile = tmp_path / "mine.toml"
    profile.write_text(f"[run]\ncommand = {json.dumps([sys.executable, '-c', PROGRAM])}\nstop_grace_s = 20\n")
    app = create_app(make_backend(profile))  # the demo: simulated hosts, a real run on the CPU

    async def scenario(pilot: Any) -> tuple[Any, str, str]:
        await pilot.press("t")
        panel = app.query_one(CurvesPanel)
        await wait_for(pilot, lambda: app.training.program is not None
                       and len(app.training.metric_curves.series("loss")) >= 5, 90, "the program's reports")
        panel.redraw()
        await settled(pilot, lambda: panel._drawn == panel._key() and panel.shown_metric() == "loss",
                      "the loss curve drawn")
        legend = str(panel.query_one("#curves-legend").render())
        child = app.child
        assert child is not None and "--profile" in child.argv and "--evals-per-epoch" not in child.argv
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.exit_code is not None, 90, "the program's stop and the run's end")
        return child, legend, screen_text(app)

    child, legend, text = drive(app, scenario)
    assert legend.startswith("━ loss") and "metric 1/2" in legend
    assert app.training.status == "interrupted" and child.proc.returncode == 0, (app.training, text)
    saved = Path(app.training.run_dir or "") / "checkpoints" / "state.txt"
    assert saved.is_file(), "the program saw should_stop() and saved"
    ended = [json.loads(line) for line in (saved.parent.parent / "events.jsonl").read_text().splitlines()][-1]
    assert ended["event"] == "interrupted" and ended["checkpoint"] == str(saved.parent)
    assert "loss = " in text and "interrupted" in text
