"""Sweeps of the user's own program (issue 31): [sweep.params] into `{name}` and report.trial(), the
objective read from `metrics` events, the pruner stopping a program, `sweep show`."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui import cli
from gputui.config.sweep import Param
from gputui.model.errors import UserError
from tests.conftest import json_lines, run_cli
from tests.proc_support import Child

WAIT = 240  # s: a whole sweep of tiny program trials on a slow, busy 2-core machine

# Finds its stdin empty (not the worker's, which is its master's), reads its lr from argv (the `{lr}`
# of the command), checks report.trial() gives the same (with the fixed `tag` of the profile's
# [run] trial), and reports val_acc from lr alone (best at lr = 1e-2): a peak at step 0 (the first
# report is a metrics event at once), then lower, ending on the value the trial is rated by (the
# last, not the best).
PROGRAM = '''\
import math, os, select, sys
from gputui import report
ready, _, _ = select.select([0], [], [], 5)  # its stdin is empty: the worker's own is its master's
if not ready or os.read(0, 1) != b"":
    sys.exit("the trial's stdin is not empty: it is the worker's")
lr = float(sys.argv[sys.argv.index("--lr") + 1])
if report.trial() != {"lr": lr, "tag": "fixed"}:  # and the profile's [run] trial under the study's choice
    sys.exit(f"report.trial() is {report.trial()}, argv says lr = {lr!r}")
print(f"lr={lr!r} pid={os.getpid()}", flush=True)
value = 1 - abs(math.log10(lr) + 2) / 10
for step, val_acc in enumerate((value + 0.05, value - 0.01, value)):
    report.log(step=step, loss=1.0 / (step + 1), val_acc=round(val_acc, 6))
'''

# lr > 1e-2 reports 4 good steps and ends; a smaller lr reports one poor value, then waits for
# report.should_stop() (SIGTERM is only noted: the stop file must say it), bounded by 120 s. It
# exits once the SIGTERM came too: one coming as it exits would end it by its default (143).
PRUNED = '''\
import signal, sys, threading, time
from gputui import report
got = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: got.set())
lr = float(sys.argv[1])
if lr > 1e-2:
    for step in range(4):
        report.log(step=step, val_acc=0.9 + 0.01 * step)
    sys.exit(0)
report.log(step=0, val_acc=0.1)
deadline = time.monotonic() + 120
while not report.should_stop():
    if time.monotonic() > deadline:
        sys.exit("never asked to stop")
    time.sleep(0.02)
print("should_stop: saving and exiting", flush=True)
if not got.wait(120):  # woken by the signal's handler itself; the bound only fails the test
    sys.exit("never sent SIGTERM")
'''


def expected_value(lr: float) -> float:
    return round(1 - abs(math.log10(lr) + 2) / 10, 6)  # the program's last val_acc


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def sweep_home(name: str) -> Path:
    return Path(os.environ["GPUTUI_HOME"]) / "sweeps" / name


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def cli_json(*argv: str) -> Any:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return json.loads(out.getvalue())


def test_a_4_trial_sweep_over_2_cpu_workers_puts_lr_in_the_command_and_rates_trials_by_the_reported_metric(
        tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    write(tmp_path, "train.py", PROGRAM)
    profile = write(tmp_path, "s.toml", '[run]\ncommand = ["python", "train.py", "--lr", "{lr}"]\ndevice = "cpu"\n'
                    'trial = {tag = "fixed", lr = 1.0}\n\n'
                    '[sweep]\ntrials = 4\nworkers = 2\nthreads = 1\nobjective = "val_acc"\ndirection = "maximize"\n'
                    'pruner = "none"\n\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n')
    head = commit_all(tmp_path)  # the code under git: each trial's start says which commit it ran
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", str(profile)], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    db = Path(os.environ["GPUTUI_HOME"]) / "sweeps" / "sweeps.db"
    trials = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4, [(t.number, t.state, t.user_attrs) for t in trials]
    assert {t.user_attrs["slot"] for t in trials} == {"cpu-0", "cpu-1"}
    pids = set()
    for t in trials:
        lr = t.params["lr"]
        run = sweep_home("s") / f"trial-{t.number:05d}"
        said = (run / "output.log").read_text().split()
        assert said[0] == f"lr={lr!r}", (t.number, said)  # its own lr, from argv, as report.trial() gave it
        pids.add(said[1])
        start = events(run / "events.jsonl")[0]
        assert start["event"] == "start" and start["program"] == f"python train.py --lr {lr!r}"
        assert start["objective"] == "val_acc" and start["direction"] == "maximize"
        assert (start["git_commit"], start["git_dirty"]) == (head, False)  # the master's read, given to the trial
        assert t.value == expected_value(lr)  # the last reported val_acc, not the best
        assert t.intermediate_values[0] == round(expected_value(lr) + 0.05, 6)  # the pruner saw the peak
    assert len(pids) == 4  # each trial a fresh process

    shown = cli_json("sweep", "show", "s", "--json")
    assert (shown["objective"], shown["direction"], shown["finished"], shown["trials"]) == ("val_acc", "maximize", 4, 4)
    rows = shown["trial_rows"]
    assert [r["state"] for r in rows] == ["complete"] * 4
    assert [r["value"] for r in rows] == sorted((expected_value(t.params["lr"]) for t in trials), reverse=True)
    assert shown["best"]["value"] == rows[0]["value"]

    best = tmp_path / "best.toml"
    assert cli.main(["sweep", "show", "s", "--run", str(best)]) == 0
    from gputui.config.profile import load_profile

    again = load_profile(best).run
    assert again.command == ("python", "train.py", "--lr", repr(shown["best"]["params"]["lr"]))
    assert again.trial == (("lr", shown["best"]["params"]["lr"]), ("tag", "fixed")) and again.objective == "val_acc"
    # trained again, the program gets the best trial's lr in argv and in report.trial() (it exits 1 otherwise)
    done = run_cli("run", "--json", "--profile", str(best))
    assert done.returncode == 0, done.stderr
    assert json_lines(done.stdout)[-1]["event"] == "done"


def commit_all(repo: Path) -> str:
    """`git init` and commit everything in `repo`; its HEAD."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=t", "-c", "user.email=t@example.org", "commit",
                                                 "-q", "-m", "code"]):
        subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, env=env, timeout=60)
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True, env=env,
                          text=True, timeout=60).stdout.strip()


def test_a_program_trial_reporting_a_poor_value_is_pruned_sees_should_stop_and_ends_interrupted(
        tmp_path: Path) -> None:
    from optuna.trial import TrialState

    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    write(tmp_path, "train.py", PRUNED)
    profile = write(tmp_path, "p.toml", '[run]\ncommand = ["python", "train.py", "{lr}"]\ndevice = "cpu"\n'
                    'objective = "val_acc"\n\n[sweep]\ntrials = 3\nworkers = 1\nthreads = 1\npruner_startup = 2\n'
                    'pruner_warmup = 0\n\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n')
    _profile, spec = load_spec(profile)  # the objective comes from [run]
    made = studies.create(spec)
    for lr in (0.05, 0.05, 1e-4):  # two sound trials, then a poor one (one worker: in this order)
        made.enqueue_trial({"lr": lr})
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", "--resume", "p"], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    trials = made.get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.COMPLETE, TrialState.PRUNED], \
        [(t.number, t.state, t.intermediate_values, t.user_attrs) for t in trials]
    assert [t.value for t in trials[:2]] == [0.93, 0.93]
    run = sweep_home("p") / "trial-00002"
    assert "should_stop: saving and exiting" in (run / "output.log").read_text()
    last = events(run / "events.jsonl")[-1]
    assert (last["event"], last["reason"], last["exit_code"]) == ("interrupted", "pruned", 0)


# -- the profile --------------------------------------------------------------------------------

def program_profile(sweep: str, run: str = "") -> str:
    return f'[run]\ncommand = ["python", "train.py", "--lr", "{{lr}}"]\n{run}\n[sweep]\n{sweep}\n'


def test_sweep_params_take_ranges_log_ranges_whole_numbers_and_choices() -> None:
    from gputui.sweep.space import parse_text

    _p, spec = parse_text(program_profile(
        'objective = "loss"\ndirection = "minimize"\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n'
        'dropout = [0.1, 0.5]\nlayers = {low = 2, high = 8}\nwidth = [32, 64, 128]\nact = ["relu", "gelu"]\n'
        'pair = {choices = [0.1, 0.5]}\n'), Path("/x/s.toml"))
    assert spec.params == (Param("lr", "float", 1e-4, 1e-1, True), Param("dropout", "float", 0.1, 0.5),
                           Param("layers", "int", 2, 8), Param("width", "choice", choices=(32, 64, 128)),
                           Param("act", "choice", choices=("relu", "gelu")),
                           Param("pair", "choice", choices=(0.1, 0.5)))
    assert (spec.of_program, spec.metric, spec.direction, spec.objective_text) == (True, "loss", "minimize", "min loss")


def test_a_programs_objective_and_direction_default_to_its_run_tables() -> None:
    from gputui.sweep.space import parse_text

    _p, spec = parse_text(program_profile("[sweep.params]\nlr = [0.1, 0.5]\n",
                                          'objective = "val_loss"\ndirection = "minimize"\n'), Path("/x/s.toml"))
    assert (spec.objective, spec.direction) == ("val_loss", "minimize")
    _p, builtin = parse_text('[run]\nmodel = "fast"\nepochs = 2\n[sweep]\nlr = [1e-3, 1e-1]\n'
                             'objective = "min time_to_accuracy"\ntarget = 98.0\n', Path("/x/b.toml"))
    assert (builtin.of_program, builtin.metric, builtin.direction) == (False, "time_to_accuracy", "minimize")


def test_a_programs_objective_may_say_its_direction_as_sweep_show_writes_it() -> None:
    """`sweep show` and the study write "max val_acc"; copied back into a profile it was refused."""
    from gputui.sweep.space import parse_text

    for objective, run, want in (("min val_loss", "", ("val_loss", "minimize", "min val_loss")),
                                 ("max val_acc", 'direction = "minimize"\n', ("val_acc", "maximize", "max val_acc"))):
        _p, spec = parse_text(program_profile(f'objective = "{objective}"\n[sweep.params]\nlr = [0.1, 0.5]\n', run),
                              Path("/x/s.toml"))
        assert (spec.metric, spec.direction, spec.objective_text) == want  # the objective's word wins over [run]'s
    with pytest.raises(UserError, match="'max val_acc' is to maximize but direction is 'minimize'; keep one"):
        parse_text(program_profile('objective = "max val_acc"\ndirection = "minimize"\n[sweep.params]\nlr = [0.1, 0.5]\n'),
                   Path("/x/s.toml"))
    with pytest.raises(UserError, match="names a metric of your own program"):  # the built-in nets say theirs
        parse_text('[run]\nmodel = "fast"\n[sweep]\nlr = [1e-3, 1e-1]\nobjective = "max val_acc"\n', Path("/x/b.toml"))
    with pytest.raises(UserError, match="or \"max val_acc\" with its direction"):
        parse_text(program_profile('objective = "max val acc"\n[sweep.params]\nlr = [0.1, 0.5]\n'), Path("/x/s.toml"))


def test_suggest_params_asks_optuna_for_each_kind() -> None:
    import optuna

    from gputui.sweep.space import ask, parse_text

    _p, spec = parse_text(program_profile(
        'objective = "acc"\nsampler = "random"\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n'
        'layers = {low = 2, high = 8}\nwidth = [32, 64]\n'), Path("/x/s.toml"))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    params = ask(study.ask(), spec)
    assert 1e-4 <= params["lr"] <= 1e-1 and isinstance(params["layers"], int) and 2 <= params["layers"] <= 8
    assert params["width"] in (32, 64)
    dists = study.trials[0].distributions
    lr = dists["lr"]
    assert isinstance(lr, optuna.distributions.FloatDistribution) and lr.log
    assert isinstance(dists["layers"], optuna.distributions.IntDistribution)


@pytest.mark.parametrize("text,message", [
    (program_profile('objective = "val_acc"\nlr = [1e-3, 1e-1]\n'), "your program's parameters go in [sweep.params]"),
    (program_profile('objective = "val_acc"\n'), "[sweep.params] is missing"),
    (program_profile("[sweep.params]\nlr = [0.1, 0.5]\n"), "objective: name the metric your program reports"),
    (program_profile('objective = "max test_accuracy"\n[sweep.params]\nlr = [0.1, 0.5]\n'), "is the built-in nets'"),
    (program_profile('objective = "a b"\n[sweep.params]\nlr = [0.1, 0.5]\n'), "the name of a metric your program"),
    (program_profile('objective = "acc"\n[sweep.params]\nlr = [0.5, 0.1]\n'), "[0.5, 0.1] is inverted"),
    (program_profile('objective = "acc"\n[sweep.params]\nlr = {low = 0.0, high = 0.1, log = true}\n'),
     "low > 0 for log = true"),
    (program_profile('objective = "acc"\n[sweep.params]\nlr = 0.1\n'), "a fixed value goes in the command"),
    (program_profile('objective = "acc"\n[sweep.params]\n"l r" = [1, 2]\n'), "parameter names of letters"),
    (program_profile('objective = "acc"\n[sweep.params]\nw = [1, 1]\n'), "1 is given twice"),
    (program_profile('objective = "acc"\n[sweep.params]\nlr = {low = 0.1}\n'), "a range with low and high"),
    ('[run]\nmodel = "fast"\nepochs = 2\n[sweep]\nobjective = "val_acc"\nlr = [1e-3, 1e-1]\n',
     "names a metric of your own program: set [run] command"),
    ('[run]\nmodel = "fast"\nepochs = 2\n[sweep]\nlr = [1e-3, 1e-1]\n[sweep.params]\nx = [1, 2]\n',
     "[sweep.params] goes with [run] command"),
    ('[run]\nmodel = "fast"\nepochs = 2\n[sweep]\nlr = [1e-3, 1e-1]\ndirection = "minimize"\n',
     "contradicts objective 'max test_accuracy'"),
])
def test_bad_program_sweeps_are_one_line_naming_the_key(tmp_path: Path, text: str, message: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "s.toml", text)
    assert cli.main(["sweep", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and str(path) in err[0], err
    assert not sweep_home("s").exists()


# -- the worker's relay -------------------------------------------------------------------------

def test_the_relay_marks_each_new_step_of_the_objective_and_keeps_its_last_value() -> None:
    from gputui.sweep.programs import Relay

    sent: list[dict[str, Any]] = []
    relay = Relay(7, "val_acc", sent.append, 0.0)
    for event in ({"event": "metrics", "step": 0, "values": {"loss": 1.0}},  # no objective: no mark
                  {"event": "metrics", "step": 0, "values": {"val_acc": 0.5}},
                  {"event": "metrics", "step": 0, "values": {"val_acc": 0.6}},  # the same step again
                  {"event": "metrics", "step": 5, "values": {"val_acc": 0.7}},
                  {"event": "metrics", "epoch": 2, "values": {"val_acc": 0.4}}):  # behind step 5
        relay.show(event)
    assert [m.get("eval") for m in sent] == [None, 1, None, 6, None]
    assert all(m["op"] == "event" and m["trial"] == 7 for m in sent) and relay.last == 0.4

    ignored: list[dict[str, Any]] = []
    plain = Relay(1, "acc", ignored.append, 0.0)
    marks = []
    for value in (0.1, 0.2, 0.3):  # no step, no epoch: the count of its reports
        out: list[dict[str, Any]] = []
        plain.write = out.append
        plain.show({"event": "metrics", "values": {"acc": value}})
        marks.append(out[0].get("eval"))
    assert marks == [1, 2, 3] and plain.last == 0.3
    out = []
    plain.write = out.append  # 5 reports of the objective merged into one event, then one more
    plain.show({"event": "metrics", "values": {"acc": 0.8, "loss": 1.0}, "merged": 9, "objective_reports": 5})
    plain.show({"event": "metrics", "values": {"acc": 0.9}})
    assert [m.get("eval") for m in out] == [8, 9] and plain.last == 0.9


def test_a_program_worker_that_gets_no_objective_fails_the_trial_at_once(tmp_path: Path) -> None:
    """A program that never reports the objective fails once (a retry would not report it either)."""
    import optuna
    from optuna.trial import TrialState

    write(tmp_path, "train.py", "from gputui import report\nreport.log(step=0, loss=1.0)\n")
    profile = write(tmp_path, "s.toml", '[run]\ncommand = ["python", "train.py"]\ndevice = "cpu"\n\n'
                    '[sweep]\ntrials = 1\nworkers = 1\nthreads = 1\nobjective = "val_acc"\n\n'
                    '[sweep.params]\nwidth = [8, 16]\n')
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", str(profile)], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    db = Path(os.environ["GPUTUI_HOME"]) / "sweeps" / "sweeps.db"
    (trial,) = optuna.load_study(study_name="s", storage=f"sqlite:///{db}").get_trials()
    assert trial.state == TrialState.FAIL and trial.user_attrs["attempts"] == 1
    assert "the program ended without reporting val_acc" in trial.user_attrs["error"]


def test_a_study_kept_from_before_a_programs_profile_refused_net_keys_still_resumes(tmp_path: Path) -> None:
    """A program's profile with a built-in net's key (epochs, which did nothing) is refused now; a
    study that kept such a profile at its start still loads for --resume and show."""
    from gputui.sweep import study as studies
    from gputui.sweep.space import load_spec

    text = ('[run]\ncommand = ["python", "train.py", "{lr}"]\ndevice = "cpu"\nobjective = "val_acc"\n\n'
            '[sweep]\ntrials = 2\n\n[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n')
    profile = write(tmp_path, "old.toml", text.replace('device = "cpu"\n', 'device = "cpu"\nepochs = 3\n'))
    with pytest.raises(UserError, match=r"old.toml:4: \[run\] epochs: a setting of the built-in nets"):
        load_spec(profile)
    write(tmp_path, "old.toml", text)
    made = studies.create(load_spec(profile)[1])
    old = profile.read_text().replace('device = "cpu"\n', 'device = "cpu"\nepochs = 3\n')
    made.set_user_attr(studies.PROFILE_ATTR, old)  # as an older gputui accepted and kept it
    _study, kept, spec = studies.load("old")
    assert kept.run.command == ("python", "train.py", "{lr}") and spec.metric == "val_acc"


def test_a_program_worker_gives_its_trial_the_code_the_master_read_never_its_own_copys(tmp_path: Path) -> None:
    """A host's copy of the code is no work tree (and the folder above it may be another): the
    trial records the master's read of its workdir, as the trial message says it, or nothing."""
    from gputui.runs.provenance import CodeVersion
    from gputui.sweep.programs import ProgramWorker

    seen: list[Any] = []

    class Runs:
        CHECKPOINTS = "checkpoints"

        def execute_program(self, run: Any, cfg: Any, resume: bool, view: Any, stop: Any = None,
                            code: Any = "not given") -> str:
            seen.append(code)
            return "done"

        def wrote_checkpoint(self, path: Path) -> bool:
            return False

    results: list[dict[str, Any]] = []
    worker = ProgramWorker("cpu", 1, Runs(), results.append)
    sha = "ab" * 20
    for code in ({"git_commit": sha, "git_dirty": True}, {"git_commit": sha}, {}, {"git_commit": "HEAD"}, "x"):
        worker.run_trial({"op": "trial", "trial": 1, "profile": '[run]\ncommand = ["python", "t.py"]\n',
                          "run_dir": str(tmp_path / "t"), "objective": "val_acc", "code": code})
    assert seen == [CodeVersion(sha, True), CodeVersion(sha, None), None, None, None]
    assert [r["outcome"] for r in results] == ["done"] * 5
