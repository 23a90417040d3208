"""Dashboard promises with no other test (App.run_test): kwh_price meters this machine's
GPU energy into the ledger every minute and on exit; ctrl+q quits through the same
question as q; a slave is selected with the mouse; a stopping run is waited for (its
teardown releases slaves) and its progress shown, and SIGKILLed only past the bound."""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest
from textual.message import Message

from gputui.model import units
from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.dashboard import child as child_module
from gputui.dashboard.child import CLUSTER_STOP_S, LOCAL_STOP_S, TrainingChild
from gputui.dashboard.hosts import ENERGY_FLUSH_S
from gputui.dashboard.setup import Backend
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState
from gputui.model.supervisor import GRACE_S
from gputui.ui.app import create_app
from gputui.ui.cost_panel import SlavesTable
from gputui.ui.events_panel import EventsLog
from gputui.ui.messages import RunStopping
from gputui.ui.screens import ChoiceScreen
from gputui.ui.status import StatusBar
from tests.dashboard_support import Clock, drive, make_backend, screen_text, sim_provider, wait_for
from tests.proc_support import wait_until

WATTS = 250.0
KWH_PRICE = 0.40


class LocalGpus:
    """This machine's two GPUs as NVML would read them, at the test's clock, drawing WATTS each."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def poll(self) -> list[HostSnapshot]:
        gpus = tuple(GpuSample(i, name="NVIDIA H100 80GB HBM3", util_pct=50.0, power_w=WATTS) for i in range(2))
        return [HostSnapshot("here", HostState.OK, self.clock(), kind="local", gpus=gpus)]

    def close(self) -> None:
        pass


def energy_profile(tmp_path: Path) -> Path:
    profile = tmp_path / "energy.toml"
    profile.write_text(f"[cloud]\nbudget_usd = 5\nkwh_price = {KWH_PRICE}\n", encoding="utf-8")
    return profile


def metered_app(tmp_path: Path, gputui_home: Path) -> tuple[Clock, float, Any, Ledger]:
    """The dashboard over LocalGpus with kwh_price set: its clock, that clock's start, the app, its ledger."""
    clock = Clock()
    start = clock.now
    app = create_app(make_backend(energy_profile(tmp_path), source=LocalGpus(clock), clock=clock))
    return clock, start, app, Ledger(gputui_home / "ledger.sqlite3")


async def advance(app: Any, pilot: Any, clock: Clock, seconds: float) -> None:
    """Move the clock, then let two polls run: the second read the new time from start to end."""
    clock.now += seconds
    polls = app.hosts_polls
    await wait_for(pilot, lambda: app.hosts_polls >= polls + 2, what="two polls at the new time")


def test_kwh_price_meters_local_gpu_energy_every_minute(tmp_path: Path, gputui_home: Path) -> None:
    clock, start, app, ledger = metered_app(tmp_path, gputui_home)

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        for step in (20, 20, ENERGY_FLUSH_S - 45):  # readings <= 20 s apart (a gap over 30 s is not bridged)
            await advance(app, pilot, clock, step)
            assert ledger.energy() == [], "written before a minute passed"
        await advance(app, pilot, clock, 10)  # 65 s since the start: the minute's flush
        lines = ledger.energy()
        assert sorted(line[0] for line in lines) == ["here/gpu0", "here/gpu1"]
        for _subject, cluster, _run, begin, end, kwh, rate in lines:
            assert (cluster, begin, end, rate) == ("local", start, start + 65, KWH_PRICE)
            assert kwh == pytest.approx(WATTS * 65 / 3.6e6)  # 250 W for 65 s
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)


def test_kwh_price_energy_since_the_last_flush_is_written_on_exit(tmp_path: Path, gputui_home: Path) -> None:
    clock, start, app, ledger = metered_app(tmp_path, gputui_home)

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="the first poll")
        await advance(app, pilot, clock, 20)
        assert ledger.energy() == []  # 20 s: not yet written ...
        await pilot.press("q")  # ... until the dashboard exits
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
    lines = ledger.energy()
    assert sorted((s, b, e) for s, _c, _r, b, e, _k, _p in lines) == [
        ("here/gpu0", start, start + 20), ("here/gpu1", start, start + 20)]
    assert sum(line[5] for line in lines) == pytest.approx(2 * WATTS * 20 / 3.6e6)


@pytest.mark.parametrize("slave_up", [False, True])
def test_ctrl_q_quits_through_the_same_question_as_q(gputui_home: Path, slave_up: bool) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        if slave_up:
            await pilot.press("u")
            await wait_for(pilot, lambda: app.query_one(SlavesTable).row_count == 1, what="one slave")
        await pilot.press("ctrl+q")
        if slave_up:  # asks first: terminate, keep or cancel
            assert isinstance(app.screen, ChoiceScreen)
            assert "1 slave running" in screen_text(app)
            await pilot.press("k")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")

    drive(app, scenario)
    assert app.return_code == 0
    running = Ledger(gputui_home / "ledger.sqlite3").instances(running=True)
    assert len(running) == (1 if slave_up else 0)
    if slave_up:
        assert "left running by your choice" in str(app.exit_message)


def test_a_click_selects_the_slave_that_d_then_terminates(gputui_home: Path) -> None:
    provider = sim_provider()
    app = create_app(make_backend(provider=provider))

    async def scenario(pilot: Any) -> tuple[str, str]:
        await wait_for(pilot, lambda: app.cloud_polls, what="the first cloud poll")
        table = app.query_one(SlavesTable)
        await pilot.press("u")
        await wait_for(pilot, lambda: table.row_count == 1, what="one slave")
        await pilot.press("u")
        await wait_for(pilot, lambda: table.row_count == 2, what="two slaves")
        first, second = (key.value for key in table.rows)
        assert table.selected == first  # the cursor starts on the first row
        assert await pilot.click(SlavesTable, offset=(2, 2))  # row 2 of the table: the header, then the slaves
        await wait_for(pilot, lambda: table.selected == second, what="the clicked row selected")
        await pilot.press("d")
        await wait_for(pilot, lambda: table.row_count == 1, what="the selected slave gone")
        assert {key.value for key in table.rows} == {first}
        await pilot.press("q", "t")
        await wait_for(pilot, lambda: not app.is_running, what="the app to exit")
        return first, second

    first, second = drive(app, scenario)
    records = {r.instance_id: r for r in Ledger(gputui_home / "ledger.sqlite3").instances()}
    assert records[second].ended_by == "user" and records[first].ended_by is not None


# -- a stopping run: waited for, shown, SIGKILLed only past the bound ---------------------------

# A cluster run as `gputui run --json` shows it, whose teardown lasts until the test opens the gate
# (a FIFO): on SIGTERM it says `stopping` (2 slaves being released) and waits. Each SIGTERM it gets
# is noted in NOTES. It has a helper in a session of its own that ignores SIGTERM (a trainer stuck
# in a collective), holding the same stdout; the run ends it itself once the gate opens.
FAKE_RUN = r"""
import json, os, signal, subprocess, sys
gate, notes = sys.argv[1], sys.argv[2]
events = sys.argv[sys.argv.index("--run-dir") + 1] + "/events.jsonl" if "--run-dir" in sys.argv else None
def say(**event):
    print(json.dumps(event), flush=True)
    if events:  # the dashboard follows the run directory's events.jsonl, as a real run writes it
        with open(events, "a") as fh:
            fh.write(json.dumps(event) + "\n")
def note(_signum, _frame):
    with open(notes, "a") as fh:
        fh.write("SIGTERM\n")
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
helper = subprocess.Popen([sys.executable, "-c", "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                           "signal.pause()", gate], start_new_session=True)
with open(notes + ".helper", "w") as fh:
    fh.write(str(helper.pid))
say(event="cluster", attempt=0, nodes=["master", "n0"], world_size=2, message="2 node(s)")
say(event="start", run_id="fake", model="seed", device="cpu", strategy="ddp", world_size=2, epochs=1, batch_size=64,
    steps_per_epoch=10, total_steps=10, nodes=2)
say(event="step", epoch=1, step=1, loss=2.3, samples_per_s=100.0, elapsed_s=0.1)
signal.sigwait({signal.SIGTERM})
note(None, None)
signal.signal(signal.SIGTERM, note)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
say(event="stopping", slaves=2, processes=3, reason="SIGTERM", message="stopping: 2 slaves being released")
with open(gate) as fh:
    fh.read()
helper.kill()
helper.wait()
say(event="interrupted", reason="SIGTERM", epoch=1, step=1, elapsed_s=0.1, checkpoint="ckpt.pt")
"""


class StopClock:
    """The clock a stopping child measures its bound with, moved by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeRun:
    """The fake run's files: the gate the test opens, the SIGTERMs it got, its helper."""

    def __init__(self, tmp_path: Path) -> None:
        self.script = tmp_path / "fake_run.py"
        self.script.write_text(FAKE_RUN)
        self.gate = tmp_path / "gate"
        os.mkfifo(self.gate)
        self.notes = tmp_path / "notes"

    @property
    def argv(self) -> list[str]:
        return [sys.executable, str(self.script), str(self.gate), str(self.notes)]

    def sigterms(self) -> int:
        return len(self.notes.read_text().splitlines()) if self.notes.exists() else 0

    def helper_gone(self) -> bool:
        """Whether the helper (which the run started before its first event) has ended."""
        pid = int(Path(str(self.notes) + ".helper").read_text())
        try:
            proc = psutil.Process(pid)
            return proc.status() == psutil.STATUS_ZOMBIE or " ".join(proc.cmdline()).find(str(self.gate)) < 0
        except psutil.NoSuchProcess:
            return True

    def open_gate(self) -> bool:
        """Let the run end its teardown (False while it has not opened the gate yet)."""
        try:
            fd = os.open(self.gate, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # no reader yet
                return False
            raise
        os.write(fd, b"go")
        os.close(fd)
        return True


class FakeRunBackend(Backend):
    def __init__(self, fake: FakeRun, clock: StopClock) -> None:
        base = make_backend()
        super().__init__(base.options, clock=base.clock, stop_clock=clock)
        self.fake = fake

    def training_argv(self, resume: bool) -> list[str]:
        return self.fake.argv


def stop_app(tmp_path: Path) -> tuple[FakeRun, StopClock, Any]:
    fake, clock = FakeRun(tmp_path), StopClock()
    return fake, clock, create_app(FakeRunBackend(fake, clock))


def drive_stop(app: Any, clock: StopClock, scenario: Any, **run_test: Any) -> None:
    """`drive`, and if the scenario fails, the fake run is stopped past its bound (SIGKILL of its
    tree) so that the app can exit and nothing is left: a failure must not hang."""

    async def guarded(pilot: Any) -> None:
        try:
            await scenario(pilot)
        except BaseException:
            clock.now = 1e12
            if app.child is not None and app.child.running:
                app.child.stop()
            raise

    drive(app, guarded, size=(200, 40), **run_test)


def status_text(app: Any) -> str:
    return str(app.query_one(StatusBar).stopping)


def log_text(app: Any) -> str:
    return "\n".join(app.query_one(EventsLog).lines_written)


async def stopping_shown(app: Any, pilot: Any, clock: StopClock, after: float) -> None:
    """Move the stop clock `after` s on, and wait until the status line counts down from there."""
    clock.now = 1000.0 + after
    expected = f"SIGKILL in {units.duration(CLUSTER_STOP_S - after, 'clock')})"
    await wait_for(pilot, lambda: expected in status_text(app), 30, f"the status line to say {expected!r}")


def test_a_run_that_takes_long_to_stop_is_waited_for_and_its_progress_shown(tmp_path: Path) -> None:
    """Not SIGKILLed after 15 s (what the dashboard allowed before), nor 10 minutes later: the
    teardown of a cluster run ends when it ends, and the status line says what it waits for."""
    fake, clock, app = stop_app(tmp_path)

    async def scenario(pilot: Any) -> None:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "running", 60, "the run to start")
        child = app.child
        await pilot.press("t")
        await stopping_shown(app, pilot, clock, 0)
        # The run's own words come through its events file, read every poll: waited for.
        await wait_for(pilot, lambda: status_text(app).startswith(
            "stopping: waiting for the run to release 2 slaves (2 processes left;"), 30, "the run's teardown in the status")
        assert "stopping: 2 slaves being released" in log_text(app)  # the run's own words, in the log
        assert "release 2 slaves" in app.query_one(StatusBar).render().plain
        await stopping_shown(app, pilot, clock, 16)
        await stopping_shown(app, pilot, clock, CLUSTER_STOP_S - 19)
        assert child.running and not child.killed and fake.sigterms() == 1
        await wait_for(pilot, fake.open_gate, 30, "the run to wait at its gate")
        await wait_for(pilot, lambda: app.training.exit_code is not None, 60, "the run to end")
        assert app.training.status == "interrupted" and child.proc.returncode == 0
        await wait_for(pilot, lambda: status_text(app) == "", 30, "the status line to drop the stop")
        assert fake.sigterms() == 1
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, 30, "the app to exit")

    drive_stop(app, clock, scenario)
    assert fake.helper_gone()


def test_quitting_while_the_run_stops_waits_for_its_teardown(tmp_path: Path) -> None:
    """t, then q: the app stays until the run has released what it holds, and sends no second
    SIGTERM (a DDP run takes a second one as "stop at once", without its checkpoint)."""
    fake, clock, app = stop_app(tmp_path)

    async def scenario(pilot: Any) -> None:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "running", 60, "the run to start")
        await pilot.press("t")
        await stopping_shown(app, pilot, clock, 0)
        await pilot.press("q")
        await stopping_shown(app, pilot, clock, 60)  # the quit is waiting, and the countdown goes on
        assert app.is_running and app.child.running and fake.sigterms() == 1
        await wait_for(pilot, fake.open_gate, 30, "the run to wait at its gate")
        await wait_for(pilot, lambda: not app.is_running, 60, "the app to exit once the run ended")

    drive_stop(app, clock, scenario)
    assert app.child.proc.returncode == 0 and not app.child.killed and fake.sigterms() == 1
    assert fake.helper_gone()


def test_a_run_still_stopping_past_the_bound_is_killed_whole_and_that_is_said(tmp_path: Path) -> None:
    fake, clock, app = stop_app(tmp_path)
    posted: list[Message] = []

    async def scenario(pilot: Any) -> None:
        await pilot.press("t")
        await wait_for(pilot, lambda: app.training.status == "running", 60, "the run to start")
        await pilot.press("q", "s")  # quit and stop it (the question's answer): SIGTERM, then the wait
        await stopping_shown(app, pilot, clock, CLUSTER_STOP_S - 1)
        assert not app.child.killed and not fake.helper_gone()
        clock.now = 1000.0 + CLUSTER_STOP_S + 1
        await wait_for(pilot, lambda: not app.is_running, 60, "the app to exit once the run was killed")

    drive_stop(app, clock, scenario, message_hook=posted.append)
    assert app.child.killed and app.child.proc.returncode == -9
    wait_until(fake.helper_gone, 30, "the helper in its own session, deaf to SIGTERM, to be killed too")
    said = [m.text for m in posted if isinstance(m, RunStopping) and m.log]
    assert any(f"had not stopped {CLUSTER_STOP_S:.0f} s after SIGTERM" in t and "SIGKILL" in t for t in said), said
    assert "gputui cloud ls" in app.child.last_error()


def test_the_stop_bound_outlasts_the_teardown_it_waits_for() -> None:
    """A cluster's: the supervisor's grace, its wait for the nodes, the cloud's bound on
    terminating slaves. A local run's: the supervisor's grace."""
    from gputui.cluster.members import KILL_MARGIN_S, STOP_GRACE_S
    from gputui.cluster.teardown import DRAIN_S

    release = CloudContext.__dataclass_fields__["wait_timeout_s"].default
    assert CLUSTER_STOP_S >= STOP_GRACE_S + KILL_MARGIN_S + DRAIN_S + release + 30
    assert GRACE_S < LOCAL_STOP_S < CLUSTER_STOP_S
    child = TrainingChild(["true"])
    assert child.stop_bound() == CLUSTER_STOP_S  # not known yet: the long one
    child._seen({"event": "start", "run_id": "r", "world_size": 2})
    assert child.stop_bound() == LOCAL_STOP_S  # a local (DDP) run said so
    for first in ({"event": "node", "node": "n0"}, {"event": "start", "nodes": 2}):
        child = TrainingChild(["true"])
        child._seen(first)
        child._seen({"event": "start", "run_id": "r", "world_size": 2})
        assert child.stop_bound() == CLUSTER_STOP_S, first
    assert child_module.plural(1, "slave") == "1 slave" and child_module.plural(3, "process") == "3 processes"
