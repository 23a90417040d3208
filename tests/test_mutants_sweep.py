"""A sweep's trial states in process: a dead master's running trials requeued (study.requeue_running,
study.counted, reader.state_name), the best-so-far curve (reader.best_so_far) and the order of
`sweep show`'s rows (show.trial_rows). Written to kill what benchmarks/mutation.py showed untested;
an in-memory Optuna study, no process."""

from __future__ import annotations

from typing import Any

import pytest

from gputui.sweep.reader import SweepData, TrialRow, best_so_far, state_name
from gputui.sweep.show import trial_rows
from gputui.sweep.study import REQUEUED, REQUEUED_FROM, counted, requeue_running


def row(number: int, state: str = "complete", value: float | None = None, started: float | None = None,
        ended: float | None = None, attempts: int | None = None) -> TrialRow:
    return TrialRow(number=number, state=state, value=value, params=(("lr", 0.1 * (number + 1)),), slot="s0",
                    started=started, ended=ended, evaluations=2, attempts=attempts, error=None, requeued_from=None)


def data(direction: str, *rows: TrialRow) -> SweepData:
    return SweepData(name="s", storage="mem", direction=direction, objective="max test_accuracy", trials_wanted=None,
                     rows=rows, best=(), best_trial=None, started=None)


# -- requeue_running, counted, state_name ---------------------------------------------------------------

@pytest.fixture
def study() -> Any:
    optuna = pytest.importorskip("optuna")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(direction="maximize")


def test_a_dead_masters_running_trials_become_requeued_records_and_are_asked_again(study: Any) -> None:
    from optuna.distributions import FloatDistribution
    from optuna.trial import TrialState

    dist = {"lr": FloatDistribution(0.0, 1.0)}
    done = study.ask(dist)
    study.tell(done, 0.5)
    left = [study.ask(dist) for _ in range(2)]
    params = [dict(t.params) for t in left]

    assert requeue_running(study) == [1, 2]

    trials = study.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.FAIL,
                                        TrialState.WAITING, TrialState.WAITING]
    assert [state_name(t) for t in trials] == ["complete", "requeued", "requeued", "waiting", "waiting"]
    assert [t.user_attrs for t in trials[1:3]] == [{REQUEUED: True}, {REQUEUED: True}]
    assert [t.user_attrs for t in trials[3:]] == [{REQUEUED_FROM: 1}, {REQUEUED_FROM: 2}]
    asked = [study.ask(dist) for _ in range(2)]  # the next trials asked are the requeued ones, in order
    assert [t.params for t in asked] == params and [t.number for t in asked] == [3, 4]
    assert [t.user_attrs for t in asked] == [{REQUEUED_FROM: 1}, {REQUEUED_FROM: 2}]
    assert [counted(t) for t in trials] == [True, False, False, False, False]
    for t in asked:
        study.tell(t, 0.1)
    assert requeue_running(study) == []  # nothing left running


def test_a_failed_or_pruned_trial_counts_and_is_named_by_its_state(study: Any) -> None:
    from optuna.trial import TrialState

    failed, pruned, running = study.ask(), study.ask(), study.ask()
    study.tell(failed, state=TrialState.FAIL)
    study.tell(pruned, state=TrialState.PRUNED)
    trials = study.get_trials()
    assert [state_name(t) for t in trials] == ["fail", "pruned", "running"]
    assert [counted(t) for t in trials] == [True, True, False]
    assert running.number == 2


# -- best_so_far -----------------------------------------------------------------------------------------

def test_no_curve_before_any_trial_started() -> None:
    assert best_so_far((), "maximize") == ((), None)
    assert best_so_far((row(0, "waiting"), row(1, "waiting")), "maximize") == ((), None)


def test_the_best_of_the_complete_trials_in_the_order_they_ended_from_the_first_start() -> None:
    rows = (row(0, value=0.5, started=100.0, ended=110.0),
            row(1, value=0.7, started=101.0, ended=130.0),
            row(2, value=0.6, started=105.0, ended=120.0),
            row(3, value=0.7, started=106.0, ended=140.0),  # equal to the best: the earlier trial stays best
            row(4, "pruned", value=0.9, started=102.0, ended=115.0),  # not complete: not on the curve
            row(5, value=None, started=103.0, ended=116.0),  # no value
            row(6, value=0.95, started=104.0, ended=None),  # not ended
            row(7, "running", started=None, ended=None))
    assert best_so_far(rows, "maximize") == (((10.0, 0.5), (20.0, 0.6), (30.0, 0.7), (40.0, 0.7)), 1)
    assert best_so_far(rows, "minimize") == (((10.0, 0.5), (20.0, 0.5), (30.0, 0.5), (40.0, 0.5)), 0)


def test_a_lower_value_is_better_when_minimizing_and_ties_keep_the_first() -> None:
    rows = (row(0, value=3.0, started=50.0, ended=60.0), row(1, value=2.0, started=51.0, ended=70.0),
            row(2, value=2.0, started=52.0, ended=80.0))
    assert best_so_far(rows, "minimize") == (((10.0, 3.0), (20.0, 2.0), (30.0, 2.0)), 1)


def test_trials_that_ended_together_are_taken_by_number() -> None:
    rows = (row(1, value=0.4, started=0.0, ended=5.0), row(0, value=0.4, started=1.0, ended=5.0))
    assert best_so_far(rows, "maximize") == (((5.0, 0.4), (5.0, 0.4)), 0)


def test_started_trials_with_none_complete_have_no_best() -> None:
    assert best_so_far((row(0, "running", started=10.0),), "maximize") == ((), None)


# -- trial_rows --------------------------------------------------------------------------------------

def test_a_trial_row_names_every_field() -> None:
    shown = trial_rows(data("maximize", row(0, value=0.5, started=1.0, ended=4.0, attempts=2)))
    assert shown == [{"number": 0, "state": "complete", "value": 0.5, "params": {"lr": 0.1}, "evaluations": 2,
                      "duration_s": 3.0, "slot": "s0", "attempts": 2, "error": None, "requeued_from": None}]


def test_complete_trials_come_best_first_then_the_rest_by_number() -> None:
    rows = (row(0, "fail"), row(1, value=0.2), row(2, "pruned", value=0.9), row(3, value=0.8), row(4, value=0.2),
            row(5, "complete", value=None), row(6, value=-0.5), row(7, "running"))
    assert [r["number"] for r in trial_rows(data("maximize", *rows))] == [3, 1, 4, 6, 0, 2, 5, 7]
    assert [r["number"] for r in trial_rows(data("minimize", *rows))] == [6, 1, 4, 3, 0, 2, 5, 7]


def test_values_of_any_size_sort_by_value_not_by_their_inverse() -> None:
    rows = (row(0, value=4.0), row(1, value=0.5), row(2, value=2.0))
    assert [r["number"] for r in trial_rows(data("minimize", *rows))] == [1, 2, 0]
    assert [r["number"] for r in trial_rows(data("maximize", *rows))] == [0, 2, 1]
