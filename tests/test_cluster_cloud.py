"""A cluster run with a cloud spot slave: started on demand (simulated cloud), reached over
SSH (a loopback sshd stands in for the instance), interrupted by a spot notice (a fake
instance-metadata service on loopback, read by gputui's watcher on the slave), replaced by
a new slave, resumed from the checkpoint, and the slaves terminated at the end."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from gputui.runs import store as runs
from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster.launch import ClusterRun
from gputui.cluster.manager import SlaveManager
from gputui.cluster.settings import cluster_settings
from gputui.config.hosts import HostSpec
from gputui.model.cloud import InstanceInfo
from gputui.config.run import RunSettings
from gputui.config.profile import parse_profile

from .cluster_fixture import (  # noqa: F401 - fixtures
    ClusterNodes, cluster_nodes, cluster_wheel, pinned_wheel, remote_run_dirs, wait_no_leftovers,
)
from .moto_fixture import public_key_line


class FakeImds:
    """IMDSv2 on 127.0.0.1: a token, and one spot interruption notice once armed. `on_notice` runs
    when the watcher's poll takes the notice, before the answer leaves: what the notice says
    happens to the instance happens on that poll."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.served = threading.Event()
        self.on_notice: Callable[[], None] = lambda: None
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:  # noqa: N802
                self._reply(200, b"token")

            def do_GET(self) -> None:  # noqa: N802
                if self.path.endswith("spot/instance-action") and owner.armed.is_set() and not owner.served.is_set():
                    owner.on_notice()
                    owner.served.set()
                    self._reply(200, json.dumps({"action": "terminate", "time": "2030-01-01T00:00:00Z"}).encode())
                else:
                    self._reply(404, b"")

            def _reply(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture()
def imds() -> Iterator[FakeImds]:
    server = FakeImds()
    try:
        yield server
    finally:
        server.server.shutdown()


def trainers(run_dir: Path) -> list[psutil.Process]:
    """The master node's training processes (not torchrun or the node supervisor, which name the run too)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "-m gputui.cluster.worker" in cmd and str(run_dir) in cmd and "gputui.train.launch" not in cmd \
                and "gputui.cluster.node" not in cmd:
            found.append(proc)
    return found


class Events:
    """The run's view: keeps the events; at the first epoch the spot market takes the slave back."""

    def __init__(self, on_epoch: Any) -> None:
        self.events: list[dict[str, Any]] = []
        self.on_epoch = on_epoch

    def show(self, event: dict[str, Any]) -> None:
        self.events.append(event)
        if event["event"] == "epoch" and event["epoch"] == 1:
            self.on_epoch()

    def close(self) -> None:
        pass


def test_a_spot_slave_is_started_interrupted_replaced_and_the_run_resumes(
    cluster_nodes: ClusterNodes, pinned_wheel: Path, medium_data: Path, tmp_path: Path, gputui_home: Path,
    imds: FakeImds, monkeypatch: pytest.MonkeyPatch,
) -> None:
    machines = [cluster_nodes.node(0), cluster_nodes.node(1)]  # what the first and the second instance "are"
    # No key is trusted beforehand: the master learns each slave's from its console output.
    monkeypatch.setenv("GPUTUI_IMDS_URL", imds.url)
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    text = f"""
[run]
threads = 1
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
    assert settings is not None and settings.cloud is not None
    provider = SimProvider(script=SimScript(seed=1, launch_delay_s=0.5, shutdown_delay_s=0.2,
                                            host_keys=(machines[0].host_public_key(),)))
    ctx = CloudContext(settings.cloud, provider, Ledger(gputui_home / "ledger.sqlite3"), "spot", "me")
    assigned: dict[str, HostSpec] = {}

    def host_spec(info: InstanceInfo) -> HostSpec:
        if info.instance_id not in assigned:
            machine = machines[len(assigned)]
            assigned[info.instance_id] = HostSpec(info.instance_id, machine.address, machine.port, "root",
                                                  cluster_nodes.user_key)
        return assigned[info.instance_id]

    run = runs.create(tmp_path / "run")
    paused: list[psutil.Process] = []

    def interrupt_now() -> None:  # on the watcher's poll that takes the notice: the instance goes away
        with provider._state("test") as state:
            state["instances"][next(iter(assigned))]["interrupt_at"] = time.time()
        resume_training()

    def resume_training() -> None:
        while paused:
            try:
                paused.pop().resume()
            except psutil.NoSuchProcess:
                pass

    def reclaim() -> None:
        # Training waits for the notice (the master's trainer is paused, so the group is), however
        # long the watcher's 5 s poll takes and however fast an epoch goes; at most a minute.
        paused.extend(trainers(run.path))
        assert paused, "no trainer of the master node found"
        for proc in paused:
            proc.suspend()
        imds.on_notice = interrupt_now
        imds.armed.set()
        threading.Thread(target=lambda: imds.served.wait(60) or resume_training(), daemon=True).start()

    # Three epochs: interrupted in the second, resumed through the rest of it and a whole third.
    cfg = RunSettings(data=str(medium_data), epochs=3, batch_size=16, seed=4, device="cpu", threads=1).resolve()
    view = Events(reclaim)
    try:
        outcome = ClusterRun(run, cfg, settings, view, manager=SlaveManager(settings, ctx, host_spec=host_spec)).execute(False)
    finally:
        resume_training()

    seen = view.events
    kinds = [e["event"] for e in seen]
    assert outcome == "done", kinds
    assert imds.served.is_set()
    first, second = list(assigned)
    assert seen[0]["event"] == "slaves_started" and seen[0]["instances"] == [first]
    interrupted = next(e for e in seen if e["event"] == "interrupted")
    # the watcher SIGTERMed the slave's torchrun; rank 0 (on the master) stopped with it, at the same step
    assert interrupted["reason"] in ("stopped on another node", "SIGTERM")
    replaced = next(e for e in seen if e["event"] == "node_replaced")
    assert (replaced["node"], replaced["by"]) == (first, second)
    relaunch = next(e for e in seen if e["event"] == "relaunch")
    assert relaunch["attempt"] == 1
    resumed = next(e for e in seen if e["event"] == "resumed")
    assert resumed["from_step"] == interrupted["step"] and resumed["lost_steps"] == 0  # nothing redone
    assert [e["attempt"] for e in seen if e["event"] == "cluster"] == [0, 1]
    assert kinds.index("interrupted") < kinds.index("node_replaced") < kinds.index("relaunch") < kinds.index("resumed")
    steps = next(e for e in seen if e["event"] == "start")["steps_per_epoch"]
    assert steps < interrupted["step"] < 2 * steps  # training waited in epoch 2 for the notice
    assert seen[-2]["event"] == "done" and seen[-2]["step"] == 3 * steps
    assert seen[-1]["event"] == "slaves_terminated" and seen[-1]["instances"] == [second]
    records = {r.instance_id: r for r in ctx.ledger.instances()}
    assert records[first].ended_by == "interrupted" and records[second].ended_by == "run-end"
    assert not any(r.running for r in records.values())
    assert ctx.ledger.runs()[0][4] == "done"
    assert wait_no_leftovers(str(run.path), *remote_run_dirs(run.run_id, *machines)) == []
