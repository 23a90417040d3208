"""The user's own program on a cluster (issue 32): torchrun on every node, rank 0's reports
relayed, checkpoints pulled to the master and pushed back for a resume, one stop path.

The nodes are loopback sshd servers (tests/cluster_fixture.py) with homes of their own; the
programs' gates are files the test creates once it has seen the event it waits for.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gputui.cloud.context import CloudContext
from gputui.cloud.ledger import Ledger
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster import checkpoints as ckpts
from gputui.cluster.launch import ClusterRun
from gputui.cluster.manager import SlaveManager
from gputui.cluster.settings import cluster_settings
from gputui.config.hosts import HostSpec
from gputui.config.profile import parse_profile
from gputui.config.run import RunSettings
from gputui.model.cloud import InstanceInfo
from gputui.runs import store as runs

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, remote_run_dirs, trust,
    wait_no_leftovers,
)
from .conftest import cli_env, json_lines
from .moto_fixture import public_key_line
from .proc_support import Child
from .sshd_fixture import Sshd
from .test_cluster_cloud import FakeImds, imds  # noqa: F401 - the fake metadata service and its fixture

REPO = Path(__file__).resolve().parent.parent
RUN_S = 150  # bound of every wait for a cluster run's event (two cores shared by many tests)


class Raw:
    """A TOML value written as it is (an inline table) by cluster_profile."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


ENV = Raw('{ OMP_NUM_THREADS = "1" }')

# A program that reports each step, checkpoints (state.json, report.log(checkpoint=True)) at
# --ckpt-at (with --ckpt-gate, once the file ckpt<step> is in --gates), and waits at each --gate-at step for the file go<step> in --gates (unless it was
# resumed; asked to stop there, rank 0 checkpoints first); `--ignore-term` ignores SIGTERM and the stop file; `--link-at` puts a link to /dev/zero
# in its checkpoint directory at that step (with state.json rewritten) and reports a checkpoint.
PROGRAM = r'''
import argparse, json, os, signal, sys, time
from pathlib import Path
from gputui import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--ckpt-at", type=int, action="append", default=[])
p.add_argument("--gate-at", type=int, action="append", default=[])
p.add_argument("--gates", type=Path)
p.add_argument("--ignore-term", action="store_true")
p.add_argument("--link-at", type=int, default=None)
p.add_argument("--fail-at", type=int, default=None)
p.add_argument("--silent", action="store_true", help="checkpoint without saying so (report.log(checkpoint=True))")
p.add_argument("--ckpt-gate", action="store_true", help="before each checkpoint, wait for the file ckpt<step> in --gates")
args = p.parse_args()
if args.ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
rank = int(os.environ.get("RANK", "0"))
state = report.checkpoint_dir() / "state.json"
start = 0
if report.resuming() and state.is_file():
    start = json.loads(state.read_text())["step"]
    print(f"resumed at step {start}", flush=True)
print(f"rank {rank} world {os.environ.get('WORLD_SIZE')} resume {os.environ.get('GPUTUI_RESUME')} "
      f"env {os.environ.get('OMP_NUM_THREADS')}", flush=True)

def gate(step, name=None):
    deadline = time.monotonic() + 300
    while not (args.gates / (name or f"go{step}")).exists():
        if report.should_stop() and not args.ignore_term:
            if rank == 0:
                state.write_text(json.dumps({"step": step}))
                report.log(step=step, checkpoint=True)
            print(f"stopping at step {step}", flush=True)
            sys.exit(0)
        if time.monotonic() > deadline:
            sys.exit(3)
        time.sleep(0.05)

for step in range(start + 1, args.steps + 1):
    report.log(step=step, loss=1.0 / step)
    if step == args.fail_at:
        print(f"boom at step {step}", file=sys.stderr, flush=True)
        sys.exit(3)
    if rank == 0 and step in args.ckpt_at:
        if args.ckpt_gate:
            gate(step, f"ckpt{step}")
        part = state.with_suffix(".part")
        part.write_text(json.dumps({"step": step, "pad": "x" * step}))
        os.replace(part, state)
        if not args.silent:
            report.log(step=step, checkpoint=True)
    if rank == 0 and step == args.link_at:
        state.write_text(json.dumps({"step": step}))
        os.symlink("/dev/zero", report.checkpoint_dir() / "zero")
        report.log(step=step, checkpoint=True)
    if args.gates is not None and step in args.gate_at and not report.resuming():
        gate(step)
print("finished", flush=True)
'''


@pytest.fixture(scope="module")
def two_nodes(cluster_nodes: ClusterNodes) -> list[Sshd]:
    return [cluster_nodes.node(0), cluster_nodes.node(1)]


def node_logs(run_dir: Path) -> str:
    folder = run_dir / "nodes"
    return "".join(f"\n--- {p.relative_to(folder)}\n{p.read_text()[-3000:]}"
                   for p in sorted(folder.glob("*/output.log"))) if folder.is_dir() else ""


def finish(child: Child, timeout: float, what: str, run_dir: Path) -> int:
    try:
        return child.finish(timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{node_logs(run_dir)}") from None


def program_dir(tmp_path: Path) -> Path:
    code = tmp_path / "code"
    code.mkdir()
    (code / "prog.py").write_text(PROGRAM)
    return code


def gputui_run(profile: Path, run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gputui", "run", "--json", "--profile", str(profile), "--run-dir", str(run_dir), *extra]


def story(events: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(e["event"], e.get("step"), e.get("node"), e.get("message")) for e in events if e["event"] != "metrics"]


def reports(path: Path) -> list[tuple[int, dict[str, float]]]:
    """(step, values) of each line of a reports file (GPUTUI_EVENTS)."""
    return [(r["step"], r["values"]) for r in json_lines(path.read_text())]


def latest(events: list[dict[str, Any]]) -> dict[str, float]:
    """The last value of each metric the run's metrics events carried."""
    out: dict[str, float] = {}
    for e in events:
        if e["event"] == "metrics":
            out.update(e["values"])
    return out


def test_two_nodes_run_mnist_ddp_and_train_as_one_process_with_the_same_global_batch(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, small_data: Path, tmp_path: Path,
    gputui_home: Path,
) -> None:
    trust(gputui_home, *two_nodes)
    code = tmp_path / "code"
    code.mkdir()
    for name in ("mnist_ddp.py", "mnist_plain.py"):
        shutil.copy(REPO / "examples" / name, code / name)
    args = ["--data", str(small_data), "--epochs", "1", "--log-every", "2", "--seed", "1", "--lr", "0.01"]
    # One process, global batch 64 ...
    single = Child([sys.executable, "-m", "gputui", "run", "--json", "--run-dir", str(tmp_path / "single"), "--",
                    "python", "mnist_ddp.py", *args, "--batch-size", "64"],
                   env=cli_env(OMP_NUM_THREADS="1"), name="gputui run (one process)", cwd=str(code))
    with single:
        assert single.finish(RUN_S, "the one-process run") == 0, single.stderr
    # ... and two nodes of one process each, 32 a rank.
    command = ["python", "mnist_ddp.py", *args, "--batch-size", "32"]
    profile = cluster_profile(tmp_path / "cluster.toml", two_nodes, cluster_nodes.user_key,
                              {"command": command, "workdir": str(code), "env": ENV}, master_trains=False)
    run_dir = tmp_path / "multi"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (two nodes)") as child:
        code_ = finish(child, RUN_S, "the two-node run", run_dir)
    assert code_ == 0, child.stderr + node_logs(run_dir)
    seen = child.events
    kinds = [e["event"] for e in seen]
    assert kinds[-1] == "done", story(seen)
    start = next(e for e in seen if e["event"] == "start")
    assert start["program"].startswith("python mnist_ddp.py") and start["world_size"] == 2 and start["nodes"] == 2
    cluster = next(e for e in seen if e["event"] == "cluster")
    assert cluster["nodes"] == ["n0", "n1"] and cluster["world_size"] == 2
    # Every report line (the reports files: the events merge reports that come within 20 ms).
    (rank0_dir, _) = remote_run_dirs("multi", *two_nodes)
    multi, one = reports(Path(rank0_dir) / "reported.jsonl"), reports(tmp_path / "single" / "reported.jsonl")
    assert [s for s, _ in multi] == [s for s, _ in one] == [2, 4, 6, 8, 8], (multi, one)
    for (step, a), (_, b) in zip(multi, one):
        assert a.keys() == b.keys(), step
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-5), (step, key, a, b)
    last = latest(seen)
    assert last.keys() == latest(single.events).keys() == {"loss", "lr", "val_loss", "val_acc"}
    assert (last["val_acc"], last["val_loss"]) == (multi[-1][1]["val_acc"], multi[-1][1]["val_loss"])  # relayed as reported
    assert one[-1][1]["val_acc"] > 0.2  # it really trained (10 classes)
    # Every node's output is kept, each in its own file; the events file is the stream printed.
    for name in ("n0", "n1"):
        assert (run_dir / "nodes" / name / "output.log").is_file()
    assert "epoch 0: step 8" in (run_dir / "nodes" / "n0" / "output.log").read_text()
    assert [e["event"] for e in json_lines((run_dir / "events.jsonl").read_text())] == kinds
    # The nodes ran the program from their copy of the workdir, under the cluster's remote_dir.
    for remote in remote_run_dirs("multi", *two_nodes):
        assert (Path(remote) / "code" / "mnist_ddp.py").is_file()
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("multi", *two_nodes)) == []


def test_a_node_lost_after_a_checkpoint_pull_resumes_from_it_on_the_other_node(
    cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    nodes = [cluster_nodes.node(0), cluster_nodes.node(1)]  # n0 is lost for good: nodes of this test's own
    trust(gputui_home, *nodes)
    code, gates = program_dir(tmp_path), tmp_path / "gates"
    gates.mkdir()
    command = ["python", "prog.py", "--steps", "10", "--ckpt-at", "5", "--gate-at", "5", "--gate-at", "8",
               "--gates", str(gates)]
    profile = cluster_profile(tmp_path / "cluster.toml", nodes, cluster_nodes.user_key,
                              {"command": command, "workdir": str(code), "env": ENV, "checkpoint_pull_s": 3600},
                              master_trains=False, nodes=2, min_nodes=1)
    run_dir = tmp_path / "lost"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (lose a node)") as child:
        pulled = child.wait_for(lambda e: e["event"] == "checkpoint_pulled", RUN_S, "the checkpoint of step 5 pulled")
        assert pulled["step"] == 5 and pulled["node"] == "n0" and pulled["files"] == 1
        (gates / "go5").touch()
        child.wait_for(lambda e: e["event"] == "metrics" and e.get("step") == 8, RUN_S, "step 8")
        nodes[0].stop()  # rank 0's node, and everything it runs, gone for good
        code_ = finish(child, RUN_S, "the run to resume on n1 and finish", run_dir)
    seen = child.events
    assert code_ == 0, child.stderr + node_logs(run_dir)
    lost = next((e for e in seen if e["event"] == "node_lost"), None)
    assert lost is not None and lost["node"] == "n0", story(seen)
    resumed = next(e for e in seen if e["event"] == "resumed")
    assert (resumed["from_step"], resumed["lost_steps"], resumed["nodes"]) == (5, 3, 1), resumed
    assert resumed["checkpoint"] == str(run_dir / "checkpoints")
    relaunch = [e for e in seen if e["event"] == "cluster"][-1]
    assert relaunch["nodes"] == ["n1"] and relaunch["world_size"] == 1
    at = seen.index(resumed)
    before = [e["step"] for e in seen[:at] if e["event"] == "metrics" and "loss" in e["values"]]
    after = [e["step"] for e in seen[at:] if e["event"] == "metrics" and "loss" in e["values"]]
    assert before[-1] == 8 and after[0] == 6 and after[-1] == 10, (before, after)  # 6..8 redone
    assert seen[-1]["event"] == "done" and seen[-1]["step"] == 10
    assert "resumed at step 5" in (run_dir / "nodes" / "n1" / "output.log").read_text()
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("lost", *nodes)) == []


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace_and_the_run_names_its_checkpoint(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = two_nodes[0]
    trust(gputui_home, node)
    code, gates = program_dir(tmp_path), tmp_path / "gates"
    gates.mkdir()
    command = ["python", "prog.py", "--steps", "10", "--ckpt-at", "3", "--gate-at", "4", "--gates", str(gates),
               "--ignore-term"]
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": command, "workdir": str(code), "env": ENV, "stop_grace_s": 2.0,
                               "checkpoint_pull_s": 3600}, master_trains=False)
    run_dir = tmp_path / "deaf"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (ignores SIGTERM)") as child:
        child.wait_for(lambda e: e["event"] == "checkpoint_pulled" and e["step"] == 3, RUN_S, "the checkpoint pulled")
        child.wait_for(lambda e: e["event"] == "metrics" and e.get("step") == 4, RUN_S, "step 4 (waiting at its gate)")
        child.proc.send_signal(signal.SIGINT)
        code_ = finish(child, RUN_S, "the stopped run", run_dir)
    seen = child.events
    assert code_ == 0, child.stderr + node_logs(run_dir)
    end = next((e for e in seen if e["event"] == "interrupted"), None)
    assert end is not None, story(seen)
    assert end["exit_code"] == 128 + signal.SIGKILL, end  # SIGTERM ignored: killed after the grace
    assert end["checkpoint"] == str(run_dir / "checkpoints") and end["lost_steps"] == 1 and end["step"] == 4
    assert json.loads((run_dir / "checkpoints" / "state.json").read_text())["step"] == 3
    assert f"the program's checkpoints are in {run_dir / 'checkpoints'}" in child.stderr
    assert wait_no_leftovers(str(run_dir), *remote_run_dirs("deaf", node)) == []
    # --resume pushes the pulled checkpoint back to the node: the program goes on from step 3.
    with Child([sys.executable, "-m", "gputui", "run", "--json", "--resume", str(run_dir)], env=cli_env(),
               name="gputui run --resume") as again:
        assert finish(again, RUN_S, "the resumed run", run_dir) == 0, again.stderr + node_logs(run_dir)
    resumed = next((e for e in again.events if e["event"] == "resumed"), None)
    assert resumed is not None, story(again.events)
    assert (resumed["from_step"], resumed["lost_steps"], resumed["checkpoint"]) == (3, 1, str(run_dir / "checkpoints"))
    assert next(e for e in again.events if e["event"] == "start")["resumed"] is True
    assert again.events[-1]["event"] == "done" and again.events[-1]["step"] == 10
    assert "resumed at step 3" in (run_dir / "nodes" / "n0" / "output.log").read_text()


def test_a_checkpoint_holding_a_link_to_dev_zero_is_refused_and_the_previous_one_kept(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = two_nodes[1]
    trust(gputui_home, node)
    code, gates = program_dir(tmp_path), tmp_path / "gates"
    gates.mkdir()
    command = ["python", "prog.py", "--steps", "6", "--ckpt-at", "2", "--link-at", "4", "--gate-at", "2",
               "--gates", str(gates)]
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": command, "workdir": str(code), "env": ENV, "checkpoint_pull_s": 3600},
                              master_trains=False)
    run_dir = tmp_path / "zero"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (a link to /dev/zero)") as child:
        child.wait_for(lambda e: e["event"] == "checkpoint_pulled" and e["step"] == 2, RUN_S, "the good checkpoint")
        (gates / "go2").touch()
        code_ = finish(child, RUN_S, "the run", run_dir)
    seen = child.events
    assert code_ == 0, child.stderr + node_logs(run_dir)
    refused = [e for e in seen if e["event"] == "warning" and e.get("reason") == "checkpoint_refused"]
    assert refused and "zero is not a regular file" in refused[0]["message"], story(seen)
    assert "the checkpoint of step 2 is kept" in refused[0]["message"]
    assert [e["step"] for e in seen if e["event"] == "checkpoint_pulled"] == [2]
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["state.json"]
    assert json.loads((run_dir / "checkpoints" / "state.json").read_text())["step"] == 2
    assert seen[-1]["event"] == "done"


def test_a_checkpoint_the_program_does_not_announce_is_pulled_every_checkpoint_pull_s(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = two_nodes[0]
    trust(gputui_home, node)
    code, gates = program_dir(tmp_path), tmp_path / "gates"
    gates.mkdir()
    command = ["python", "prog.py", "--steps", "4", "--ckpt-at", "2", "--silent", "--ckpt-gate", "--gate-at", "2",
               "--gates", str(gates)]
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": command, "workdir": str(code), "env": ENV, "checkpoint_pull_s": 1.0},
                              master_trains=False)
    run_dir = tmp_path / "periodic"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (periodic pulls)") as child:
        # The checkpoint is written once the master has step 2's report: its file and the reports
        # travel apart (SFTP and the node's output), so a pull could otherwise come first.
        child.wait_for(lambda e: e["event"] == "metrics" and e.get("step") == 2, RUN_S, "step 2's report")
        (gates / "ckpt2").touch()
        pulled = child.wait_for(lambda e: e["event"] == "checkpoint_pulled", RUN_S, "a periodic pull")
        assert pulled["step"] == 2 and pulled["files"] == 1  # the step the program was at (it said nothing)
        assert not any(e.get("checkpoint") for e in child.events if e["event"] == "metrics")
        (gates / "go2").touch()
        assert finish(child, RUN_S, "the run", run_dir) == 0, child.stderr + node_logs(run_dir)
    assert [e["event"] for e in child.events].count("checkpoint_pulled") == 1  # unchanged since: not pulled again
    assert json.loads((run_dir / "checkpoints" / "state.json").read_text())["step"] == 2


def test_a_program_that_fails_on_a_node_is_the_runs_error_in_one_line(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = two_nodes[1]
    trust(gputui_home, node)
    code = program_dir(tmp_path)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": ["python", "prog.py", "--fail-at", "2"], "workdir": str(code), "env": ENV},
                              master_trains=False)
    run_dir = tmp_path / "boom"
    with Child(gputui_run(profile, run_dir), env=cli_env(), name="gputui run (a failing program)") as child:
        assert finish(child, RUN_S, "the failed run", run_dir) == 1, child.stderr + node_logs(run_dir)
    error = next((e for e in child.events if e["event"] == "error"), None)
    assert error is not None, story(child.events)
    assert error["exit_code"] == 3 and error["node"] == "n0"
    assert error["message"] == "python exited with code 3 on n0: boom at step 2"
    assert not any(e["event"] in ("relaunch", "node_lost") for e in child.events)  # a failure, not a lost node
    assert "python exited with code 3 on n0: boom at step 2" in child.stderr and "Traceback" not in child.stderr


BAR = ("import sys\n"
       "for i in range(3000):\n"
       "    sys.stdout.write(f'\\rtrain {i}/3000 loss={1 / (i + 1):.6f} ' + '#' * 20)\n"
       "    sys.stdout.flush()\n"
       "print(flush=True)\n"
       "print('val_acc=0.97', flush=True)\n")


def test_a_program_that_only_prints_a_progress_bar_on_a_node_gives_metrics_and_a_whole_log(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    """[run] metrics_regex reads rank 0's node's lines, as on one machine (before, a cluster run of a
    program that only prints had no metrics at all); a bar's 3,000 redraws (150 KB, one newline)
    reach the node's output.log whole, each with its "\r", not one line cut at 64 KiB; and
    `gputui run` shows rank 0's output as it does a local program's (before: nothing of it)."""
    node = two_nodes[1]
    trust(gputui_home, node)
    code = tmp_path / "code"
    code.mkdir()
    (code / "bar.py").write_text(BAR)
    regexes = Raw(r"['train (?P<step>\d+)/3000 loss=(?P<loss>[0-9.]+)', 'val_acc=(?P<val_acc>[0-9.]+)']")
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": ["python", "bar.py"], "workdir": str(code), "env": ENV,
                               "metrics_regex": regexes}, master_trains=False)
    run_dir = tmp_path / "bar"
    argv = [sys.executable, "-m", "gputui", "run", "--profile", str(profile), "--run-dir", str(run_dir)]  # no --json
    with Child(argv, env=cli_env(), name="gputui run (a progress bar on a node)", json_lines=False) as child:
        shown = child.rest(RUN_S, "the run's output")  # text mode: each "\r" ended a line here
        assert finish(child, RUN_S, "the run", run_dir) == 0, child.stderr + node_logs(run_dir)
    assert shown and shown[-1] == "val_acc=0.97" and "train 2999/3000 loss=0.000333 " + "#" * 20 in shown, (shown[-3:], child.stderr[-3000:].replace("\n", " // "))
    assert len([line for line in shown if line.startswith("train ")]) == 3000
    seen = runs.read_events(run_dir / "events.jsonl")
    metrics = [e for e in seen if e["event"] == "metrics"]
    assert metrics and all(e["source"] == "output" for e in metrics), story(seen)
    assert latest(seen) == {"loss": pytest.approx(0.000333), "val_acc": pytest.approx(0.97)}
    assert max(e.get("step", 0) for e in metrics) == 2999
    assert sum(e.get("merged", 1) for e in metrics) == 3000 + 1  # every frame and the line, paced
    log = (run_dir / "nodes" / "n0" / "output.log").read_bytes().decode()  # read_text would turn "\r" into "\n"
    assert log.count("\r") == 2999 and "line cut" not in log
    assert "\rtrain 2999/3000 loss=0.000333 " + "#" * 20 + "\nval_acc=0.97\n" in log


QUICK = "from gputui import report\nreport.log(step=1, ok=1.0)\nprint('quick ran', report.trial(), flush=True)\n"


def test_the_code_goes_once_only_what_changed_and_setup_runs_again_when_its_files_change(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path,
) -> None:
    node = two_nodes[1]
    trust(gputui_home, node)
    code = tmp_path / "work"
    code.mkdir()
    (code / "quick.py").write_text(QUICK)
    (code / "requirements.txt").write_text("# nothing yet\n")
    (code / "scratch.tmp").write_text("left out by sync_exclude\n")
    count = tmp_path / "setup-count"  # the loopback node shares this file system: the setup's runs are counted here
    profile = cluster_profile(tmp_path / "cluster.toml", [node], cluster_nodes.user_key,
                              {"command": ["python", "quick.py"], "workdir": str(code), "env": ENV,
                               "sync_exclude": ["*.tmp"], "setup": f"echo ran >> {count}",
                               "trial": Raw('{tag = "on a node"}')},
                              master_trains=False)

    def run(name: str) -> str:
        run_dir = tmp_path / name
        with Child(gputui_run(profile, run_dir), env=cli_env(), name=f"gputui run ({name})") as child:
            assert finish(child, RUN_S, f"the run {name}", run_dir) == 0, child.stderr + node_logs(run_dir)
        said = [e["message"] for e in child.events if e["event"] == "node" and e.get("kind") == "code"]
        assert len(said) == 1, story(child.events)
        assert "quick ran {'tag': 'on a node'}" in (run_dir / "nodes" / "n0" / "output.log").read_text()  # [run] trial
        return said[0]

    first = run("first")
    assert "code 2 files sent" in first and "[run] setup ran" in first, first  # quick.py, requirements.txt
    second = run("second")
    assert "code 0 files sent" in second and "setup already done" in second, second
    (code / "requirements.txt").write_text("# now one line more\nnumpy\n")
    third = run("third")
    assert "code 1 file sent" in third and "[run] setup ran" in third, third
    assert count.read_text().splitlines() == ["ran", "ran"]


def test_a_workdir_over_sync_max_mb_is_refused_before_anything_starts(
    two_nodes: list[Sshd], cluster_nodes: ClusterNodes, tmp_path: Path, gputui_home: Path,
) -> None:
    code = tmp_path / "work"
    code.mkdir()
    (code / "quick.py").write_text(QUICK)
    (code / "weights.bin").write_bytes(b"\0" * 300_000)
    profile = cluster_profile(tmp_path / "cluster.toml", [two_nodes[1]], cluster_nodes.user_key,
                              {"command": ["python", "quick.py"], "workdir": str(code), "sync_max_mb": 0.1},
                              master_trains=False)
    done = __import__("subprocess").run(gputui_run(profile, tmp_path / "run"), env=cli_env(), capture_output=True,
                                        text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "sync_max_mb" in line and "weights.bin" in line, line
    assert not (tmp_path / "run").exists()  # refused before the run (and any node) began


# -- the pull's checks, without a cluster ---------------------------------------------------
def test_a_pull_takes_only_regular_files_under_the_caps_and_fetches_only_what_changed(tmp_path: Path) -> None:
    src, dest = tmp_path / "node", tmp_path / "master" / "checkpoints"
    (src / "sub").mkdir(parents=True)
    dest.parent.mkdir()
    (src / "a.pt").write_bytes(b"a" * 10)
    (src / "sub" / "b.pt").write_bytes(b"b" * 20)
    got = ckpts.pull(ckpts.LocalSource(src), dest, ckpts.Pulled())
    assert got is not None and got[1:] == (2, 30)
    assert ckpts.pull(ckpts.LocalSource(src), dest, got[0]) is None  # nothing changed: nothing done
    (src / "a.pt").write_bytes(b"A" * 11)
    again = ckpts.pull(ckpts.LocalSource(src), dest, got[0])
    assert again is not None and again[1:] == (1, 11)  # b.pt is the copy already here
    assert (dest / "a.pt").read_bytes() == b"A" * 11 and (dest / "sub" / "b.pt").read_bytes() == b"b" * 20
    os.symlink("/dev/zero", src / "zero")
    with pytest.raises(ckpts.Refused, match="not a regular file"):
        ckpts.pull(ckpts.LocalSource(src), dest, again[0])
    assert sorted(p.name for p in dest.iterdir()) == ["a.pt", "sub"]  # the previous one, untouched
    (src / "zero").unlink()
    with open(src / "big", "wb") as fh:
        fh.truncate(runs.MAX_CHECKPOINT + 1)
    with pytest.raises(ckpts.Refused, match="over the cap"):
        ckpts.pull(ckpts.LocalSource(src), dest, again[0])
    assert not list(tmp_path.glob("master/checkpoints.part*"))


def test_a_listing_from_a_node_is_data() -> None:
    listing = ckpts.parse_find("f 3 1700000000.5 a.pt\0d 4096 1700000000.0 sub\0l 9 1700000000.0 sub/zero\0")
    assert listing["a.pt"] == ("f", 3, 1700000000.5)
    with pytest.raises(ckpts.Refused, match="not a regular file"):
        ckpts.check_listing(listing)
    with pytest.raises(ckpts.Refused, match="outside"):
        ckpts.check_listing({"../x": ("f", 1, 0.0)})
    with pytest.raises(ckpts.Refused, match="unreadable"):
        ckpts.parse_find("f three 0 a\0")


# -- a spot notice (the simulated cloud, as tests/test_cluster_cloud.py drives it) ----------
class Seen:
    """The run's view: keeps the events; `on` is called with each one."""

    def __init__(self, on: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.on = on

    def show(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        self.on(event)

    def close(self) -> None:
        pass


def test_a_spot_notice_stops_the_program_pulls_its_checkpoint_replaces_the_slave_and_resumes(
    cluster_nodes: ClusterNodes, pinned_wheel: Path, tmp_path: Path, gputui_home: Path, imds: FakeImds,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    machines = [cluster_nodes.node(0), cluster_nodes.node(1)]  # the first and the second instance
    monkeypatch.setenv("GPUTUI_IMDS_URL", imds.url)
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    text = f"""
[cloud]
budget_usd = 5.0
zones = ["us-east-1a"]
ssh_cidr = "198.51.100.7/32"
public_key = "{key}"
[cluster]
name = "spot"
cloud_slaves = 1
master_addr = "127.0.0.1"
rdzv_port = 0
socket_ifname = "lo"
join_timeout = 60
"""
    settings = cluster_settings(parse_profile(text, tmp_path / "p.toml"))
    assert settings is not None
    provider = SimProvider(script=SimScript(seed=1, launch_delay_s=0.5, shutdown_delay_s=0.2,
                                            host_keys=(machines[0].host_public_key(),)))
    ctx = CloudContext(settings.cloud, provider, Ledger(gputui_home / "ledger.sqlite3"), "spot", "me")  # type: ignore[arg-type]
    assigned: dict[str, HostSpec] = {}

    def host_spec(info: InstanceInfo) -> HostSpec:
        if info.instance_id not in assigned:
            machine = machines[len(assigned)]
            assigned[info.instance_id] = HostSpec(info.instance_id, machine.address, machine.port, "root",
                                                  cluster_nodes.user_key)
        return assigned[info.instance_id]

    def interrupt_now() -> None:  # on the watcher's poll that takes the notice: the instance goes away
        with provider._state("test") as state:
            state["instances"][next(iter(assigned))]["interrupt_at"] = time.time()

    def on(event: dict[str, Any]) -> None:
        # The program waits at step 3 (its gate, which never opens) until it is asked to stop.
        if event["event"] == "metrics" and event.get("step") == 3 and not imds.armed.is_set():
            imds.on_notice = interrupt_now
            imds.armed.set()

    code, gates = program_dir(tmp_path), tmp_path / "gates"
    gates.mkdir()
    command = ("python", "prog.py", "--steps", "6", "--gate-at", "3", "--gates", str(gates))
    cfg = RunSettings(command=command, workdir=str(code), env=(("OMP_NUM_THREADS", "1"),), device="cpu",
                      checkpoint_pull_s=3600.0, stop_grace_s=10.0).resolve()
    run = runs.create(tmp_path / "run")
    view = Seen(on)
    outcome = ClusterRun(run, cfg, settings, view, manager=SlaveManager(settings, ctx, host_spec=host_spec)).execute(False)
    seen = view.events
    kinds = [e["event"] for e in seen]
    assert outcome == "done", story(seen)
    assert imds.served.is_set()
    first, second = list(assigned)
    stopping = next(e for e in seen if e["event"] == "stopping")
    assert stopping["reason"] == "node_signalled" and first in stopping["message"]
    pulled = next(e for e in seen if e["event"] == "checkpoint_pulled")
    assert pulled["step"] == 3 and pulled["node"] == "master"  # rank 0 saved when should_stop() turned True
    replaced = next(e for e in seen if e["event"] == "node_replaced")
    assert (replaced["node"], replaced["by"]) == (first, second)
    resumed = next(e for e in seen if e["event"] == "resumed")
    assert (resumed["from_step"], resumed["lost_steps"], resumed["nodes"]) == (3, 0, 2), resumed
    assert kinds.index("stopping") < kinds.index("checkpoint_pulled") < kinds.index("node_replaced") \
        < kinds.index("resumed") < kinds.index("done")
    assert [e["attempt"] for e in seen if e["event"] == "cluster"] == [0, 1]
    assert next(e for e in seen if e["event"] == "done")["step"] == 6
    assert "stopping at step 3" in (run.path / "nodes" / "master" / "output.log").read_text()
    assert "resumed at step 3" in (run.path / "nodes" / second / "output.log").read_text()
    assert seen[-1]["event"] == "slaves_terminated" and seen[-1]["instances"] == [second]
    # The program run's cost is metered as a built-in net's: both slaves in the ledger, ended, and
    # the run's line there (gputui runs and gputui cost read these).
    records = {r.instance_id: r for r in ctx.ledger.instances()}
    assert records[first].ended_by == "interrupted" and records[second].ended_by == "run-end"
    assert not any(r.running for r in records.values())
    assert [(r[0], r[4]) for r in ctx.ledger.runs()] == [(run.run_id, "done")]
    assert wait_no_leftovers(str(run.path), *remote_run_dirs(run.run_id, *machines)) == []


def test_rank_0s_output_reaches_the_terminal_as_data_and_other_nodes_stay_in_their_logs() -> None:
    """A slave is not trusted: what its program prints is shown on the master's terminal without
    its control characters and escapes (off a terminal gputui passes a local program's bytes
    through; a slave's never). Only rank 0's node is shown; every node's line is in its log."""
    import io
    from types import SimpleNamespace

    from gputui.cluster.members import Node
    from gputui.cluster.programrun import ProgramRelay

    shown: list[tuple[str, str]] = []
    out = SimpleNamespace(program=lambda line, end: shown.append((line, end)), tick=lambda: None)
    ctx = SimpleNamespace(cfg=SimpleNamespace(metrics_regex=()), out=out)
    relay = ProgramRelay(ctx, clock=None)  # type: ignore[arg-type]
    rank0, other = Node("n0", "host", "10.0.0.1"), Node("n1", "host", "10.0.0.2")
    rank0.log, other.log = io.StringIO(), io.StringIO()
    relay.rank0 = "n0"
    relay.line(rank0, "\x1b]0;owned\x07epoch 1\x1b[2J 50%\r")
    relay.line(rank0, "done\x07")
    relay.line(other, "rank 1 says")
    assert shown == [("epoch 1 50%", "\r"), ("done", "\n")]
    assert rank0.log.getvalue() == "\x1b]0;owned\x07epoch 1\x1b[2J 50%\rdone\x07\n"  # the log: bytes as they came
    assert other.log.getvalue() == "rank 1 says\n"
