"""The stop matrix: however `gputui run` is stopped, once the command has ended no process of
the run is left, on this machine or on a cluster node.

Each path is run for a local DDP run (torchrun, 2 gloo processes) and for a 2-node loopback
cluster (the master's own node and n0 behind a real sshd on 127.0.0.2). The paths: SIGINT
once, twice and (on the cluster, whose teardown it meets) three times, SIGTERM, SIGKILL of the command, its stdout closed by the reader
(`| head -c 100`), and a rank stuck in a collective. Every signal follows an event of the run:
the first one its first `step`; each further one the run's acknowledgement of the one before.
A cluster run acknowledges each stop request with a `stopping` event ("stopping: N slaves
being released"), so a third SIGINT comes during its teardown. A DDP run's acknowledgement is
a trainer's signal handler running, or the end of its output (its second SIGINT kills at once).

A test hook, written by this module as a `sitecustomize` on the runs' PYTHONPATH, acts in the
trainers (torchrun's workers) only: it notes each SIGINT/SIGTERM their handlers receive, and
with GPUTUI_TEST_STUCK_RANK it makes one rank stop in its next all_reduce for ever (ignoring
signals), once the test creates the file `stick`: its peers then wait inside the collective.
Remote nodes do not inherit the hook: on the cluster the stuck rank is the master's, and n0's
rank waits in the collective, under `gputui.cluster.node`, behind SSH.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from gputui.model.supervisor import GRACE_ENV, GRACE_S

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_profile, cluster_wheel, pinned_wheel, trust,
)
from .conftest import cli_env
from .proc_support import Child, wait_until
from .test_run_network import SECRETS, assert_loopback_only, environments, listening, run_processes

pytestmark = pytest.mark.timeout(240)

# A run whose processes are all gone once the command ended are gone within this (a slow machine's
# scheduling, not a grace period: nothing of the run should be alive when the command ends).
GONE_S = 15.0
# A stop that waits for a grace period: the supervisor's (longer than torchrun's own 30 s), the
# cluster's wait for its nodes after it, and time for a slow machine.
GRACEFUL_S = GRACE_S + 10 + 45
# The supervisor's grace in the run whose stuck rank only the grace ends (GPUTUI_TEST_GRACE_S):
# still gputui's own bound (torchrun's is made 600 s), only shorter than a user's 35 s. The runs
# stopped twice keep the real grace: their second Ctrl-C must come while the first stop is going.
STUCK_GRACE_S = 4.0

HOOK = r'''
import os

_dir = os.environ.get("GPUTUI_TEST_HOOK_DIR")
if _dir and "RANK" in os.environ and "LOCAL_RANK" in os.environ:  # a trainer started by torchrun
    import signal as _signal
    import time as _time

    _rank = os.environ["RANK"]

    def _note(name, line):
        with open(os.path.join(_dir, name), "a") as fh:
            fh.write(line + "\n")

    _signal_signal = _signal.signal

    def _noting(sig, handler):
        if sig in (_signal.SIGINT, _signal.SIGTERM) and callable(handler):
            inner = handler

            def handler(signum, frame):
                _note("signals", "%s %d %s" % (_rank, os.getpid(), _signal.Signals(signum).name))
                return inner(signum, frame)
        return _signal_signal(sig, handler)

    _signal.signal = _noting

    if os.environ.get("GPUTUI_TEST_STUCK_RANK") in (_rank, "any"):
        import torch.distributed as _tdist

        _all_reduce = _tdist.all_reduce

        def _stuck_all_reduce(*args, **kwargs):
            if os.path.exists(os.path.join(_dir, "stick")):
                _note("stuck", "%s %d" % (_rank, os.getpid()))
                while True:  # never joins: its peers wait in the collective; signals change nothing
                    _time.sleep(3600)
            return _all_reduce(*args, **kwargs)

        _tdist.all_reduce = _stuck_all_reduce
'''


@dataclass
class Hooks:
    """The hook's directory: what the trainers noted, and the file that makes a rank stick."""

    path: Path

    def env(self, stuck: str | None = None, grace: float | None = None, **more: str) -> dict[str, str]:
        extra = {"PYTHONPATH": os.pathsep.join(p for p in (str(self.path), os.environ.get("PYTHONPATH", "")) if p),
                 "GPUTUI_TEST_HOOK_DIR": str(self.path), "GPUTUI_STEP_EVENT_INTERVAL": "0.05", **more}
        if stuck is not None:
            extra["GPUTUI_TEST_STUCK_RANK"] = stuck
            # torchrun's own SIGTERM -> SIGKILL wait for its workers, 30 s by default, made longer than
            # gputui's: what ends a stuck run must be gputui's own bound, whatever torchrun does.
            extra["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = "600"
        if grace is not None:  # gputui's grace (35 s for users) made short: the bound acts the same
            extra[GRACE_ENV] = repr(grace)
        return cli_env(**extra)

    def lines(self, name: str) -> list[str]:
        try:
            return (self.path / name).read_text().splitlines()
        except FileNotFoundError:
            return []

    def stick(self) -> None:
        (self.path / "stick").touch()


@pytest.fixture()
def hooks(tmp_path: Path) -> Hooks:
    path = tmp_path / "hooks"
    path.mkdir()
    (path / "sitecustomize.py").write_text(HOOK)
    return Hooks(path)


@dataclass
class Run:
    """A `gputui run --json` to stop: its command, and what names its processes (here and on nodes)."""

    kind: str
    argv: list[str]
    markers: list[str]
    stuck_rank: str  # which rank the hook can make stick (remote nodes have no hook)
    acks: tuple[str, ...]  # what shows that the run took a signal: "stopping", "trainer signalled", "ended"
    logs: list[Path] = field(default_factory=list)

    def processes(self) -> list[psutil.Process]:
        """Live processes whose command line names one of the run's markers."""
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if any(m in cmd for m in self.markers) and proc.info["status"] != psutil.STATUS_ZOMBIE:
                    found.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        return found

    def leftovers(self, timeout: float) -> list[psutil.Process]:
        """Processes of the run still alive after up to `timeout` s (none: at once)."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.processes()
            if not found or time.monotonic() > deadline:
                return found
            time.sleep(0.1)

    def assert_none_left(self, timeout: float, after: str) -> None:
        """Fails with the leftovers' command lines (and kills them: the next test starts clean)."""
        found = self.leftovers(timeout)
        if not found:
            return
        lines = []
        for proc in found:
            try:
                lines.append(f"{proc.pid} (parent {proc.ppid()}): {' '.join(proc.cmdline())}")
                proc.kill()
            except psutil.NoSuchProcess:
                continue
        raise AssertionError(f"{len(found)} process(es) of the {self.kind} run alive {timeout:g} s after {after}:\n"
                             + "\n".join(lines) + self.tails())

    def tails(self) -> str:
        out = ""
        for log in self.logs:
            for path in sorted(log.glob("*.log")) if log.is_dir() else [log]:
                if path.is_file():
                    out += f"\n--- {path}\n{path.read_text(errors='replace')[-2500:]}"
        return out


COMMON = ["--model", "fast", "--epochs", "500", "--batch-size", "32", "--seed", "1", "--device", "cpu", "--threads", "1"]


@pytest.fixture(params=["ddp", "cluster"])
def run(request: pytest.FixtureRequest, small_data: Path, tmp_path: Path) -> Iterator[Run]:
    """A run that trains far longer than any test lasts: every path stops it. Whatever of it a
    failed test leaves is killed afterwards, so that the next test starts clean."""
    made = _run(request, small_data, tmp_path)
    yield made
    for proc in made.processes():
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass


def _run(request: pytest.FixtureRequest, small_data: Path, tmp_path: Path) -> Run:
    run_dir = tmp_path / f"stop-{request.node.name.split('[')[0][5:40]}"
    base = [sys.executable, "-m", "gputui", "run", "--json", "--data", str(small_data), *COMMON,
            "--run-dir", str(run_dir)]
    if request.param == "ddp":
        return Run("ddp", base + ["--strategy", "ddp", "--nproc", "2"], [str(run_dir)], "1",
                   ("stopping", "trainer signalled", "ended"), [run_dir / "launcher.log"])
    request.getfixturevalue("pinned_wheel")
    nodes: ClusterNodes = request.getfixturevalue("cluster_nodes")
    node = nodes.shared_node(0)
    trust(request.getfixturevalue("gputui_home"), node)
    profile = cluster_profile(tmp_path / "cluster.toml", [node], nodes.user_key, {"threads": 1})
    assert node.home is not None
    # The node's processes name its HOME (its venv's python, its run directories).
    return Run("cluster", base + ["--profile", str(profile)], [str(run_dir), str(node.home)], "any",
               ("stopping",), [run_dir / "nodes"])


def start(run: Run, hooks: Hooks, stuck: bool = False, grace: float | None = None) -> Child:
    return Child(run.argv, env=hooks.env(run.stuck_rank if stuck else None, grace), name=f"gputui run ({run.kind})")


def first_step(run: Run, child: Child) -> None:
    try:
        child.wait_for(lambda e: e.get("event") == "step", 180, "the first step event")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{run.tails()}") from None


def signal_and_wait_ack(run: Run, child: Child, hooks: Hooks, sig: int, timeout: float = 60.0) -> str:
    """Send `sig` to the command, then wait until the run shows it took it, in one of the ways
    `run.acks` allows: a new `stopping` event, a trainer's handler noting a signal, or the end
    of its output. Which one, as a word. (Two signals sent before the first is handled would be
    one: a process has one pending signal of a kind.)"""
    stopping = child.kinds().count("stopping")
    noted = len(hooks.lines("signals"))
    child.proc.send_signal(sig)
    deadline = time.monotonic() + timeout
    while True:
        if child.kinds().count("stopping") > stopping:
            return "stopping"
        if "trainer signalled" in run.acks and len(hooks.lines("signals")) > noted:
            return "trainer signalled"
        try:
            child.wait_for(lambda e: e.get("event") == "stopping", 0.2, "a stopping event")
            return "stopping"
        except AssertionError as exc:
            if "output ended" in str(exc):
                if "ended" in run.acks:
                    return "ended"
                raise AssertionError(f"the {run.kind} run ended without a `stopping` event for "
                                     f"{signal.Signals(sig).name}; {child._seen()}{run.tails()}") from None
        if time.monotonic() > deadline:
            raise AssertionError(f"the {run.kind} run showed none of {run.acks} for {signal.Signals(sig).name} "
                                 f"within {timeout:g} s; {child._seen()}{run.tails()}")


def finish(run: Run, child: Child, timeout: float, what: str) -> int:
    try:
        return child.finish(timeout, what)
    except AssertionError as exc:
        raise AssertionError(f"{exc}{run.tails()}") from None


def no_traceback(child: Child) -> None:
    assert "Traceback" not in child.stderr, child.stderr[-3000:]


# -- the paths -----------------------------------------------------------------------------


def stick(run: Run, child: Child, hooks: Hooks) -> None:
    """Make the hooked rank stop in its next all_reduce, and wait until it has."""
    hooks.stick()
    wait_until(lambda: hooks.lines("stuck"), 120, "a rank to stick in its all_reduce",
               detail=lambda: child._seen() + run.tails())


@pytest.mark.parametrize(("run", "times"), [("ddp", 1), ("cluster", 1), ("ddp", 2), ("cluster", 2), ("cluster", 3)],
                         indirect=["run"])
def test_sigint(run: Run, hooks: Hooks, times: int) -> None:
    """Ctrl-C once: the run checkpoints and stops. Twice: it stops at once. Three times (a
    cluster: a DDP run is gone after the second): the third comes while the run tears down and
    releases its slaves, and changes nothing about what is left. For two and three, a rank is
    stuck in a collective, so that the stop is still under way when the next Ctrl-C comes (a
    healthy run is gone by then)."""
    with start(run, hooks, stuck=times > 1) as child:
        first_step(run, child)
        if times > 1:
            stick(run, child, hooks)
        for k in range(times):
            if k < times - 1:
                signal_and_wait_ack(run, child, hooks, signal.SIGINT)
            else:
                child.proc.send_signal(signal.SIGINT)
        code = finish(run, child, GRACEFUL_S, f"the end of the run after {times} SIGINT(s)")
    if times == 1:
        assert code == 0 and "interrupted" in child.kinds(), child._seen()
    no_traceback(child)
    run.assert_none_left(GONE_S, f"{times} SIGINT(s) ended the command")


def test_sigterm(run: Run, hooks: Hooks) -> None:
    with start(run, hooks) as child:
        first_step(run, child)
        child.proc.send_signal(signal.SIGTERM)
        code = finish(run, child, GRACEFUL_S, "the end of the run after SIGTERM")
    assert code == 0 and "interrupted" in child.kinds(), child._seen()
    no_traceback(child)
    run.assert_none_left(GONE_S, "SIGTERM ended the command")


def test_sigkill_of_the_command(run: Run, hooks: Hooks) -> None:
    """The command cannot clean up: its processes notice (parent death, a closed pipe or
    channel) and end within the grace period."""
    with start(run, hooks) as child:
        first_step(run, child)
        child.proc.send_signal(signal.SIGKILL)
        child.proc.wait(30)
    run.assert_none_left(GRACEFUL_S, "the command was SIGKILLed")


def test_stdout_closed_by_its_reader(run: Run, hooks: Hooks) -> None:
    """`gputui run --json ... | head -c 100`: the reader goes away after the first step event.
    (A DDP run is also checked while it trains: every socket of the run listens on loopback,
    and no worker inherited a credential; a cluster run is, in tests/test_run_network.py.)"""
    proc = subprocess.Popen(run.argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=hooks.env(**SECRETS))
    sockets, workers = [], []
    try:
        assert proc.stdout is not None and proc.stderr is not None
        seen, deadline = b"", time.monotonic() + 180
        while b'"event": "step"' not in seen:
            assert time.monotonic() < deadline and proc.poll() is None, f"no step event: {seen[-800:]!r}{run.tails()}"
            if select.select([proc.stdout], [], [], 0.5)[0]:
                seen += os.read(proc.stdout.fileno(), 65536)
        if run.kind == "ddp":
            procs = run_processes(proc.pid)
            sockets = listening(procs + [psutil.Process(proc.pid)])
            workers = [e for e in environments(procs) if "RANK" in e]
        proc.stdout.close()  # the next event the command writes breaks the pipe
        try:
            proc.wait(GRACEFUL_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the {run.kind} run went on {GRACEFUL_S:g} s after its stdout was closed"
                                 f"{run.tails()}") from None
        err = proc.stderr.read().decode(errors="replace")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert "Traceback" not in err, err[-3000:]
    run.assert_none_left(GONE_S, "the reader closed the command's stdout and the command ended")
    if run.kind == "ddp":
        assert sockets, "no listening socket found: the check would pass vacuously"
        assert_loopback_only(sockets)
        assert len(workers) == 2
        for env in workers:
            assert env.get("GPUTUI_KEEP_ME") == "kept"
            assert not {"AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "SSH_AUTH_SOCK", "GITHUB_TOKEN"} & set(env)


def test_a_rank_stuck_in_a_collective(run: Run, hooks: Hooks) -> None:
    """One rank never joins the next all_reduce, and ignores signals; its peer waits inside the
    collective (gloo's own timeout is 30 minutes), and torchrun would wait 10 minutes before its
    SIGKILL. One SIGINT: gputui's grace ends, and every process of the run goes with SIGKILL."""
    with start(run, hooks, stuck=True, grace=STUCK_GRACE_S) as child:
        first_step(run, child)
        stick(run, child, hooks)
        child.proc.send_signal(signal.SIGINT)
        code = finish(run, child, GRACEFUL_S, "the end of the run with a stuck rank")
    no_traceback(child)
    assert code in (0, 1), child._seen()
    run.assert_none_left(GONE_S, "the command with a stuck rank ended")


# -- the matrix's own checks ----------------------------------------------------------------


def test_the_hook_notes_the_signals_of_trainers_only(hooks: Hooks, tmp_path: Path) -> None:
    """The hook acts in a trainer (RANK and LOCAL_RANK set) and nowhere else."""
    script = ("import os, signal; signal.signal(signal.SIGTERM, lambda s, f: None); "
              "os.kill(os.getpid(), signal.SIGTERM); print('ok')")
    env = hooks.env()
    plain = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert plain.stdout.strip() == "ok" and hooks.lines("signals") == []
    ranked = subprocess.run([sys.executable, "-c", script], env={**env, "RANK": "3", "LOCAL_RANK": "0"},
                            capture_output=True, text=True, timeout=60)
    assert ranked.stdout.strip() == "ok", ranked.stderr
    assert [line.split()[::2] for line in hooks.lines("signals")] == [["3", "SIGTERM"]]


def test_leftovers_are_found_by_their_marker(tmp_path: Path) -> None:
    """The check can fail: a process naming the marker is a leftover until it ends."""
    marker = str(tmp_path / "marker-run")
    proc = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()", marker])
    try:
        run = Run("probe", [], [marker], "1", ())
        wait_until(lambda: run.leftovers(0), 30, "the probe to be seen")
        with pytest.raises(AssertionError, match="marker-run"):
            run.assert_none_left(0.2, "nothing")
        assert proc.wait(30) == -signal.SIGKILL  # a leftover found is killed
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
    assert run.leftovers(GONE_S) == []
