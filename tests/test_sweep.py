"""`gputui sweep`: Optuna's study on SQLite, long-lived local workers, pruning, faults, resume, bad input."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui import cli
from gputui.config.profile import load_profile
from tests.proc_support import Child, wait_until

WAIT = 240  # s: a whole sweep of a dozen tiny trials on a slow, busy 2-core machine


def profile(tmp_path: Path, data: Path, sweep: str, run: str = "", name: str = "s") -> Path:
    path = tmp_path / f"{name}.toml"
    path.write_text(f'[run]\nmodel = "fast"\ndevice = "cpu"\ndata = "{data}"\nepochs = 1\n{run}\n'
                    f'[sweep]\nthreads = 1\n{sweep}\n')
    return path


def sweep(*args: str) -> Child:
    return Child([sys.executable, "-m", "gputui", "sweep", "--json", *args], name="gputui sweep")


def lines(child: Child, kind: str) -> list[dict[str, Any]]:
    return [e for e in child.events if e.get("sweep") == kind]


def study(name: str) -> Any:
    import optuna

    path = Path(os.environ["GPUTUI_HOME"]) / "sweeps" / "sweeps.db"
    assert path.is_file(), f"no study file at {path}"
    return optuna.load_study(study_name=name, storage=f"sqlite:///{path}")


def counted(trials: list[Any]) -> list[Any]:
    from optuna.trial import TrialState

    return [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            and not t.user_attrs.get("requeued")]


def test_a_12_trial_sweep_over_2_workers_fills_the_sqlite_study(small_data: Path, tmp_path: Path) -> None:
    from optuna.trial import TrialState

    path = profile(tmp_path, small_data, "trials = 12\nworkers = 2\nlr = [1e-3, 3e-2]\nbatch_size = [32, 64]\n")
    with sweep(str(path)) as child:
        assert child.finish(WAIT) == 0, child.stderr
    done = study("s").get_trials()
    assert len(done) == 12 and len(counted(done)) == 12
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in done), \
        [(t.number, t.state, t.user_attrs) for t in done]
    assert {t.user_attrs["slot"] for t in done} == {"cpu-0", "cpu-1"}  # both workers trained
    assert len([e for e in lines(child, "slot") if e["state"] == "ready"]) == 2  # each started once, for 12 trials
    assert len(lines(child, "trial_done")) == 12
    end = lines(child, "end")[-1]
    assert (end["done"], end["complete"] + end["pruned"]) == (12, 12)
    # every trial is a run directory with its events
    home = Path(os.environ["GPUTUI_HOME"]) / "sweeps" / "s"
    assert sorted(p.name for p in home.glob("trial-*")) == [f"trial-{n:05d}" for n in range(12)]

    # show: the trials sorted by the objective, the best, importances; --run writes the best's profile
    shown = cli_json("sweep", "show", "s", "--json")
    assert len(shown["trial_rows"]) == 12
    values = [r["value"] for r in shown["trial_rows"] if r["state"] == "complete"]
    assert values == sorted(values, reverse=True) and len(values) >= 2
    assert shown["best"]["value"] == values[0] and set(shown["importances"]) == {"lr", "batch_size"}
    best_file = tmp_path / "best.toml"
    assert cli.main(["sweep", "show", "s", "--run", str(best_file)]) == 0
    run = load_profile(best_file).run
    assert (run.lr, run.batch_size, run.model, run.epochs) == (shown["best"]["params"]["lr"],
                                                               shown["best"]["params"]["batch_size"], "fast", 1)


def cli_json(*argv: str) -> Any:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return json.loads(out.getvalue())


def test_the_median_pruner_prunes_a_trial_with_an_absurd_learning_rate(medium_data: Path, tmp_path: Path) -> None:
    from optuna.trial import TrialState

    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    path = profile(tmp_path, medium_data, "trials = 3\nworkers = 1\npruner_startup = 2\npruner_warmup = 0\n"
                   "lr = [1e-3, 10.0]\nepochs = [1, 3]\n")
    # The study is made as `gputui sweep` makes it; its first trials are enqueued (Optuna's way to ask
    # for given parameters): two sound ones, then lr = 5 with three epochs (time to prune it).
    _profile, spec = load_spec(path)
    made = studies.create(spec)
    made.enqueue_trial({"lr": 0.01, "epochs": 1})
    made.enqueue_trial({"lr": 0.01, "epochs": 1})
    made.enqueue_trial({"lr": 5.0, "epochs": 3})
    with sweep("--resume", "s") as child:
        assert child.finish(WAIT) == 0, child.stderr
    trials = study("s").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED], \
        [(t.number, t.state, t.intermediate_values) for t in trials]
    absurd = trials[2]
    assert absurd.params["lr"] == 5.0 and len(absurd.intermediate_values) < 12  # pruned early in 3 epochs x 4
    last = json.loads((Path(os.environ["GPUTUI_HOME"]) / "sweeps" / "s" / "trial-00002" / "events.jsonl")
                      .read_text().splitlines()[-1])
    assert last["event"] == "interrupted" and last["reason"] == "pruned"


def test_a_worker_killed_mid_trial_gives_the_trial_to_the_other_slot(medium_data: Path, tmp_path: Path) -> None:
    path = profile(tmp_path, medium_data, "trials = 12\nworkers = 2\npruner = \"none\"\nlr = [1e-3, 3e-2]\n")
    with sweep(str(path)) as child:
        pids: dict[str, int] = {}

        def step_of_a_warm_worker(e: dict[str, Any]) -> bool:
            if e.get("sweep") == "slot" and e.get("state") == "ready":
                pids[e["slot"]] = e["pid"]
            return (e.get("sweep") == "run" and e["trial"] >= 2 and e["data"]["event"] == "step"
                    and e["data"]["step"] <= 8)

        hit = child.wait_for(step_of_a_warm_worker, WAIT, "an early step of trial 2 or later")
        victim, slot = hit["trial"], hit["slot"]
        os.kill(pids[slot], signal.SIGKILL)
        assert child.finish(WAIT) == 0, child.stderr
    requeued = [e for e in lines(child, "requeued") if e["trial"] == victim]
    assert len(requeued) == 1 and requeued[0]["slot"] == slot
    runs_of_victim = [e for e in lines(child, "trial") if e["trial"] == victim]
    assert [e["attempt"] for e in runs_of_victim] == [1, 2]
    assert runs_of_victim[1]["slot"] != slot  # another slot ran it again
    trials = study("s").get_trials()
    assert len(trials) == 12 and len(counted(trials)) == 12  # none lost, none twice
    again = trials[victim]
    assert again.state.name == "COMPLETE" and again.user_attrs["attempts"] == 2 and again.user_attrs["slot"] != slot
    assert [e["state"] for e in lines(child, "slot") if e["slot"] == slot].count("ready") == 2  # started again


def test_a_master_killed_mid_sweep_resumes_to_exactly_the_trials_asked(small_data: Path, tmp_path: Path) -> None:
    path = profile(tmp_path, small_data, "trials = 12\nworkers = 2\nlr = [1e-3, 3e-2]\nbatch_size = [32, 64]\n")
    with sweep(str(path)) as child:
        pids: list[int] = []

        def step_after_three_done(e: dict[str, Any]) -> bool:
            if e.get("sweep") == "slot" and e.get("state") == "ready":
                pids.append(e["pid"])
            return len(lines(child, "trial_done")) >= 3 and e.get("sweep") == "run" and e["data"]["event"] == "step"

        hit = child.wait_for(step_after_three_done, WAIT, "a step after three trials are done")
        child.proc.send_signal(signal.SIGKILL)  # trial hit["trial"] is RUNNING in the study now
        child.finish(WAIT)
    wait_until(lambda: not any(alive(pid) for pid in pids), 60, "the workers to end with their master")
    before = study("s").get_trials()
    assert before[hit["trial"]].state.name == "RUNNING"

    with sweep("--resume", "s") as again:
        assert again.finish(WAIT) == 0, again.stderr
    trials = study("s").get_trials()
    requeued = [t for t in trials if t.user_attrs.get("requeued")]
    assert hit["trial"] in [t.number for t in requeued]
    assert all(t.state.name == "FAIL" for t in requeued)
    assert len(counted(trials)) == 12  # exactly the trials asked, the requeued records aside
    for old in requeued:  # each one ran again once, with its parameters
        redo = [t for t in trials if t.user_attrs.get("requeued_from") == old.number]
        assert len(redo) == 1 and redo[0].params == old.params and redo[0] in counted(trials)
    assert lines(again, "start")[0]["requeued"] == [t.number for t in requeued]


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not alive
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("sweep_text, run_text, message", [
    ("lr = [0.01, 0.01]\n", "", "[sweep] lr: expected [low, high] with low < high: [0.01, 0.01] is an empty range"),
    ("lr = [0.1, 0.001]\n", "", "[sweep] lr: expected [low, high] with low < high: [0.1, 0.001] is inverted"),
    ("batch_size = []\n", "", "[sweep] batch_size: expected at least one choice"),
    ("lr = [0.001, 0.1]\nlearning_rate = [0.001, 0.1]\n", "", "[sweep] learning_rate: unknown key"),
    ("lr = [0.001, 0.1]\n", "evals_per_epoch = 1\n", "[sweep] pruner median: every trial evaluates once"),
    ("lr = [0.001, 0.1]\nworkers = 0\n", "", "no slot to run trials on"),
    ("workers = 2\n", "", "[sweep] has no search space"),
    ("lr = [0.001, 0.1]\nobjective = \"min time_to_accuracy\"\n", "", "needs `target`"),
])
def test_bad_input_exits_2_with_one_line_and_starts_nothing(tmp_path: Path, small_data: Path, sweep_text: str,
                                                             run_text: str, message: str,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = profile(tmp_path, small_data, sweep_text, run_text)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (Path(os.environ["GPUTUI_HOME"]) / "sweeps").exists()  # no study, no worker


def test_show_of_a_sweep_with_one_complete_trial_has_no_importances_yet(small_data: Path, tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    _profile, spec = load_spec(profile(tmp_path, small_data, "trials = 4\nlr = [1e-3, 1e-1]\n"))
    made = studies.create(spec)
    trial = made.ask()
    trial.suggest_float("lr", 1e-3, 1e-1, log=True)
    made.tell(trial, 91.5)
    assert cli.main(["sweep", "show", "s"]) == 0
    out = capsys.readouterr()
    assert "importances need 2 complete trials or more (1 so far)" in out.err
    assert "91.50%" in out.out
    assert cli.main(["sweep", "show", "nope"]) == 2
    assert "no such sweep" in capsys.readouterr().err
