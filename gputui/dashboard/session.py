"""Who owns the dashboard's training run, and where it stands: one state, its moves in one table.

    idle ──start──> starting ──first event──> running ──stop──> stopping ──exited──> ended
      │                                                                             ^   │
      └──attach──> attached ──stop──> stopping ──gone (its process ended)──────────┘   │
    ended ──start / attach──> ...        a run started here, at quit ──detach──> detached

`starting`/`running`: a run this dashboard started (its child process), before and after its
first event. `attached`: a run followed from its events file, started elsewhere. `stopping`: a
SIGTERM was sent (here), or the run says it is stopping. `ended`: its events say how it ended,
or its process exited. `detached`: quitting, the run started here goes on by itself. The moves
the run reports (its events, its exit) follow what it did; the moves a key asks for (start,
attach, stop, detach) are refused with a reason the dashboard shows (`Refused`).

The session is plain Python (no Textual): the dashboard's keys call it, its workers' messages
feed it, and the panels draw `training`. Messages from an earlier run carry an older
`generation` and change nothing.
"""

from __future__ import annotations

import enum
import os
import signal
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from gputui.runs import store as runs
from gputui.runs.follow import Follower
from gputui.dashboard.training import TrainingState
from gputui.model.text import clean_tree

if TYPE_CHECKING:
    from gputui.dashboard.child import TrainingChild


class Phase(enum.Enum):
    IDLE = "idle"
    STARTING = "starting"
    RUNNING = "running"
    ATTACHED = "attached"
    STOPPING = "stopping"
    ENDED = "ended"
    DETACHED = "detached"


P = Phase
LIVE = (P.STARTING, P.RUNNING, P.ATTACHED, P.STOPPING)  # a run is going and this dashboard holds it
MOVES: dict[Phase, frozenset[Phase]] = {
    P.IDLE: frozenset({P.STARTING, P.ATTACHED}),
    P.STARTING: frozenset({P.RUNNING, P.STOPPING, P.ENDED, P.DETACHED}),
    P.RUNNING: frozenset({P.STOPPING, P.ENDED, P.DETACHED}),
    # another run attached to; the dashboard looks away (quit)
    P.ATTACHED: frozenset({P.ATTACHED, P.STOPPING, P.ENDED, P.IDLE}),
    # the run's own `stopping` event, then its events go on (no stop asked here)
    P.STOPPING: frozenset({P.RUNNING, P.ATTACHED, P.ENDED, P.IDLE, P.DETACHED}),
    # a new run, or the ended run's file goes on (resumed), or a run started here still tearing down
    P.ENDED: frozenset({P.STARTING, P.RUNNING, P.ATTACHED, P.STOPPING, P.IDLE, P.DETACHED}),
    P.DETACHED: frozenset(),
}

GOING = "a run is already going: t stops it first"
HERE_GOING = "the run started here is going: t stops it first (or quit and keep it running)"
QUITTING = "the run started here goes on without the dashboard (quitting)"

Note = tuple[str, str]  # (text, severity) for the events log and a toast


class Refused(Exception):
    """A key asked for a move the session does not allow now; `reason` ("" for nothing to say) and
    `severity` are for the dashboard to show."""

    def __init__(self, reason: str, severity: str = "warning") -> None:
        super().__init__(reason)
        self.reason = reason
        self.severity = severity


class SessionError(RuntimeError):
    """A move outside the table (the dashboard's bug, never the user's)."""


class RunSession:
    """The dashboard's run: who owns it (a child started here, a run attached to), its phase,
    and its folded state (`training`)."""

    def __init__(self, live_process: Callable[[runs.RunDir], Any] = runs.live_process,
                 kill: Callable[[int, int], None] = os.kill,
                 follower: Callable[[runs.RunDir, Callable[[], bool]], Follower] | None = None) -> None:
        self.phase = P.IDLE
        self.training = TrainingState()
        self.child: TrainingChild | None = None  # the run started here
        self.attached: runs.RunDir | None = None  # the run followed without being this dashboard's child
        self.follower: Follower | None = None  # its follower (stopped when the dashboard looks elsewhere or quits)
        self.generation = 0  # which run messages come from (a new run ignores the old one's)
        self.stop_asked = False  # a SIGTERM was sent to the attached run from here
        self.before_resume: TrainingState | None = None  # shown again if a resume finds the run complete
        self._live_process = live_process
        self._kill = kill
        self._follower = follower or (lambda run, alive: Follower(run.events, alive=alive))

    # -- the one table ---------------------------------------------------------------------------
    def _move(self, to: Phase) -> None:
        if to is not self.phase and to not in MOVES[self.phase]:
            raise SessionError(f"run session: {self.phase.value} cannot go {to.value}")
        self.phase = to

    def _observe(self, to: Phase) -> None:
        """A move the run reports. With no run held (idle: events posted to the panel alone; or let
        go at quit) it changes what is drawn, not who holds what."""
        if self.phase not in (P.IDLE, P.DETACHED):
            self._move(to)

    @property
    def busy(self) -> bool:
        """A run is going and this dashboard holds it (t stops it; t, r and a start nothing else)."""
        return self.phase in LIVE

    @property
    def stop_requested(self) -> bool:
        """A stop was asked from here (the run's `running` is shown as `stopping`)."""
        return (self.child is not None and self.child.stop_requested) or (self.attached is not None and self.stop_asked)

    def _child_live(self) -> bool:
        """A run started here is going (or still starting) and not let go."""
        child = self.child
        return child is not None and not child.detached and (child.running or self.phase in LIVE)

    @property
    def asks_at_quit(self) -> bool:
        """q asks first: keep the run started here, or stop it (it is going, no stop asked, not let go)."""
        child = self.child
        return child is not None and child.running and not child.stop_requested and not child.detached

    @property
    def stops_at_quit(self) -> bool:
        """Quitting stops the run started here with a checkpoint (it is going and was not kept)."""
        return self.child is not None and self.child.running and not self.child.detached

    # -- what a key asks for -------------------------------------------------------------------------
    def check_start(self) -> None:
        """Refused while a run is held (or the dashboard is quitting)."""
        if self.phase is P.DETACHED:
            raise Refused(QUITTING)
        if self.busy:
            raise Refused(GOING)

    def start(self, child: "TrainingChild", resume: bool) -> int:
        """A run started here (`child`, not started yet: the worker starts it); its generation."""
        self.check_start()
        before = self.training
        self._look_away()
        self._move(P.STARTING)
        self.generation += 1
        self.before_resume = before if resume else None
        self.child = child
        self.training = TrainingState(status="starting")
        return self.generation

    def attach(self, run: runs.RunDir) -> Follower:
        """Follow `run` (live or not), from its whole events file; the follower to read it with."""
        if self.phase is P.DETACHED:
            raise Refused(QUITTING)
        if self._child_live():
            raise Refused(HERE_GOING)
        if self.attached is not None and self.attached.path == run.path and self.training.active:
            raise Refused("")  # followed already
        self._look_away()
        self._move(P.ATTACHED)
        self.generation += 1
        self.child = None
        self.attached = run
        self.training = TrainingState(status="starting", run_dir=str(run.path), run_id=run.run_id, attached=True)
        self.follower = self._follower(run, lambda: self._live_process(run) is not None)
        return self.follower

    def stop(self) -> None:
        """SIGTERM to the run held (started here or attached to): it checkpoints and exits."""
        if self.phase is P.STOPPING:
            raise Refused("")  # asked already (or the run is stopping by itself)
        if not self.busy:
            raise Refused("no run is going: t starts one")
        if self.child is not None:
            self.child.stop_requested = True  # if the process is not started yet, the worker stops it
            self.child.stop()
        else:
            assert self.attached is not None
            known = self._live_process(self.attached)
            if known is None:
                raise Refused(f"run {self.attached.run_id} is not running any more")
            try:
                self._kill(known.pid, signal.SIGTERM)
            except OSError as exc:
                raise Refused(f"cannot stop run {self.attached.run_id} (pid {known.pid}): {exc.strerror or exc}",
                              "error") from None
            self.stop_asked = True
        self._move(P.STOPPING)
        self.training = replace(self.training, status="stopping")

    def detach(self) -> bool:
        """Quit, keeping the run started here: it goes on by itself. False if none is going."""
        child = self.child
        if child is None or not child.running or child.detached:
            return False
        child.detach()
        self._move(P.DETACHED)
        return True

    def leave(self) -> None:
        """At quit: stop following (a run attached to, or started here and kept, goes on)."""
        was_attached = self.attached is not None
        self._look_away()
        if was_attached:
            self._move(P.IDLE)
        if self.child is not None and self.child.detached and self.child.follower is not None:
            self.child.follower.stop()

    def _look_away(self) -> None:
        if self.follower is not None:
            self.follower.stop()
        self.follower = None
        self.attached = None
        self.stop_asked = False

    # -- what the run reports --------------------------------------------------------------------------
    def update(self, generation: int, state: TrainingState) -> bool:
        """The run's events folded (the first one moves starting to running); False if stale."""
        if generation != self.generation:
            return False
        if self.stop_requested and state.status == "running":
            state = replace(state, status="stopping")
        self.training = state
        self._observe(self._phase_of(state))
        return True

    def _phase_of(self, state: TrainingState) -> Phase:
        if state.status == "stopping":
            return P.STOPPING
        if not state.active:
            return P.ENDED
        if self.attached is not None:
            return P.ATTACHED
        return P.RUNNING if state.status == "running" else P.STARTING

    def exited(self, generation: int, code: int, error: str | None) -> list[Note] | None:
        """The child process ended (or could not start): how the run ended, and what to say; None if stale."""
        if generation != self.generation:
            return None
        notes: list[Note] = []
        stopped = self.child is not None and self.child.stop_requested
        said = self.training.status == "failed"  # its `error` event is in the log already
        if code == 0 and self.training.status == "starting" and error:
            # A resume of a run that is complete: the run said so and did nothing; show how it ended.
            run_dir = self.child.run_dir if self.child is not None else None
            ended = (TrainingState().replay(clean_tree(runs.read_events(Path(run_dir) / runs.EVENTS)))
                     if run_dir is not None else None)
            self.training = ended if ended is not None and ended.ended else (self.before_resume or TrainingState())
            notes.append((error, "warning"))
        else:
            self.training = self.training.exited(code, error if code else None, stopped)
        if self.training.status == "failed" and not said:
            notes.append((f"run failed (exit {code}): {self.training.error}", "error"))
        self._observe(P.ENDED)
        return notes

    def gone(self, generation: int) -> bool:
        """The run attached to has ended (its process is gone and its events are read)."""
        if generation != self.generation:
            return False
        self.training = self.training.gone()
        if self.training.status == "stopped" and not self.training.run_id:
            self.training = replace(self.training, reason="it wrote no events")
        self._observe(P.ENDED)
        return True
