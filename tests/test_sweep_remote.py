"""Sweep workers on an SSH host (gputui.sweep.remote): a loopback sshd stands in for the host, which
is bootstrapped as a cluster slave is (this gputui as a wheel in a venv there) and runs
`venv/bin/python -m gputui worker` over the SSH channel."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui.sweep import scheduler as sched
from gputui.sweep import study as studies
from gputui.sweep.sim import SimSlot
from gputui.sweep.space import parse_text
from tests.proc_support import Child

from .cluster_fixture import ClusterNodes, cluster_nodes, cluster_wheel, pinned_wheel, trust, wait_no_leftovers  # noqa: F401
from .sshd_fixture import sshd_factory  # noqa: F401

WAIT = 240  # s: a bootstrap and a dozen tiny trials on a slow, busy 2-core machine


def host_table(server: Any, key: Path, name: str = "n0") -> str:
    return (f'[[hosts]]\nname = "{name}"\naddress = "{server.address}"\nport = {server.port}\nuser = "root"\n'
            f'identity_file = "{key}"\n')


def counted(trials: list[Any]) -> list[Any]:
    return [t for t in trials if studies.counted(t)]


def test_a_12_trial_sweep_over_2_local_workers_and_an_ssh_host_fills_the_study(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    import optuna

    server = cluster_nodes.node(0)
    trust(gputui_home, server)
    path = tmp_path / "s.toml"
    path.write_text(f'[run]\nmodel = "fast"\ndevice = "cpu"\ndata = "{medium_data}"\nepochs = 1\n\n'
                    f'{host_table(server, cluster_nodes.user_key)}\n'
                    '[sweep]\nname = "s"\ntrials = 12\nworkers = 2\nthreads = 1\npruner = "none"\n'
                    'lr = [1e-3, 3e-2]\nbatch_size = [32, 64]\n')
    with Child([sys.executable, "-m", "gputui", "sweep", "--json", str(path)], name="gputui sweep") as child:
        assert child.finish(WAIT) == 0, child.stderr
    ready = [e["slot"] for e in child.events if e.get("sweep") == "slot" and e.get("state") == "ready"]
    assert sorted(ready) == ["cpu-0", "cpu-1", "n0-cpu"], child.stderr  # one worker each, for all 12 trials

    study = optuna.load_study(study_name="s", storage=f"sqlite:///{gputui_home / 'sweeps' / 'sweeps.db'}")
    trials = study.get_trials()
    assert len(trials) == 12 and len(counted(trials)) == 12
    assert all(t.state.name == "COMPLETE" for t in trials), [(t.number, t.state, t.user_attrs) for t in trials]
    on_host = [t.number for t in trials if t.user_attrs["slot"] == "n0-cpu"]
    assert on_host, [t.user_attrs["slot"] for t in trials]
    # those trials ran there: their run directories (events included) are on the host
    assert server.home is not None
    remote = server.home / ".gputui-cluster" / "runs" / "sweep-s"
    assert all((remote / f"trial-{n:05d}" / "events.jsonl").is_file() for n in on_host), sorted(os.listdir(remote))
    assert not sweep_processes(gputui_home, server.home)  # every worker, here and there, ended with the sweep


def sweep_processes(*homes: Path, timeout: float = 30.0) -> list[str]:
    """Sweep workers and spot watchers still alive after up to `timeout` s whose command line or
    GPUTUI_HOME is under one of `homes` (this test's, or a host's): other tests' are not ours."""
    import time

    import psutil

    marks = [str(h) for h in homes]
    deadline = time.monotonic() + timeout
    while True:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if ("-m gputui worker" not in cmd and "gputui.cloud.watcher" not in cmd) \
                        or proc.info["status"] == psutil.STATUS_ZOMBIE:
                    continue
                where = cmd + " " + proc.environ().get("GPUTUI_HOME", "")
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if any(m in where for m in marks):
                found.append(cmd)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


class SweepLines:
    """A sweep view that keeps what it is told."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def sweep(self, kind: str, **fields: Any) -> None:
        self.lines.append((kind, fields))

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        pass

    def progress(self, p: Any) -> None:
        pass

    def close(self) -> None:
        pass


class DropOnFirstEval(SweepLines):
    """A sweep view; the host goes away as the SSH worker's reader takes the first `eval` event of
    a trial off the channel, before any later line of the worker is read. Dropping it at the
    scheduler's handling of that event came too late on a busy machine: the reader had already
    read the trial's result, and no trial of that host's was left to give back (seen once, in a
    fresh clone's whole suite)."""

    def __init__(self, server: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        import json

        from gputui.sweep.remote import SSHHandle

        super().__init__()
        self.server = server
        self.dropped_trial: int | None = None
        original = SSHHandle.lines
        view = self

        def lines(handle: SSHHandle) -> Any:
            for line in original(handle):
                if view.dropped_trial is None and '"eval"' in line:
                    message = json.loads(line)
                    if message.get("op") == "event" and message["data"].get("event") == "eval":
                        view.dropped_trial = message["trial"]
                        view.server.stop()  # listener and every connection: the host is gone
                yield line

        monkeypatch.setattr(SSHHandle, "lines", lines)


def test_a_host_that_drops_mid_trial_gives_the_trial_back_and_the_study_counts_each_once(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.sweep.remote import remote_slots

    server = cluster_nodes.node(1)
    trust(gputui_home, server)
    text = (f'[run]\nmodel = "fast"\ndevice = "cpu"\ndata = "{medium_data}"\nepochs = 1\nevals_per_epoch = 4\n\n'
            f'{host_table(server, cluster_nodes.user_key, "n1")}\n'
            '[sweep]\nname = "drop"\ntrials = 6\nthreads = 1\npruner = "none"\nlr = [1e-3, 3e-2]\n')
    profile, spec = parse_text(text, tmp_path / "drop.toml")
    ssh = remote_slots(profile, spec)
    assert [s.name for s in ssh] == ["n1-cpu"]
    sim = SimSlot("sim")
    view = DropOnFirstEval(server, monkeypatch)  # the only SSH slot is n1-cpu
    study = studies.create(spec)
    # the simulated slot waits for the SSH worker's first trial: it joins only after that trial started
    scheduler = sched.Scheduler(study, spec, profile.run, ssh, view)
    original = scheduler._start

    def start(worker: Any, trial: Any) -> None:
        original(worker, trial)
        if worker.slot is ssh[0] and not any(w.slot is sim for w in scheduler.workers.values()):
            scheduler._spawn(sim)

    scheduler._start = start  # type: ignore[method-assign]
    progress = scheduler.run()

    assert view.dropped_trial is not None, view.lines
    lost = [f for k, f in view.lines if k == "slot" and f.get("state") == "lost"]
    assert lost and lost[0]["slot"] == "n1-cpu" and "lost" in str(lost[0]["message"]), lost
    requeued = [f for k, f in view.lines if k == "requeued"]
    # The trial the host was running when its loss was noticed goes back: the one whose evaluation
    # dropped it, or (on a busy machine, where the worker finished that trial before its connection
    # was seen gone) the next one it had started there. Either way exactly one, started on n1.
    assert len(requeued) == 1, requeued
    back = requeued[0]["trial"]
    on_host = [f["trial"] for k, f in view.lines if k == "trial" and f.get("slot") == "n1-cpu"]
    assert back in on_host and back >= view.dropped_trial, (back, on_host)
    assert progress.done == 6 and len(counted(study.get_trials())) == 6 and len(study.get_trials()) == 6
    again = study.get_trials()[back]
    assert again.state.name == "COMPLETE" and again.user_attrs["attempts"] == 2 and again.user_attrs["slot"] == "sim"
    assert not wait_no_leftovers(str(server.home))  # the host's worker died with its connection


@pytest.fixture(autouse=True)
def _no_agent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)


def test_a_gpu_host_gets_trials_per_gpu_workers_on_each_of_its_gpus(sshd_factory: Any, gputui_home: Path,
                                                                     tmp_path: Path) -> None:
    from gputui.cluster.sshnode import SlaveConnection
    from gputui.config.hosts import HostSpec
    from gputui.sweep.remote import RemoteHost, host_slots, remote_gpu_count

    server = sshd_factory("r535-a100x8")  # nvidia-smi there answers for eight A100s
    trust(gputui_home, server)
    conn = SlaveConnection(HostSpec("rig", server.address, server.port, "root", sshd_factory.user_key)).open_or_raise()
    try:
        gpus = remote_gpu_count(conn)
    finally:
        conn.close()
    assert gpus == 8
    text = '[run]\nmodel = "fast"\n[sweep]\nname = "g"\ntrials = 4\ntrials_per_gpu = 2\nlr = [1e-3, 1e-1]\n'
    _profile, spec = parse_text(text, tmp_path / "g.toml")
    host = RemoteHost("rig", lambda: None, None, None, gpus, usd_per_hour=16.0)  # a cloud slave's rate, shared
    slots = host_slots(host, spec, spec.name)
    assert [s.device for s in slots] == [f"cuda:{g}" for g in range(8) for _ in range(2)]
    assert len({s.name for s in slots}) == 16 and slots[0].name == "rig-cuda0-0"
    assert all(s.usd_per_hour == 1.0 for s in slots)
    cpu = host_slots(RemoteHost("box", lambda: None, None, None, 0), spec, spec.name)
    assert [(s.name, s.device, s.threads) for s in cpu] == [("box-cpu", "cpu", 1)]  # a CPU host: one worker


class KillAtFirstEpoch:
    """The SSH worker of `home`'s host is SIGKILLed as its reader takes the first `epoch` event of a
    trial off the channel (its checkpoint is written by then), before any later line of the worker
    is read. Killing at the scheduler's handling of that event instead came too late on a busy
    machine: the reader had already read the trial's result, and there was no trial left to pull."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
        import json

        from gputui.sweep.remote import SSHHandle

        self.trial: int | None = None
        original = SSHHandle.lines
        kill = self

        def lines(handle: SSHHandle) -> Any:
            for line in original(handle):
                if kill.trial is None and '"epoch"' in line:
                    message = json.loads(line)
                    if message.get("op") == "event" and message["data"].get("event") == "epoch":
                        kill.trial = message["trial"]
                        kill.kill(home)
                yield line

        monkeypatch.setattr(SSHHandle, "lines", lines)

    @staticmethod
    def kill(home: Path) -> None:
        import psutil

        found = [p for p in psutil.process_iter(["cmdline"])
                 if "-m gputui worker" in " ".join(p.info["cmdline"] or []) and str(home) in " ".join(p.info["cmdline"] or [])]
        assert len(found) == 1, found
        found[0].kill()


def test_a_remote_worker_killed_mid_trial_hands_its_checkpoint_back_and_the_retry_resumes_from_it(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.sweep.remote import SSHHandle, remote_slots

    server = cluster_nodes.node(2)
    trust(gputui_home, server)
    text = (f'[run]\nmodel = "fast"\ndevice = "cpu"\ndata = "{medium_data}"\nepochs = 4\nbatch_size = 512\n'
            f'checkpoint_every_s = 0\n\n{host_table(server, cluster_nodes.user_key, "n2")}\n'
            '[sweep]\nname = "ck"\ntrials = 3\nthreads = 1\npruner = "none"\nlr = [1e-3, 3e-2]\n')
    profile, spec = parse_text(text, tmp_path / "ck.toml")
    ssh = remote_slots(profile, spec)
    sim = SimSlot("sim")
    assert server.home is not None
    # The host's first worker waits in its trial's second epoch (8 steps an epoch: 4,096 images
    # at 512) until it is killed, so it can never have sent its trial's result before the kill
    # below, however busy the master; the workers after it run freely.
    started: list[SSHHandle] = []
    real_init = SSHHandle.__init__

    def init(handle: SSHHandle, host: Any, argv: Any, env: dict[str, str], *rest: Any, **more: Any) -> None:
        if not started:
            env = {**env, "GPUTUI_TEST_PAUSE_AT_STEP": "10"}
        started.append(handle)
        real_init(handle, host, argv, env, *rest, **more)

    monkeypatch.setattr(SSHHandle, "__init__", init)
    killer = KillAtFirstEpoch(monkeypatch, server.home)
    view = SweepLines()
    study = studies.create(spec)
    scheduler = sched.Scheduler(study, spec, profile.run, ssh, view)
    original = scheduler._start

    def start(worker: Any, trial: Any) -> None:  # the other slot joins once the remote worker has a trial
        original(worker, trial)
        if worker.slot is ssh[0] and not any(w.slot is sim for w in scheduler.workers.values()):
            scheduler._spawn(sim)

    scheduler._start = start  # type: ignore[method-assign]
    progress = scheduler.run()

    killed = killer.trial
    assert killed is not None, view.lines
    local = studies.trial_dir("ck", killed)
    said = [f for k, f in view.lines if k in ("slot", "warning")]
    assert (local / "ckpt.pt").is_file(), said  # pulled back from the host after the worker's death
    retry = [f for k, f in view.lines if k == "trial" and f["trial"] == killed and f["attempt"] == 2]
    assert retry and retry[0]["resume"] is True, view.lines  # the retry goes on from it
    assert progress.done == 3 and len(counted(study.get_trials())) == 3
