"""The budget guard on the simulated cloud with a hand-driven clock: it warns at 80%, and
stops every slave before the spend passes the budget by more than one polling interval."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Sequence

import pytest

from gputui.cloud import budget
from gputui.cloud.budget import BudgetGuard, guard_loop
from gputui.cloud.fleet import poll
from gputui.cloud.ledger import Ledger
from gputui.cloud.lifecycle import launch, plan_launch, terminate, wait_running
from gputui.cloud.context import CloudContext
from gputui.cloud.pricing import PriceBook
from gputui.cloud.settings import CloudSettings
from gputui.cloud.sim import SimProvider, SimScript
from gputui.model.errors import GputuiError
from gputui.model.cloud import CloudEvent, InstanceInfo, InstanceRecord

from .moto_fixture import public_key_line

T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def make_context(tmp_path: Path, budget: float, script: SimScript | None = None) -> tuple[CloudContext, Clock]:
    clock = Clock()
    key = tmp_path / "id.pub"
    key.write_text(public_key_line() + "\n")
    settings = CloudSettings(budget_usd=budget, zones=("us-east-1a", "us-east-1b"), ssh_cidr="198.51.100.7/32",
                             public_key=str(key), source=tmp_path / "p.toml")
    provider = SimProvider(script=script or SimScript(seed=3, launch_delay_s=0, shutdown_delay_s=0), clock=clock)
    ctx = CloudContext(settings, provider, Ledger(tmp_path / "l.sqlite3"), "c1", "me", clock=clock, sleep=clock.sleep)
    return ctx, clock


def bring_up(ctx: CloudContext, count: int) -> list[InstanceRecord]:
    wait_running(ctx, launch(ctx, plan_launch(ctx, count)))
    return ctx.ledger.instances(running=True)


@pytest.mark.parametrize("interval_s, grace_s", [(60.0, 15.0), (300.0, 15.0), (20.0, 0.0)])
def test_the_guard_stops_within_one_interval_of_the_budget(tmp_path: Path, interval_s: float, grace_s: float) -> None:
    ctx, clock = make_context(tmp_path, budget=0.25)
    up = bring_up(ctx, 3)
    rate = sum(r.hourly_price for r in up)
    assert 0.3 < rate < 1.0  # three spot g4dn.xlarge at the seeded prices
    checkpointed: list[tuple[float, list[str]]] = []

    def checkpoint(records: Sequence[InstanceRecord]) -> None:
        checkpointed.append((clock.now, [r.instance_id for r in records]))

    guard = BudgetGuard(ctx, interval_s, checkpoint, grace_s=grace_s)
    book = PriceBook(ctx.provider, clock=clock)
    history: list[tuple[float, float, float, str]] = []
    events: list[CloudEvent] = []
    while guard.running():
        status = guard.status()
        history.append((clock.now, status.spent_usd, status.committed_usd, status.level))
        events += poll(ctx, book)[1] + guard.check()
        clock.now += interval_s
        assert clock.now < T0 + 10 * 3600, "the guard never stopped"
    kinds = [e.kind for e in events]
    assert kinds.count("budget_warning") == 1 and kinds.count("budget_stop") == 1
    assert kinds.index("budget_warning") < kinds.index("budget_stop")
    # It stopped at the first poll where spent plus committed reached the budget, not later.
    stop_at = next(i for i, h in enumerate(history) if h[3] == "stop")
    assert history[stop_at - 1][1] + history[stop_at - 1][2] < 0.25 <= history[stop_at][1] + history[stop_at][2]
    # Runs were asked to checkpoint first, then every slave was terminated, and why was recorded.
    assert len(checkpointed) == 1 and sorted(checkpointed[0][1]) == sorted(r.instance_id for r in up)
    records = ctx.ledger.instances()
    assert all(r.ended_by == "budget" and r.terminated is not None for r in records)
    # Exact: pytest.approx of a Unix time allows a relative 1e-6, here half an hour.
    assert all(r.terminated is not None and r.terminated - history[stop_at][0] == grace_s for r in records)
    # The promise: never more than one polling interval's worth past the budget.
    total = sum(r.cost(clock.now) for r in records)
    assert total <= 0.25 + rate * interval_s / 3600
    assert ctx.provider.describe([r.instance_id for r in records])[0].state == "terminated"
    assert any("budget" in e.message for e in ctx.ledger.events(kinds=["budget_stop"]))


def test_a_price_rise_between_polls_is_caught_at_the_next_poll(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=1.0)
    bring_up(ctx, 2)
    guard = BudgetGuard(ctx, 60.0)
    (first,) = ctx.ledger.instances()[:1]
    ctx.ledger.set_price(first.instance_id, clock.now + 30, 50.0)  # the spot price jumps
    clock.now += 60
    assert guard.status().level == "stop"
    assert [e.kind for e in guard.check()] == ["budget_stop"]
    assert guard.running() == []


def test_the_guard_stays_quiet_under_80_percent(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=100.0)
    bring_up(ctx, 1)
    guard = BudgetGuard(ctx, 60.0)
    for _ in range(10):
        assert guard.check() == []
        clock.now += 60
    assert guard.status().level == "ok" and len(guard.running()) == 1


def test_a_failed_checkpoint_never_keeps_slaves_running(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=0.01)
    bring_up(ctx, 2)

    def broken(records: Sequence[InstanceRecord]) -> None:
        raise OSError("ssh: connect to host 203.0.113.1 port 22: Connection refused")

    guard = BudgetGuard(ctx, 600.0, broken, grace_s=5)
    events = guard.check()
    assert [e.kind for e in events] == ["budget_stop", "budget_stop"]
    assert "could not ask the runs to checkpoint" in events[1].message
    assert guard.running() == []


def test_the_reason_a_checkpoint_failed_is_in_the_event(tmp_path: Path) -> None:
    ctx, _clock = make_context(tmp_path, budget=0.01)
    bring_up(ctx, 1)

    def broken(records: Sequence[InstanceRecord]) -> None:
        raise OSError("ssh: connect to host 203.0.113.1 port 22: Connection refused")

    events = BudgetGuard(ctx, 600.0, broken, grace_s=5).check()
    assert "Connection refused" in events[1].message


@pytest.mark.parametrize("grace_s, waited", [(None, 15.0), (0.5, 0.5)])
def test_runs_get_the_grace_time_to_checkpoint_15_s_by_default(tmp_path: Path, grace_s: float | None,
                                                               waited: float) -> None:
    ctx, clock = make_context(tmp_path, budget=0.01)
    bring_up(ctx, 1)
    options = {} if grace_s is None else {"grace_s": grace_s}
    tripped_at = clock.now
    BudgetGuard(ctx, 600.0, lambda records: None, **options).check()
    (record,) = ctx.ledger.instances()
    assert record.terminated is not None and record.terminated - tripped_at == waited


def elsewhere(ctx: CloudContext, n: int, provider: str, region: str, cluster: str, rate: float) -> None:
    """A running instance in the same ledger, of another provider, region or cluster."""
    info = InstanceInfo(f"i-elsewhere{n}", "g4dn.xlarge", "z", "running", "spot", ctx.clock())
    ctx.ledger.record_launch(info, provider, region, cluster, "me", rate)


def test_the_guard_counts_and_stops_only_its_own_clusters_slaves(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=1.0)
    (mine,) = bring_up(ctx, 1)
    p = ctx.provider
    # The same ledger holds expensive slaves of another cluster, another region and another provider.
    elsewhere(ctx, 1, p.name, p.region, "c2", 50.0)
    elsewhere(ctx, 2, p.name, "eu-west-1", ctx.cluster, 50.0)
    elsewhere(ctx, 3, "ec2", p.region, ctx.cluster, 50.0)
    ctx.ledger.add_energy("ws/gpu0", "c2", None, clock.now, clock.now + 600, 100.0, 0.5)
    guard = BudgetGuard(ctx, 60.0)
    clock.now += 600
    assert [r.instance_id for r in guard.running()] == [mine.instance_id]
    assert guard.status().spent_usd == pytest.approx(mine.hourly_price * 600 / 3600)
    assert guard.check() == []


def test_energy_metered_for_the_cluster_counts_toward_its_budget(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=10.0)
    (mine,) = bring_up(ctx, 1)
    ctx.ledger.add_energy("ws/gpu0", ctx.cluster, None, clock.now, clock.now + 600, 2.0, 0.25)  # $0.50
    clock.now += 600
    assert BudgetGuard(ctx, 60.0).status().spent_usd == pytest.approx(mine.hourly_price * 600 / 3600 + 0.5)


def test_status_at_a_given_time(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=10.0)
    (mine,) = bring_up(ctx, 1)
    status = BudgetGuard(ctx, 60.0).status(now=clock.now + 3600)
    assert status.spent_usd == pytest.approx(mine.hourly_price)


def test_the_warning_fraction_is_the_guards(tmp_path: Path) -> None:
    ctx, clock = make_context(tmp_path, budget=1.0)
    (mine,) = bring_up(ctx, 1)
    clock.now += 0.6 * 3600 / mine.hourly_price  # 60% of the budget spent
    assert BudgetGuard(ctx, 60.0).check() == []
    assert [e.kind for e in BudgetGuard(ctx, 60.0, warn_fraction=0.5).check()] == ["budget_warning"]


class Stop:
    """Stands for guard_loop's threading.Event: records each wait, and is set after `rounds` of them."""

    def __init__(self, rounds: int) -> None:
        self.rounds = rounds
        self.waits: list[float | None] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout)
        return len(self.waits) >= self.rounds


def test_a_failed_poll_is_an_error_event_and_guarding_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx, _clock = make_context(tmp_path, budget=100.0)
    bring_up(ctx, 1)
    polls: list[str] = []

    def flaky_poll(ctx: CloudContext, book: PriceBook) -> object:
        polls.append("poll")
        if len(polls) == 1:
            raise GputuiError("ec2: could not connect to the endpoint URL")
        return poll(ctx, book)

    monkeypatch.setattr(budget, "poll", flaky_poll)
    stop = Stop(rounds=2)
    guard_loop(ctx, BudgetGuard(ctx, 45.0), PriceBook(ctx.provider, clock=ctx.clock), stop)  # type: ignore[arg-type]
    assert len(polls) == 2 and stop.waits == [45.0, 45.0]
    (error,) = ctx.ledger.events(kinds=["error"])
    assert error.message == "poll failed: ec2: could not connect to the endpoint URL" and error.cluster == ctx.cluster


def test_the_loop_ends_when_its_own_cluster_has_no_slaves_left(tmp_path: Path) -> None:
    ctx, _clock = make_context(tmp_path, budget=100.0)
    p = ctx.provider
    (ended,) = bring_up(ctx, 1)
    terminate(ctx, p.describe([ended.instance_id]), ended_by="user")
    bring_up(replace(ctx, cluster="c2"), 1)  # another cluster's slave, up in the same cloud
    elsewhere(ctx, 2, p.name, "eu-west-1", ctx.cluster, 0.5)
    elsewhere(ctx, 3, "ec2", p.region, ctx.cluster, 0.5)
    stop = Stop(rounds=1)
    guard_loop(ctx, BudgetGuard(ctx, 60.0), PriceBook(ctx.provider, clock=ctx.clock), stop)  # type: ignore[arg-type]
    assert stop.waits == []  # returned without waiting for another poll
