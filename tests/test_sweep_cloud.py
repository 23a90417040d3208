"""A sweep on cloud slaves it starts itself (gputui.sweep.cloudslots), on the simulated cloud: the
slave is launched (spot), its host key learnt from its console, reached over SSH (a loopback sshd
stands in for the instance), bootstrapped, given a worker with the spot watcher beside it; the
budget stops new trials; the slave is released at the end and the ledger names the sweep."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster.manager import SlaveManager
from gputui.config.hosts import HostSpec
from gputui.model.cloud import ENDED_STATES, InstanceInfo
from gputui.sweep import scheduler as sched
from gputui.sweep import study as studies
from gputui.sweep.cloudslots import CloudFleet, sweep_cluster
from gputui.sweep.hostcode import program_code
from gputui.sweep.sim import SimSlot
from gputui.sweep.space import parse_text

from .test_cluster_cloud import FakeImds, imds  # noqa: F401 - the fake IMDSv2 and its fixture
from .cluster_fixture import ClusterNodes, cluster_nodes, cluster_wheel, pinned_wheel  # noqa: F401
from .test_sweep_remote import sweep_processes
from .moto_fixture import public_key_line

TRIAL_S = 600.0  # each trial's start moves the sweep's clock on by this much


class Seen:
    """A sweep view that keeps what it was shown; each trial's start moves the hand clock on."""

    def __init__(self, now: list[float], on_eval: Any = None) -> None:
        self.now = now
        self.on_eval = on_eval
        self.lines: list[tuple[str, dict[str, Any]]] = []

    def sweep(self, kind: str, **fields: Any) -> None:
        self.lines.append((kind, fields))

    def run_event(self, trial: int, slot: str, event: dict[str, Any]) -> None:
        if event.get("event") == "start":
            self.now[0] += TRIAL_S
        if event.get("event") == "eval" and self.on_eval is not None:
            self.on_eval(trial, slot)

    def progress(self, p: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [f for k, f in self.lines if k == kind]


def fleet(cluster_nodes: ClusterNodes, medium_data: Path, tmp_path: Path, gputui_home: Path, name: str,
          node: int, run: str = "epochs = 1\n", program: str | None = None) -> tuple[Any, Any, SimProvider, CloudFleet]:
    """A sweep profile with one simulated spot slave (a loopback sshd); `program`: the [run] table's
    keys of a program sweep instead of the fast net's."""
    machine = cluster_nodes.node(node)
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    table = program if program is not None else f'model = "fast"\ndevice = "cpu"\ndata = "{medium_data}"\n{run}'
    text = (f'[run]\n{table}\n'
            f'[cloud]\nbudget_usd = 50.0\nzones = ["us-east-1a"]\nssh_cidr = "198.51.100.7/32"\npublic_key = "{key}"\n'
            f'count = 1\n\n[sweep]\nname = "{name}"\ntrials = 10\nthreads = 1\npruner = "none"\n'
            + ('lr = [1e-3, 3e-2]\n' if program is None else '\n[sweep.params]\nlr = {low = 1e-3, high = 3e-2, log = true}\n'))
    profile, spec = parse_text(text, tmp_path / f"{name}.toml")
    settings = sweep_cluster(profile, spec)
    provider = SimProvider(script=SimScript(seed=1, launch_delay_s=0.3, shutdown_delay_s=0.1,
                                            host_keys=(machine.host_public_key(),)))
    ctx = CloudContext(settings.cloud, provider, Ledger(gputui_home / "ledger.sqlite3"), settings.name, "me")

    def host_spec(info: InstanceInfo) -> HostSpec:  # the instance "is" the loopback sshd
        return HostSpec(info.instance_id, machine.address, machine.port, "root", cluster_nodes.user_key)

    code = program_code(profile, spec, tmp_path / "logs")
    return profile, spec, provider, CloudFleet(profile, spec, SlaveManager(settings, ctx, host_spec=host_spec),
                                               ssh_wait_s=60, code=code)


def test_a_budgeted_sweep_on_a_cloud_slave_stops_at_the_budget_and_releases_it(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    profile, spec, provider, cloud = fleet(cluster_nodes, medium_data, tmp_path, gputui_home, "cb", 0)
    slots = cloud.start()
    assert len(slots) == 1 and len(cloud.started) == 1 and slots[0].name == f"{cloud.started[0]}-cpu"
    rate = slots[0].usd_per_hour
    assert rate > 0
    # trials of TRIAL_S on the sweep's clock: one may start while spent + rate x TRIAL_S <= budget,
    # so with 3.5 trials' worth of money, 3 start and the 4th would pass it
    budget = rate * 3.5 * TRIAL_S / 3600
    spec = replace(spec, budget_usd=budget)
    now = [1000.0]
    view = Seen(now)
    study = studies.create(spec)
    progress = sched.Scheduler(study, spec, profile.run, slots, view, clock=lambda: now[0]).run()

    assert progress.done == 3 and len([t for t in study.get_trials() if studies.counted(t)]) == 3, view.lines
    assert len(view.of("budget")) == 1 and progress.spent_usd <= budget
    assert {f["slot"] for f in view.of("trial_done")} == {slots[0].name}
    # released at the end: terminated in the simulated cloud, closed in the ledger under the sweep's name
    ids = cloud.started
    assert cloud.released == ids
    assert all(i.state in ENDED_STATES for i in provider.describe(ids))
    with Ledger(gputui_home / "ledger.sqlite3") as ledger:
        records = ledger.instances(cluster="sweep-cb")
        runs = [r for r in ledger.runs() if r[0] == "sweep-cb"]
    assert [r.instance_id for r in records] == ids and all(r.terminated is not None for r in records)
    assert records[0].ended_by == "run-end"
    assert runs and runs[0][1] == "sweep-cb" and runs[0][3] is not None  # the sweep's run, ended
    assert not sweep_processes(gputui_home, cloud.hosts[0].boot.base)


def test_a_spot_notice_ends_the_cloud_worker_and_its_trial_runs_again_elsewhere(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path,
        imds: FakeImds) -> None:
    profile, spec, provider, cloud = fleet(cluster_nodes, medium_data, tmp_path, gputui_home, "spot", 1,
                                           run="epochs = 4\nevals_per_epoch = 4\n")
    spec = replace(spec, trials=5)
    cloud.imds_url = imds.url
    slots = cloud.start()
    spot = slots[0]
    sim = SimSlot("sim", gate=imds.served)  # its trials end once the notice was served: the sweep waits for it
    noticed: list[int] = []

    def on_eval(trial: int, slot: str) -> None:  # the spot market takes the slave back mid-trial
        if slot == spot.name and not noticed:
            noticed.append(trial)
            imds.armed.set()

    now = [0.0]
    view = Seen(now, on_eval)
    study = studies.create(spec)
    scheduler = sched.Scheduler(study, spec, profile.run, [spot], view)
    original = scheduler._start

    def start(worker: Any, trial: Any) -> None:  # the other slot joins once the cloud worker has a trial
        original(worker, trial)
        if worker.slot is spot and not any(w.slot is sim for w in scheduler.workers.values()):
            scheduler._spawn(sim)

    scheduler._start = start  # type: ignore[method-assign]
    progress = scheduler.run()

    assert noticed and imds.served.is_set(), view.lines
    lost = [f for f in view.of("slot") if f.get("state") == "lost" and f["slot"] == spot.name]
    assert lost and "spot interruption notice" in str(lost[0]["message"]), lost
    requeued = view.of("requeued")  # the trial the cloud worker held then (the noticed one, or its next)
    assert len(requeued) == 1 and requeued[0]["slot"] == spot.name, requeued
    again = study.get_trials()[requeued[0]["trial"]]
    assert again.state.name == "COMPLETE" and again.user_attrs["attempts"] == 2 and again.user_attrs["slot"] == "sim"
    assert progress.done == 5 and len([t for t in study.get_trials() if studies.counted(t)]) == 5
    assert cloud.released == cloud.started
    assert not sweep_processes(gputui_home, cloud.hosts[0].boot.base)


def test_a_program_sweep_on_a_cloud_slave_sends_the_code_there_once_and_scores_each_trial(
        cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path) -> None:
    """The user's own program swept on a slave the sweep starts: the workdir goes to the slave once
    (after its bootstrap), each trial runs in that code directory and scores what the program
    reports, and the slave is released at the end."""
    from .test_sweep_program_hosts import PROGRAM, SCORING, expected_value

    work = tmp_path / "code"
    work.mkdir()
    (work / "train.py").write_text(PROGRAM.format(local="(no local slot)", marker=str(tmp_path / "started"), hold=0))
    (work / "scoring.py").write_text(SCORING)
    program = (f'command = ["python", "train.py", "--lr", "{{lr}}"]\ndevice = "cpu"\nworkdir = "{work}"\n'
               'objective = "val_acc"\ndirection = "maximize"\n')
    profile, spec, provider, cloud = fleet(cluster_nodes, medium_data, tmp_path, gputui_home, "prog", 3,
                                           program=program)
    spec = replace(spec, trials=3)
    assert cloud.code is not None
    slots = cloud.start()
    assert len(slots) == 1 and len(cloud.started) == 1
    view = Seen([0.0])
    study = studies.create(spec)
    progress = sched.Scheduler(study, spec, profile.run, slots, view).run()

    trials = study.get_trials()
    assert progress.done == 3 and [t.state.name for t in trials] == ["COMPLETE"] * 3, view.lines
    for t in trials:
        assert t.value == expected_value(t.params["lr"]), (t.number, t.params, t.value)
        assert t.user_attrs["slot"] == slots[0].name
    code = view.of("code")
    assert len(code) == 1 and code[0]["sent_files"] == 2, code  # once, before the slave's worker started
    code_dir = Path(code[0]["code_dir"])
    assert sorted(json.loads((code_dir / ".gputui-sync.json").read_text())["files"]) == ["scoring.py", "train.py"]
    assert cloud.released == cloud.started
    assert all(i.state in ENDED_STATES for i in provider.describe(cloud.started))
    assert not sweep_processes(gputui_home, cloud.hosts[0].boot.base)
