"""A sweep of the user's own program on `[[hosts]]` (issue 32): the workdir goes to each host once
(gputui.sweep.hostcode over gputui.cluster.codesync), `[run] setup` runs there once, and the host's
`gputui worker --program` runs each trial in that code directory, relaying its reports as a
local program trial does. A loopback sshd stands in for the host (tests/cluster_fixture.py)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui import cli
from tests.proc_support import Child

from .cluster_fixture import ClusterNodes, cluster_nodes, cluster_wheel, pinned_wheel, trust  # noqa: F401
from .test_sweep_remote import host_table, sweep_processes

WAIT = 240  # s: a host's bootstrap and six tiny trials on a slow, busy 2-core machine
HOLD_S = 60  # s: the most a local trial waits for the host's first trial to start

# Reads its lr from argv (`{lr}`), checks report.trial() says the same, scores it with a helper
# module of its workdir (so it runs from a copy of the whole workdir) and reports val_acc from lr
# alone. A trial on this machine holds until a trial on the host has started (the host's first
# trial writes the marker), so the host is sure to take one whatever the load: a bounded wait on
# an event, failing the trial with a message when the host never starts one.
PROGRAM = '''\
import os, sys, time
from gputui import report
from scoring import score
LOCAL, MARKER = {local!r}, {marker!r}
lr = float(sys.argv[sys.argv.index("--lr") + 1])
if report.trial().get("lr") != lr:
    sys.exit(f"report.trial() is {{report.trial()}}, argv says lr = {{lr!r}}")
here = os.path.realpath(os.getcwd())
print(f"lr={{lr!r}} cwd={{here}} run={{os.environ['GPUTUI_RUN_DIR']}}", flush=True)
if here != LOCAL:
    open(MARKER, "a").close()
else:
    deadline = time.monotonic() + {hold}
    while not os.path.exists(MARKER):
        if time.monotonic() > deadline:
            sys.exit("no trial started on the host")
        time.sleep(0.05)
value = score(lr)
for step, val_acc in enumerate((value - 0.1, value)):
    report.log(step=step, val_acc=round(val_acc, 6))
'''
SCORING = "import math\n\ndef score(lr):\n    return 1 - abs(math.log10(lr) + 2) / 10\n"


def expected_value(lr: float) -> float:
    return round(1 - abs(math.log10(lr) + 2) / 10, 6)


def cli_json(*argv: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli.main(list(argv)) == 0
    return json.loads(out.getvalue())


def test_a_6_trial_program_sweep_over_2_local_workers_and_a_host_syncs_the_code_once_and_runs_trials_there(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path) -> None:
    server = cluster_nodes.node(2)  # a fresh host: nothing synced there, no setup stamp in its venv
    trust(gputui_home, server)
    work = tmp_path / "code"
    work.mkdir()
    marker = tmp_path / "host-started"
    (work / "train.py").write_text(PROGRAM.format(local=os.path.realpath(work), marker=str(marker), hold=HOLD_S))
    (work / "scoring.py").write_text(SCORING)
    (work / "notes.tmp").write_text("left out by sync_exclude\n")
    profile = tmp_path / "s.toml"
    profile.write_text('[run]\ncommand = ["python", "train.py", "--lr", "{lr}"]\ndevice = "cpu"\nworkdir = "code"\n'
                       'sync_exclude = ["*.tmp"]\nsetup = "echo ran >> setup-ran.txt"\n\n'
                       f'{host_table(server, cluster_nodes.user_key)}\n'
                       '[sweep]\nname = "s"\ntrials = 6\nworkers = 2\nthreads = 1\nobjective = "val_acc"\n'
                       'direction = "maximize"\npruner = "none"\n\n'
                       '[sweep.params]\nlr = {low = 1e-4, high = 1e-1, log = true}\n')
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", str(profile)], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    lines = child.events
    ready = sorted(e["slot"] for e in lines if e.get("sweep") == "slot" and e.get("state") == "ready")
    assert ready == ["cpu-0", "cpu-1", "n0-cpu"], child.stderr

    # the code went to the host once, before its worker started: two files (notes.tmp left out)
    assert server.home is not None
    code_dir = server.home / ".gputui-cluster" / "runs" / "sweep-s" / "code"
    code = [e for e in lines if e.get("sweep") == "code"]
    assert len(code) == 1, code
    assert (code[0]["host"], code[0]["code_dir"], code[0]["sent_files"], code[0]["setup"]) == \
        ("n0", str(code_dir), 2, True), code
    manifest = json.loads((code_dir / ".gputui-sync.json").read_text())
    assert sorted(manifest["files"]) == ["scoring.py", "train.py"], manifest
    assert (code_dir / "setup-ran.txt").read_text() == "ran\n"  # [run] setup ran once, in the code directory

    import optuna

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{gputui_home / 'sweeps' / 'sweeps.db'}")
    trials = study.get_trials()
    assert [t.state.name for t in trials] == ["COMPLETE"] * 6, [(t.number, t.state, t.user_attrs) for t in trials]
    on_host = [t for t in trials if t.user_attrs["slot"] == "n0-cpu"]
    assert on_host and {t.user_attrs["slot"] for t in trials} == {"cpu-0", "cpu-1", "n0-cpu"}
    for t in trials:
        assert t.value == expected_value(t.params["lr"]), (t.number, t.params, t.value)
        assert t.intermediate_values == {0: round(expected_value(t.params["lr"]) - 0.1, 6), 1: t.value}
    for t in on_host:  # it ran there: in the host's code directory, its run directory on the host
        run = server.home / ".gputui-cluster" / "runs" / "sweep-s" / f"trial-{t.number:05d}"
        said = (run / "output.log").read_text().split()
        assert said == [f"lr={t.params['lr']!r}", f"cwd={code_dir}", f"run={run}"], said
        start = [e["data"] for e in lines if e.get("sweep") == "run" and e.get("trial") == t.number
                 and e["data"].get("event") == "start"]
        assert start and start[0]["workdir"] == str(code_dir) and start[0]["run_dir"] == str(run), start

    shown = cli_json("sweep", "show", "s", "--json")
    assert (shown["finished"], shown["trials"]) == (6, 6)
    rows = shown["trial_rows"]
    assert [r["state"] for r in rows] == ["complete"] * 6
    assert sorted(r["value"] for r in rows) == sorted(expected_value(t.params["lr"]) for t in trials)
    assert not sweep_processes(gputui_home, server.home)  # every worker, here and there, ended with the sweep


def test_a_program_sweep_whose_workdir_passes_sync_max_mb_is_refused_before_any_host_is_reached(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], gputui_home: Path) -> None:
    work = tmp_path / "code"
    work.mkdir()
    (work / "train.py").write_text("print(1)\n")
    (work / "weights.bin").write_bytes(b"\0" * 3_000_000)
    profile = tmp_path / "s.toml"
    profile.write_text('[run]\ncommand = ["python", "train.py", "--lr", "{lr}"]\nworkdir = "code"\nsync_max_mb = 2\n\n'
                       '[[hosts]]\nname = "h"\naddress = "unreachable.invalid"\n\n'
                       '[sweep]\nobjective = "val_acc"\n\n[sweep.params]\nlr = [0.1, 0.5]\n')
    assert cli.main(["sweep", str(profile)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "over [run] sync_max_mb = 2" in err[0] and "weights.bin (3.0 MB)" in err[0], err
    assert str(profile) in err[0]
    assert not (gputui_home / "sweeps" / "s").exists()


# On its first attempt the trial writes a checkpoint, then kills its own worker (the host's
# `gputui worker --program`, found among its ancestors) and exits; the retry finds the checkpoint
# (GPUTUI_RESUME=1) and reports what it holds.
DIES_ONCE = '''\
import os, sys
import psutil
from gputui import report
state = report.checkpoint_dir() / "state.txt"
if report.resuming():
    report.log(step=1, val_acc=float(state.read_text()))
    sys.exit(0)
state.write_text("0.75")
report.log(step=0, val_acc=0.5, checkpoint=True)
worker = psutil.Process().parent()
while worker is not None and "gputui worker" not in " ".join(worker.cmdline()):
    worker = worker.parent()
if worker is None:
    sys.exit("no gputui worker above this program")
worker.kill()
'''


def test_a_host_worker_that_dies_mid_trial_hands_the_programs_checkpoint_dir_back_for_the_retry(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path) -> None:
    import optuna

    server = cluster_nodes.shared_node(3)
    trust(gputui_home, server)
    work = tmp_path / "code"
    work.mkdir()
    (work / "train.py").write_text(DIES_ONCE)
    profile = tmp_path / "d.toml"
    profile.write_text('[run]\ncommand = ["python", "train.py", "{width}"]\ndevice = "cpu"\nworkdir = "code"\n\n'
                       f'{host_table(server, cluster_nodes.user_key, "h")}\n'
                       '[sweep]\nname = "d"\ntrials = 1\nworkers = 0\nthreads = 1\nobjective = "val_acc"\n'
                       'pruner = "none"\n\n[sweep.params]\nwidth = [8, 16]\n')
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", str(profile)], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    lost = [e for e in child.events if e.get("sweep") == "slot" and e.get("state") == "lost"]
    assert len(lost) == 1 and lost[0]["slot"] == "h-cpu", lost
    (trial,) = optuna.load_study(study_name="d", storage=f"sqlite:///{gputui_home / 'sweeps' / 'sweeps.db'}").get_trials()
    assert (trial.state.name, trial.value, trial.user_attrs["attempts"]) == ("COMPLETE", 0.75, 2), trial.user_attrs
    # the checkpoint came back to the master's trial directory when the worker died
    assert (gputui_home / "sweeps" / "d" / "trial-00000" / "checkpoints" / "state.txt").read_text() == "0.75"
