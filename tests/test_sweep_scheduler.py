"""The sweep scheduler on simulated slots (gputui.sweep.sim): retries, failures, counting, the budget."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest

from gputui.sweep import scheduler as sched
from gputui.sweep import study as studies
from gputui.sweep.sim import SimSlot
from gputui.sweep.space import parse_text
from tests.sweep_support import Seen


def make(tmp_path: Path, trials: int, extra: str = "") -> tuple[Any, Any, Any]:
    text = f'[run]\nmodel = "fast"\n[sweep]\nname = "sim"\ntrials = {trials}\npruner = "none"\nlr = [1e-3, 1e-1]\n{extra}'
    profile, spec = parse_text(text, tmp_path / "sim.toml")
    return profile, spec, studies.create(spec)


def counted(study: Any) -> list[Any]:
    return [t for t in study.get_trials() if studies.counted(t)]


class OpensGate(Seen):
    """Opens slot b's gate once slot a's worker is ready again after its death."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    def sweep(self, kind: str, **fields: Any) -> None:
        super().sweep(kind, **fields)
        if len([f for f in self.of("slot") if f["slot"] == "a" and f["state"] == "ready"]) == 2:
            self.gate.set()


def test_a_trial_whose_worker_dies_runs_again_on_another_slot_and_counts_once(tmp_path: Path) -> None:
    # a dies in trial 3 and is ready again while b still trains its first trial (b's trials end
    # once a is back): the retry waits for b rather than going back to a
    gate = threading.Event()
    slots = [SimSlot("a", die_on={3}), SimSlot("b", gate=gate)]
    profile, spec, study = make(tmp_path, 8)
    view = OpensGate(gate)
    progress = sched.Scheduler(study, spec, profile.run, slots, view).run()
    assert progress.done == 8 and len(counted(study)) == 8 and len(study.get_trials()) == 8
    assert (3, 1) in slots[0].seen and (3, 2) in slots[1].seen, (slots[0].seen, slots[1].seen)
    second = "b"  # the retry went to the other slot
    trial = study.get_trials()[3]
    assert trial.state.name == "COMPLETE" and trial.user_attrs["attempts"] == 2 and trial.user_attrs["slot"] == second
    assert [f["trial"] for f in view.of("requeued")] == [3]
    assert all(s.closed for s in slots)


def test_a_trial_that_fails_twice_is_failed_with_its_error_and_the_sweep_goes_on(tmp_path: Path) -> None:
    slots = [SimSlot("a", fail_on={2}), SimSlot("b", fail_on={2})]
    profile, spec, study = make(tmp_path, 6)
    progress = sched.Scheduler(study, spec, profile.run, slots, Seen()).run()
    assert (progress.done, progress.failed, progress.complete) == (6, 1, 5)
    failed = study.get_trials()[2]
    assert failed.state.name == "FAIL" and failed.user_attrs["attempts"] == 2
    assert failed.user_attrs["error"] == "simulated failure of trial 2"
    assert len(counted(study)) == 6 and len(study.get_trials()) == 6


def test_with_a_budget_no_trial_starts_once_the_projected_spend_would_pass_it(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]

    def advance(seconds: float) -> None:
        now[0] += seconds

    monkeypatch.setattr(sched, "PRIOR_TRIAL_S", 1.0)
    # one slot at $3600/h ($1/s), trials of 1 s: a trial may start while spent + $1 <= $5.50
    slot = SimSlot("cloud", usd_per_hour=3600.0, advance=advance, trial_s=1.0)
    profile, spec, study = make(tmp_path, 20, "budget_usd = 5.5\n")
    view = Seen()
    s = sched.Scheduler(study, spec, profile.run, [slot], view, clock=lambda: now[0])
    progress = s.run()
    assert [n for n, _attempt in slot.seen] == [0, 1, 2, 3, 4]  # started at $0..$4; at $5 the next would pass
    assert progress.done == 5 and s.budget_reached and len(view.of("budget")) == 1
    assert progress.spent_usd == pytest.approx(5.0) and progress.spent_usd <= 5.5
    assert slot.closed
    assert len(counted(study)) == 5
    assert not [t for t in study.get_trials() if t.state.name == "RUNNING"]  # none left running


def test_min_time_to_accuracy_takes_the_training_time_of_the_first_evaluation_at_the_target(tmp_path: Path) -> None:
    from gputui.sweep.sim import accuracy

    profile, spec, study = make(tmp_path, 6, 'objective = "min time_to_accuracy"\ntarget = 85.0\n')
    sched.Scheduler(study, spec, profile.run, [SimSlot("a", evaluations=3)], Seen()).run()
    trials = study.get_trials()
    assert len(trials) == 6 and study.direction.name == "MINIMIZE"
    for t in trials:
        reached = [k for k in (1, 2, 3) if accuracy(t.params, k) >= 85.0]
        if reached:  # the sim's k-th evaluation is at 0.1 k s of training
            assert t.state.name == "COMPLETE" and t.value == pytest.approx(0.1 * reached[0]), t
        else:
            assert t.state.name == "FAIL" and t.user_attrs["error"] == "did not reach 85% test accuracy", t
    assert any(t.state.name == "COMPLETE" for t in trials)


def test_a_stopped_sweep_gives_its_held_trials_back_to_the_study_for_resume(tmp_path: Path) -> None:
    stop = threading.Event()
    gate = threading.Event()  # b's trials never end on their own: b holds a trial when the sweep stops

    class StopsAfterTwo(Seen):
        def sweep(self, kind: str, **fields: Any) -> None:
            super().sweep(kind, **fields)
            if len(self.of("trial_done")) == 2:
                stop.set()

    slots = [SimSlot("a"), SimSlot("b", gate=gate)]
    profile, spec, study = make(tmp_path, 10)
    view = StopsAfterTwo()
    progress = sched.Scheduler(study, spec, profile.run, slots, view, stop=stop).run()
    gate.set()
    trials = study.get_trials()
    held = [t for t in trials if t.user_attrs.get("requeued")]
    assert progress.done == 2 and len(counted(study)) == 2
    assert held and all(t.state.name == "FAIL" for t in held)  # b's trial at least
    assert not [t for t in trials if t.state.name == "RUNNING"]
    waiting = [t for t in trials if t.state.name == "WAITING"]  # enqueued again, same parameters
    assert sorted(t.user_attrs["requeued_from"] for t in waiting) == sorted(t.number for t in held)
    assert all(t.system_attrs["fixed_params"] == trials[t.user_attrs["requeued_from"]].params for t in waiting)
    assert all(s.closed for s in slots)


def test_off_a_terminal_the_progress_is_a_plain_line_per_change(capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.sweep.view import Lines, make_view

    assert isinstance(make_view(False, "test_accuracy"), Lines)  # pytest's stderr is not a terminal
    view = Lines("test_accuracy")
    p = sched.Progress(name="s", trials=12, done=5, complete=3, pruned=1, failed=1, running=2, best=97.125,
                       best_trial=4, spent_usd=0.0123)
    view.progress(p)
    view.progress(p)  # nothing changed: no second line
    view.sweep("trial_done", trial=6, state="pruned", slot="cpu-1", params={"lr": 0.0123, "batch_size": 64})
    err = capsys.readouterr().err.splitlines()
    assert err == ["s: 5/12 done, 2 running, 1 pruned, 1 failed, best 97.12% (#4), $0.0123 spent",
                   "trial 6 pruned on cpu-1 (lr=0.0123, batch_size=64)"]


def test_local_slots_are_trials_per_gpu_workers_on_each_gpu_or_the_cpu_cores(tmp_path: Path) -> None:
    from gputui.sweep.slots import local_slots

    profile, spec = parse_text('[run]\nmodel = "fast"\n[sweep]\nname = "x"\nlr = [1e-3, 1e-1]\ntrials_per_gpu = 2\n',
                               None)
    gpus = local_slots(spec, profile.run, tmp_path, gpus=2)
    assert [(s.name, s.device) for s in gpus] == [("cuda0-0", "cuda:0"), ("cuda0-1", "cuda:0"),
                                                  ("cuda1-2", "cuda:1"), ("cuda1-3", "cuda:1")]
    cpus = local_slots(spec, profile.run, tmp_path, workers=3, gpus=0)
    assert [s.device for s in cpus] == ["cpu"] * 3 and len({s.threads for s in cpus}) == 1
    # What is free shared out (gputui.train.threads), so at most the cores' share, at least one each.
    assert all(1 <= s.threads <= max(1, (os.cpu_count() or 1) // 3) for s in cpus)
    assert local_slots(spec, profile.run, tmp_path, workers=0, gpus=0) == []


def test_a_retry_that_evaluates_again_what_its_dead_attempt_reported_keeps_the_first_values(
        tmp_path: Path) -> None:
    """The retry reports epochs 1-2 again (its checkpoint was older, or it had none): the study
    keeps the first attempt's values, and Optuna is not asked twice (it warned "already reported"
    on the master's stderr for each)."""
    import warnings

    died: set[int] = set()  # shared: trial 0's first attempt dies on whichever slot has it, its retry does not
    slots = [SimSlot(name, die_on={0}, die_after=2, died=died) for name in ("a", "b")]
    profile, spec, study = make(tmp_path, 3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        progress = sched.Scheduler(study, spec, profile.run, slots, Seen()).run()
    assert progress.done == 3 and len(counted(study)) == 3 and died == {0}
    retried = study.get_trials()[0]
    assert retried.user_attrs["attempts"] == 2
    lr = retried.params["lr"]
    from gputui.sweep.sim import accuracy
    assert retried.intermediate_values == {0: accuracy({"lr": lr}, 1) - 1.0, 1: accuracy({"lr": lr}, 2) - 1.0,
                                           2: accuracy({"lr": lr}, 3)}
    assert not [w for w in caught if "already reported" in str(w.message)], [str(w.message) for w in caught]
