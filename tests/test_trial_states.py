"""A sweep trial's lifecycle as plain Python: every move the master makes is allowed, every other
one is refused, and each move leaves the trial where the scheduler expects it."""

from __future__ import annotations

from typing import Callable

import pytest

from gputui.sweep.lifecycle import MOVES, Outcome, Trial, Trials, TrialState, TrialStateError

S = TrialState

# What the scheduler does (gputui.sweep.scheduler), written out once more: the table must say the same.
EXPECTED = {
    S.ASKED: {S.RUNNING, S.GIVEN_BACK},  # a worker takes it; the sweep stops first
    S.PENDING: {S.RUNNING, S.GIVEN_BACK},
    S.RUNNING: {S.STOPPING, S.PENDING, S.FINISHED, S.GIVEN_BACK},  # pruned/target; died or erred; a result
    S.STOPPING: {S.PENDING, S.FINISHED, S.GIVEN_BACK},
    S.FINISHED: {S.TOLD},
    S.TOLD: set(),
    S.GIVEN_BACK: set(),
}


def trial(number: int = 0) -> Trial:
    return Trial(number=number, handle=None, params={"lr": 0.1}, profile="")


def held_at(state: TrialState) -> tuple[Trials, Trial]:
    """A trial brought to `state` by legal moves only."""
    trials = Trials()
    t = trials.add(trial())
    path = {S.ASKED: [], S.RUNNING: [S.RUNNING], S.STOPPING: [S.RUNNING, S.STOPPING],
            S.PENDING: [S.RUNNING, S.PENDING], S.FINISHED: [S.RUNNING, S.FINISHED],
            S.TOLD: [S.RUNNING, S.FINISHED, S.TOLD], S.GIVEN_BACK: [S.GIVEN_BACK]}[state]
    for step in path:
        trials.move(t, step)
    assert t.state is state
    return trials, t


def test_the_table_is_what_the_scheduler_does() -> None:
    assert {k: set(v) for k, v in MOVES.items()} == EXPECTED


@pytest.mark.parametrize("start", list(TrialState), ids=lambda s: s.value)
def test_every_legal_move_is_made_and_every_other_is_refused(start: TrialState) -> None:
    for to in TrialState:
        trials, t = held_at(start)
        if to in EXPECTED[start]:
            trials.move(t, to)
            assert t.state is to
            assert (t in trials) == (to not in (S.TOLD, S.GIVEN_BACK)), "told or given back: no longer held"
        else:
            with pytest.raises(TrialStateError):
                trials.move(t, to)
            assert t.state is start


def test_a_trial_not_held_cannot_move_and_a_new_one_is_asked() -> None:
    trials = Trials()
    with pytest.raises(TrialStateError, match="not held"):
        trials.move(trial(), S.RUNNING)
    t = trials.add(trial())
    with pytest.raises(TrialStateError):
        trials.add(t)  # held already
    done = trial(1)
    done.state = S.RUNNING
    with pytest.raises(TrialStateError, match="is asked"):
        trials.add(done)


def test_the_moves_by_what_happened_carry_their_facts() -> None:
    trials, t = held_at(S.ASKED)
    trials.start(t)
    trials.stop(t, "pruned")
    assert t.state is S.STOPPING and t.stop_reason == "pruned"
    trials.requeue(t, "gpu0")  # its worker died while it stopped
    assert (t.state, t.attempt, t.avoid) == (S.PENDING, 2, "gpu0")
    trials.start(t)
    assert t.state is S.RUNNING and t.stop_reason is None  # a new attempt starts unstopped
    trials.finish(t, Outcome("complete", 93.5, slot="gpu1"))
    assert len(trials) == 1  # finished, not told yet: still in flight (the budget and the count see it)
    assert trials.told(t) == Outcome("complete", 93.5, slot="gpu1") and t.state is S.TOLD and len(trials) == 0


def test_each_queue_is_in_the_order_its_trials_entered_it() -> None:
    trials = Trials()
    a, b, c = (trials.add(trial(n)) for n in range(3))
    assert trials.queue(S.ASKED) == [a, b, c]
    trials.start(a)
    trials.start(b)
    trials.requeue(b, "s0")
    trials.requeue(a, "s1")
    assert trials.queue(S.PENDING) == [b, a]  # the scheduler takes the newest retry first
    assert trials.count(S.PENDING, S.ASKED) == 3 and trials.queue(S.RUNNING) == []
    trials.give_back(c)
    assert list(trials) == [a, b]


@pytest.mark.parametrize("move", [
    lambda ts, t: ts.stop(t, "target"),
    lambda ts, t: ts.finish(t, Outcome("fail")),
    lambda ts, t: ts.requeue(t, "s0"),
    lambda ts, t: ts.told(t),
], ids=["stop", "finish", "requeue", "told"])
def test_a_trial_no_worker_runs_is_not_stopped_finished_requeued_or_told(
        move: Callable[[Trials, Trial], object]) -> None:
    trials, t = held_at(S.ASKED)
    with pytest.raises(TrialStateError, match="asked cannot go"):
        move(trials, t)
    assert t.state is S.ASKED and t.attempt == 1 and t.outcome is None
