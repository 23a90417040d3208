"""The budget guard's two messages, word for word: the warning (share, budget, spent) and the
stop (budget, spent, committed, how many slaves), with money shown to the cent for the budget
and to 1/100 of a cent for what was spent or committed. Written to kill what
benchmarks/mutation.py showed untested; the simulated cloud, in process."""

from __future__ import annotations

from pathlib import Path

from gputui.cloud.budget import BudgetGuard
from gputui.model.cloud import BudgetStatus

from .test_cloud_budget import bring_up, make_context


def test_the_warning_says_the_share_the_budget_and_what_was_spent(tmp_path: Path) -> None:
    ctx, _clock = make_context(tmp_path, budget=100.0)
    bring_up(ctx, 1)
    guard = BudgetGuard(ctx, 60.0)
    guard.status = lambda now=None, extra_committed=0.0: BudgetStatus(0.5, 0.00012, 0.42)  # type: ignore[method-assign]
    (event,) = guard.check()
    assert (event.kind, event.message) == ("budget_warning",
                                           "84% of the $0.50 budget spent or committed ($0.0001 spent)")
    assert guard.check() == []  # said once


def test_the_stop_says_the_budget_what_was_spent_and_committed_and_the_slaves(tmp_path: Path) -> None:
    ctx, _clock = make_context(tmp_path, budget=100.0)
    bring_up(ctx, 1)
    guard = BudgetGuard(ctx, 60.0)
    events = guard.trip(BudgetStatus(0.5, 0.00012, 0.00034), guard.running())
    assert [(e.kind, e.message) for e in events] == [
        ("budget_stop", "budget $0.50 reached ($0.0001 spent + $0.0003 committed): checkpointing runs, "
                        "terminating 1 slave")]
    assert guard.running() == []
