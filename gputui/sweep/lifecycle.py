"""A sweep trial's lifecycle, as the master holds it: one state per trial, its moves in one table.

    asked ──start──> running ──stop──> stopping
    pending ─start─┘    │  └──────┬──────┘
       ^                │ retry   │ finish
       └────────────────┴─────────┤
                                  v
                               finished ──tell──> told
    asked, pending, running, stopping ──give back (the sweep stopped first)──> given_back

`asked`: the study gave it ahead of need, no worker yet. `pending`: a retry waiting for a slot
(a worker died under it, or it erred, with attempts left). `running`: on a worker. `stopping`:
on a worker that was told to stop it (pruned, or the target reached). `finished`: its outcome is
known, told to the study after the next dispatch (the freed worker gets its next trial first).
`told`: the study has its end. `given_back`: the sweep stopped first; failed in the study and
enqueued again for `--resume`. Told and given back trials are no longer held.

`Trials` is the one place a state changes: a move the table does not allow raises
TrialStateError (a bug in the master, never a user's error).
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, Iterator


class TrialState(enum.Enum):
    ASKED = "asked"
    PENDING = "pending"
    RUNNING = "running"
    STOPPING = "stopping"
    FINISHED = "finished"
    TOLD = "told"
    GIVEN_BACK = "given_back"


S = TrialState
MOVES: dict[TrialState, frozenset[TrialState]] = {
    S.ASKED: frozenset({S.RUNNING, S.GIVEN_BACK}),
    S.PENDING: frozenset({S.RUNNING, S.GIVEN_BACK}),
    S.RUNNING: frozenset({S.STOPPING, S.PENDING, S.FINISHED, S.GIVEN_BACK}),
    S.STOPPING: frozenset({S.PENDING, S.FINISHED, S.GIVEN_BACK}),
    S.FINISHED: frozenset({S.TOLD}),
    S.TOLD: frozenset(),
    S.GIVEN_BACK: frozenset(),
}
ON_WORKER = (S.RUNNING, S.STOPPING)
HELD = (S.ASKED, S.PENDING, S.RUNNING, S.STOPPING, S.FINISHED)  # what the master still answers for


class TrialStateError(RuntimeError):
    """A move the lifecycle does not allow (the master's bug)."""


@dataclass(frozen=True)
class Outcome:
    """How a finished trial ended, to be told: complete (with its value), pruned or fail."""

    state: str
    value: float | None = None
    error: str | None = None
    slot: str | None = None


@dataclass(eq=False)  # a trial is itself: two with the same fields are still two
class Trial:
    """A trial the master holds. Its `state` changes only through `Trials.move`."""

    number: int
    handle: Any  # the optuna Trial (ask-and-tell)
    params: dict[str, Any]
    profile: str  # the resolved run profile (TOML) the worker trains
    attempt: int = 1
    avoid: str | None = None  # the slot it last failed on
    errors: list[str] = field(default_factory=list)
    stop_reason: str | None = None  # "pruned" or "target" once a stop was sent (state stopping)
    reached_s: float | None = None  # min time_to_accuracy: training seconds at the target
    last_step: int = -1  # the last step told to the study (a retry's repeats are not: Optuna keeps the first)
    started: float = 0.0
    orphaned: bool = False  # the study says it is finished already: nothing more is written to it
    state: TrialState = TrialState.ASKED
    outcome: Outcome | None = None  # set when finished
    entered: int = 0  # when it entered its state (a counter): the order of a state's queue


class Trials:
    """Every trial the master holds, each in one state; the queues are views by state."""

    def __init__(self) -> None:
        self._held: list[Trial] = []
        self._clock = itertools.count(1)

    def add(self, trial: Trial) -> Trial:
        """A trial just asked from the study."""
        if trial.state is not S.ASKED or trial in self._held:
            raise TrialStateError(f"trial {trial.number}: a new trial is asked, not {trial.state.value}")
        trial.entered = next(self._clock)
        self._held.append(trial)
        return trial

    def move(self, trial: Trial, to: TrialState) -> None:
        """Move `trial` to `to`, if the lifecycle allows it from where it is (TrialStateError if not)."""
        if trial not in self._held:
            raise TrialStateError(f"trial {trial.number} is not held ({trial.state.value}): cannot go {to.value}")
        if to not in MOVES[trial.state]:
            raise TrialStateError(f"trial {trial.number}: {trial.state.value} cannot go {to.value}")
        trial.state = to
        trial.entered = next(self._clock)
        if to not in HELD:
            self._held.remove(trial)

    # -- the moves, by what happened ---------------------------------------------------------
    def start(self, trial: Trial) -> None:
        """On a worker now (asked, or a retry)."""
        self.move(trial, S.RUNNING)
        trial.stop_reason = None

    def stop(self, trial: Trial, reason: str) -> None:
        """A stop was sent to its worker (pruned, target)."""
        self.move(trial, S.STOPPING)
        trial.stop_reason = reason

    def requeue(self, trial: Trial, slot: str) -> None:
        """It failed on `slot` with attempts left: waits for a slot (another one, preferably)."""
        self.move(trial, S.PENDING)
        trial.attempt += 1
        trial.avoid = slot

    def finish(self, trial: Trial, outcome: Outcome) -> None:
        """Its outcome is known; told after the next dispatch."""
        self.move(trial, S.FINISHED)
        trial.outcome = outcome

    def told(self, trial: Trial) -> Outcome:
        """Its outcome goes to the study now."""
        self.move(trial, S.TOLD)
        assert trial.outcome is not None
        return trial.outcome

    def give_back(self, trial: Trial) -> None:
        """The sweep stopped before it finished."""
        self.move(trial, S.GIVEN_BACK)

    # -- queues ---------------------------------------------------------------------------------
    def queue(self, *states: TrialState) -> list[Trial]:
        """The trials in these states, in the order they entered them (oldest first)."""
        return sorted((t for t in self._held if t.state in states), key=lambda t: t.entered)

    def count(self, *states: TrialState) -> int:
        return sum(1 for t in self._held if t.state in states)

    def __iter__(self) -> Iterator[Trial]:
        return iter(list(self._held))

    def __len__(self) -> int:
        return len(self._held)
