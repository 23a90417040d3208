"""The dashboard's run session as plain Python (no Textual): every phase, every event, the moves
allowed and the ones refused, and what each move leaves behind (owner, generation, state drawn)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import pytest

from gputui.runs import store as runs
from gputui.dashboard.session import GOING, HERE_GOING, MOVES, QUITTING, Phase, Refused, RunSession, SessionError
from gputui.dashboard.training import TrainingState

P = Phase


class FakeChild:
    """Stands in for TrainingChild: what the session reads and calls."""

    def __init__(self, run_dir: Path | None = None) -> None:
        self.run_dir = run_dir
        self.stop_requested = False
        self.detached = False
        self.alive = True
        self.stops = 0
        self.follower: Any = None

    @property
    def running(self) -> bool:
        return self.alive

    def stop(self) -> bool:
        self.stop_requested = True
        self.stops += 1
        return True

    def detach(self) -> None:
        self.detached = True


class FakeFollower:
    def __init__(self, run: runs.RunDir, alive: Callable[[], bool]) -> None:
        self.run, self.alive, self.stopped = run, alive, False

    def stop(self) -> None:
        self.stopped = True


class World:
    """The runs alive on this pretend machine, and the signals sent."""

    def __init__(self) -> None:
        self.alive: dict[Path, int] = {}
        self.killed: list[tuple[int, int]] = []
        self.kill_error: OSError | None = None

    def live_process(self, run: runs.RunDir) -> Any:
        pid = self.alive.get(run.path)
        return None if pid is None else SimpleNamespace(pid=pid)

    def kill(self, pid: int, sig: int) -> None:
        if self.kill_error is not None:
            raise self.kill_error
        self.killed.append((pid, sig))

    def session(self) -> RunSession:
        return RunSession(live_process=self.live_process, kill=self.kill, follower=FakeFollower)


RUN_A = runs.RunDir(Path("/nowhere/runs/run-a"))
RUN_B = runs.RunDir(Path("/nowhere/runs/run-b"))
RUNNING = TrainingState(status="running", run_id="run-a", step=5)
DONE = TrainingState(status="done", run_id="run-a", step=10)


def at(phase: Phase) -> tuple[RunSession, World]:
    """A fresh session brought to `phase` by legal moves only."""
    world = World()
    world.alive[RUN_A.path] = 4242
    s = world.session()
    if phase is P.ATTACHED:
        s.attach(RUN_A)
    elif phase is not P.IDLE:
        s.start(FakeChild(), resume=False)  # type: ignore[arg-type]
        if phase is not P.STARTING:
            s.update(s.generation, RUNNING)
        if phase is P.STOPPING:
            s.stop()
        elif phase is P.ENDED:
            s.child.alive = False  # type: ignore[union-attr]
            s.exited(s.generation, 0, None)
        elif phase is P.DETACHED:
            s.detach()
    assert s.phase is phase
    return s, world


EVENTS: dict[str, Callable[[RunSession], Any]] = {
    "start": lambda s: s.start(FakeChild(), resume=False),
    "attach": lambda s: s.attach(RUN_B),
    "stop": lambda s: s.stop(),
    "detach": lambda s: s.detach(),
    "started": lambda s: s.update(s.generation, RUNNING),  # an event that says the run is going
    "said done": lambda s: s.update(s.generation, DONE),
    "exited": lambda s: s.exited(s.generation, 0, None),
    "gone": lambda s: s.gone(s.generation),
    "leave": lambda s: s.leave(),
}
R = "refused"
# phase -> event -> the phase after it, or R (a key's move the session refuses, nothing changed)
EXPECTED: dict[Phase, dict[str, Any]] = {
    P.IDLE: {"start": P.STARTING, "attach": P.ATTACHED, "stop": R, "detach": P.IDLE, "started": P.IDLE,
             "said done": P.IDLE, "exited": P.IDLE, "gone": P.IDLE, "leave": P.IDLE},
    P.STARTING: {"start": R, "attach": R, "stop": P.STOPPING, "detach": P.DETACHED, "started": P.RUNNING,
                 "said done": P.ENDED, "exited": P.ENDED, "gone": P.ENDED, "leave": P.STARTING},
    P.RUNNING: {"start": R, "attach": R, "stop": P.STOPPING, "detach": P.DETACHED, "started": P.RUNNING,
                "said done": P.ENDED, "exited": P.ENDED, "gone": P.ENDED, "leave": P.RUNNING},
    P.ATTACHED: {"start": R, "attach": P.ATTACHED, "stop": P.STOPPING, "detach": P.ATTACHED,
                 "started": P.ATTACHED, "said done": P.ENDED, "exited": P.ENDED, "gone": P.ENDED, "leave": P.IDLE},
    P.STOPPING: {"start": R, "attach": R, "stop": R, "detach": P.DETACHED, "started": P.STOPPING,
                 "said done": P.ENDED, "exited": P.ENDED, "gone": P.ENDED, "leave": P.STOPPING},
    P.ENDED: {"start": P.STARTING, "attach": P.ATTACHED, "stop": R, "detach": P.ENDED, "started": P.RUNNING,
              "said done": P.ENDED, "exited": P.ENDED, "gone": P.ENDED, "leave": P.ENDED},
    P.DETACHED: {"start": R, "attach": R, "stop": R, "detach": P.DETACHED, "started": P.DETACHED,
                 "said done": P.DETACHED, "exited": P.DETACHED, "gone": P.DETACHED, "leave": P.DETACHED},
}


@pytest.mark.parametrize("phase", list(Phase), ids=lambda p: p.value)
def test_every_event_from_every_phase_moves_as_the_table_says_or_is_refused(phase: Phase) -> None:
    for name, event in EVENTS.items():
        s, _world = at(phase)
        generation, training = s.generation, s.training
        try:
            event(s)
            got: Any = s.phase
        except Refused:
            got = R
            assert (s.phase, s.generation, s.training) == (phase, generation, training), f"{name} refused but moved"
        assert got == EXPECTED[phase][name], f"{phase.value} --{name}--> {got}, not {EXPECTED[phase][name]}"


def test_the_table_is_the_one_the_dashboard_keeps_and_a_move_outside_it_is_a_bug() -> None:
    assert {p: set(to) for p, to in MOVES.items()} == {
        P.IDLE: {P.STARTING, P.ATTACHED},
        P.STARTING: {P.RUNNING, P.STOPPING, P.ENDED, P.DETACHED},
        P.RUNNING: {P.STOPPING, P.ENDED, P.DETACHED},
        P.ATTACHED: {P.ATTACHED, P.STOPPING, P.ENDED, P.IDLE},
        P.STOPPING: {P.RUNNING, P.ATTACHED, P.ENDED, P.IDLE, P.DETACHED},
        P.ENDED: {P.STARTING, P.RUNNING, P.ATTACHED, P.STOPPING, P.IDLE, P.DETACHED},
        P.DETACHED: set(),
    }
    s, _ = at(P.RUNNING)
    with pytest.raises(SessionError, match="running cannot go attached"):
        s._move(P.ATTACHED)


def test_busy_is_the_one_guard_of_t_r_and_a() -> None:
    assert {p for p in Phase if at(p)[0].busy} == {P.STARTING, P.RUNNING, P.ATTACHED, P.STOPPING}
    for phase in (P.STARTING, P.RUNNING, P.ATTACHED, P.STOPPING):
        with pytest.raises(Refused) as refused:
            at(phase)[0].check_start()
        assert refused.value.reason == GOING
    with pytest.raises(Refused) as refused:
        at(P.DETACHED)[0].check_start()
    assert refused.value.reason == QUITTING


def test_a_start_owns_a_new_generation_and_draws_starting() -> None:
    s, _ = at(P.ENDED)
    before, child = s.generation, FakeChild()
    assert s.start(child, resume=True) == before + 1  # type: ignore[arg-type]
    assert s.child is child and s.attached is None and s.training == TrainingState(status="starting")
    assert s.before_resume is not None and s.before_resume.status == "failed"  # shown again if the resume did nothing
    assert not s.update(before, RUNNING) and s.phase is P.STARTING  # the old run's message changes nothing


def test_stopping_a_child_signals_it_and_its_running_events_show_stopping() -> None:
    s, _ = at(P.RUNNING)
    s.stop()
    assert s.child.stops == 1 and s.training.status == "stopping"  # type: ignore[union-attr]
    s.update(s.generation, RUNNING)
    assert s.training.status == "stopping" and s.phase is P.STOPPING
    with pytest.raises(Refused) as again:
        s.stop()
    assert again.value.reason == "" and s.child.stops == 1  # type: ignore[union-attr]  # one SIGTERM, said nothing
    assert s.exited(s.generation, 0, None) == [] and s.training.status == "interrupted"


def test_stopping_an_attached_run_sends_one_sigterm_to_its_process() -> None:
    s, world = at(P.ATTACHED)
    s.stop()
    assert world.killed == [(4242, signal.SIGTERM)] and s.phase is P.STOPPING and s.stop_requested
    s.update(s.generation, RUNNING)
    assert s.training.status == "stopping"


def test_stopping_an_attached_run_that_is_gone_or_not_ours_is_refused_with_why() -> None:
    s, world = at(P.ATTACHED)
    del world.alive[RUN_A.path]
    with pytest.raises(Refused) as gone:
        s.stop()
    assert gone.value.reason == "run run-a is not running any more" and gone.value.severity == "warning"
    world.alive[RUN_A.path] = 4242
    world.kill_error = PermissionError(1, "Operation not permitted")
    with pytest.raises(Refused) as denied:
        s.stop()
    assert denied.value.reason == "cannot stop run run-a (pid 4242): Operation not permitted"
    assert denied.value.severity == "error" and s.phase is P.ATTACHED and not s.stop_requested


def test_attach_follows_the_run_and_looks_away_from_the_one_before() -> None:
    s, world = at(P.ATTACHED)
    first = s.follower
    assert isinstance(first, FakeFollower) and first.run == RUN_A and first.alive()
    with pytest.raises(Refused) as same:
        s.attach(RUN_A)  # followed already
    assert same.value.reason == "" and s.follower is first
    s.attach(RUN_B)
    assert first.stopped and s.attached == RUN_B and s.follower is not first and s.generation == 2
    assert s.training == TrainingState(status="starting", run_dir=str(RUN_B.path), run_id="run-b", attached=True)
    assert not s.follower.alive()  # type: ignore[union-attr]  # run-b has no live process


def test_attach_is_refused_while_the_run_started_here_is_going() -> None:
    s, _ = at(P.RUNNING)
    with pytest.raises(Refused) as refused:
        s.attach(RUN_B)
    assert refused.value.reason == HERE_GOING
    s.child.alive = False  # type: ignore[union-attr]
    s.update(s.generation, DONE)  # it said done and its process is gone: another run may be followed
    s.attach(RUN_B)
    assert s.child is None and s.phase is P.ATTACHED


def test_an_ended_childs_teardown_still_holds_attach_back() -> None:
    s, _ = at(P.RUNNING)
    s.update(s.generation, DONE)  # said done, still tearing down
    assert s.phase is P.ENDED and not s.busy
    with pytest.raises(Refused):
        s.attach(RUN_B)


def test_a_run_gone_without_a_word_is_stopped_and_one_that_wrote_nothing_says_so() -> None:
    s, _ = at(P.ATTACHED)
    s.update(s.generation, replace_status(RUNNING, "running"))
    assert s.gone(s.generation) and s.training.status == "stopped" and s.phase is P.ENDED
    s2 = World().session()
    s2.attach(RUN_A)
    s2.training = TrainingState(status="starting", attached=True)  # the follower's fold: no start event, no id
    s2.gone(s2.generation)
    assert s2.training.reason == "it wrote no events"
    assert not s2.gone(s2.generation - 1)


def replace_status(state: TrainingState, status: str) -> TrainingState:
    from dataclasses import replace

    return replace(state, status=status)


def test_quit_keeps_or_stops_the_run_started_here() -> None:
    s, _ = at(P.RUNNING)
    assert s.asks_at_quit and s.stops_at_quit
    assert s.detach() and s.child.detached and s.phase is P.DETACHED  # type: ignore[union-attr]
    assert not s.asks_at_quit and not s.stops_at_quit and not s.detach()
    child = s.child
    child.follower = FakeFollower(RUN_A, lambda: True)  # type: ignore[union-attr]
    s.leave()
    assert child.follower.stopped  # type: ignore[union-attr]  # nothing follows a run kept running
    stopping, _ = at(P.STOPPING)
    assert not stopping.asks_at_quit and stopping.stops_at_quit  # asked to stop: quitting waits for it


def test_leaving_an_attached_run_stops_following_it_and_holds_nothing() -> None:
    s, _ = at(P.ATTACHED)
    follower = s.follower
    s.leave()
    assert follower.stopped and s.attached is None and s.follower is None and not s.busy  # type: ignore[union-attr]


def test_a_failed_exit_is_said_once_with_its_error() -> None:
    s, _ = at(P.RUNNING)
    assert s.exited(s.generation, 2, "gputui: error: no data") == [
        ("run failed (exit 2): gputui: error: no data", "error")]
    assert s.training.status == "failed" and s.training.exit_code == 2
    s, _ = at(P.RUNNING)
    s.update(s.generation, TrainingState(status="failed", error="out of memory"))  # its `error` event said it
    assert s.exited(s.generation, 1, "Traceback ...") == [] and s.training.error == "out of memory"
    assert s.exited(s.generation - 1, 1, None) is None


def test_a_resume_of_a_complete_run_shows_how_it_ended(tmp_path: Path) -> None:
    (tmp_path / runs.EVENTS).write_text("\n".join(json.dumps(e) for e in (
        {"event": "start", "run_id": "r1", "epochs": 1, "total_steps": 4},
        {"event": "done", "step": 4, "test_acc": 91.0})) + "\n")
    s = World().session()
    s.start(FakeChild(run_dir=tmp_path), resume=True)  # type: ignore[arg-type]
    notes = s.exited(s.generation, 0, "gputui: run r1 is complete")
    assert notes == [("gputui: run r1 is complete", "warning")]
    assert s.training.status == "done" and s.training.run_id == "r1" and s.phase is P.ENDED


def test_the_session_imports_no_textual() -> None:
    code = "import sys, gputui.dashboard.session; print(any(m.split('.')[0] == 'textual' for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
