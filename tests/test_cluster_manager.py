"""Cloud slaves on and off as needed, on the simulated cloud with a hand-driven clock:
on-demand start of missing slaves, reuse of kept ones, replacement after an interruption,
idle stop, and the budget refusing launches."""

from __future__ import annotations

from pathlib import Path

import pytest

from gputui.cloud.ledger import Ledger
from gputui.cloud.context import CloudContext
from gputui.cloud.sim import SimProvider, SimScript
from gputui.cluster.manager import SlaveManager
from gputui.cluster.settings import ClusterSettings, cluster_settings
from gputui.model.errors import GputuiError
from gputui.config.profile import parse_profile

from .moto_fixture import public_key_line
from .test_cloud_budget import T0, Clock  # the hand-driven clock of the cloud tests


def settings(tmp_path: Path, budget: float = 5.0, idle: float = 30.0, keep: bool = False) -> ClusterSettings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    text = f"""
[cloud]
budget_usd = {budget}
zones = ["us-east-1a", "us-east-1b"]
ssh_cidr = "198.51.100.7/32"
public_key = "{key}"

[cluster]
name = "lab"
cloud_slaves = 3
idle_stop_minutes = {idle}
keep_slaves = {str(keep).lower()}
"""
    path = tmp_path / "p.toml"
    path.write_text(text)
    found = cluster_settings(parse_profile(text, path))
    assert found is not None and found.cloud is not None
    return found


def manager(tmp_path: Path, script: SimScript | None = None, **kw: float | bool) -> tuple[SlaveManager, Clock]:
    clock = Clock()
    s = settings(tmp_path, **kw)  # type: ignore[arg-type]
    assert s.cloud is not None
    provider = SimProvider(script=script or SimScript(seed=3, launch_delay_s=20, shutdown_delay_s=5), clock=clock)
    ctx = CloudContext(s.cloud, provider, Ledger(tmp_path / "ledger.sqlite3"), s.name, "me", clock=clock, sleep=clock.sleep)
    return SlaveManager(s, ctx), clock


def kinds(m: SlaveManager) -> list[str]:
    return [e.kind for e in m.ctx.ledger.events()]


def test_missing_slaves_are_started_and_kept_ones_reused(tmp_path: Path) -> None:
    m, clock = manager(tmp_path)
    first = m.ensure(2)
    assert len(first) == 2 and all(s.started_here for s in first)
    assert clock.now > T0  # it waited (with backoff) for them to run
    assert all(s.spec.address.startswith("203.0.113.") and s.spec.user == "ubuntu" for s in first)
    assert not any(s.spec.trust_on_first_use for s in first)  # their keys are pinned from the console
    assert "on_demand_start" in kinds(m) and kinds(m).count("launched") == 2
    # A later run needing 3 reuses the two still up and starts one.
    again = m.ensure(3)
    assert [s.instance_id for s in again[:2]] == [s.instance_id for s in first]
    assert [s.started_here for s in again] == [False, False, True]
    assert len(m.ctx.ledger.instances(running=True)) == 3


def test_slaves_a_run_started_are_terminated_at_its_end_unless_kept(tmp_path: Path) -> None:
    m, _clock = manager(tmp_path)
    ids = [s.instance_id for s in m.ensure(2)]
    assert sorted(m.release(ids)) == sorted(ids)
    records = {r.instance_id: r for r in m.ctx.ledger.instances()}
    assert all(records[i].ended_by == "run-end" and not records[i].running for i in ids)

    kept, _ = manager(tmp_path / "k", keep=True)
    ids = [s.instance_id for s in kept.ensure(1)]
    assert kept.release(ids) == [] and kept.ctx.ledger.instances(running=True)[0].instance_id == ids[0]


def test_idle_slaves_are_stopped_after_idle_stop_minutes(tmp_path: Path) -> None:
    m, clock = manager(tmp_path, idle=30.0)
    a, b = (s.instance_id for s in m.ensure(2))
    util = {a: 0.0, b: 0.0}
    m.release([a, b], keep=True)  # the run ended; the slaves stay: their idle clock starts now
    clock.now += 29 * 60
    assert m.idle_stop(lambda i: util[i.instance_id]) == []
    util[b] = 60.0  # someone uses b's GPU
    assert m.idle_stop(lambda i: util[i.instance_id]) == []
    util[b] = 2.0  # under 5%: idle again from here
    clock.now += 2 * 60
    assert m.idle_stop(lambda i: util[i.instance_id]) == [a]
    rec = m.ctx.ledger.get(a)
    assert rec is not None and rec.ended_by == "idle" and not rec.running
    assert "idle_stop" in kinds(m)
    clock.now += 27 * 60  # b: last busy 29 + a few seconds of a's shutdown ago
    assert m.idle_stop(lambda i: util[i.instance_id]) == []
    clock.now += 2 * 60
    assert m.idle_stop(lambda i: None) == [b]  # unknown utilisation and no run: idle
    assert m.up() == []


def test_a_running_run_keeps_slaves_busy(tmp_path: Path) -> None:
    m, clock = manager(tmp_path, idle=10.0)
    (only,) = (s.instance_id for s in m.ensure(1))
    m.ctx.ledger.start_run("r1", "lab", clock.now)
    clock.now += 3600
    assert m.idle_stop(lambda i: 0.0) == []
    m.ctx.ledger.end_run("r1", clock.now, "done")
    clock.now += 9 * 60
    assert m.idle_stop(lambda i: 0.0) == []
    clock.now += 2 * 60
    assert m.idle_stop(lambda i: 0.0) == [only]


def test_idle_stop_off_when_zero(tmp_path: Path) -> None:
    m, clock = manager(tmp_path, idle=0.0)
    m.ensure(1)
    clock.now += 86400
    assert m.idle_stop(lambda i: 0.0) == [] and len(m.up()) == 1


def test_an_interrupted_slave_is_recorded_and_replaced(tmp_path: Path) -> None:
    m, clock = manager(tmp_path, script=SimScript(seed=3, launch_delay_s=20, shutdown_delay_s=5, interruptions={0: 600}))
    (lost,) = m.ensure(1)
    clock.now += 700  # the spot market takes it back
    new = m.replace(lost.instance_id)
    assert new is not None and new.instance_id != lost.instance_id and new.started_here
    rec = m.ctx.ledger.get(lost.instance_id)
    assert rec is not None and rec.ended_by == "interrupted"
    assert "interrupted" in kinds(m)
    clock.now += 60
    assert [i.instance_id for i in m.up()] == [new.instance_id]


def test_the_budget_refuses_slaves_it_cannot_pay(tmp_path: Path) -> None:
    m, clock = manager(tmp_path, budget=0.05)
    started = m.ensure(2)  # ~$0.16/h each: fine for now
    assert len(started) == 2
    clock.now += 600  # ~$0.05 spent: the budget is gone
    assert m.budget_allows(1) is False
    with pytest.raises(GputuiError, match=r"only 2 of the 3 cloud slaves needed could be started"):
        m.ensure(3, minimum=3)
    assert "budget_refused" in kinds(m)
    assert len(m.ctx.ledger.instances(running=True)) == 2  # what ran is untouched (the guard stops it)
    # With fewer acceptable, the run goes on with what is up.
    assert len(m.ensure(3, minimum=2)) == 2
