"""The lab view's data layer (gputui.monitor.lab): the free rule, host lines, fleet totals,
sorting and filtering, free GPUs for scripts, and per-account totals with GPU-hours."""

from __future__ import annotations

import time
from typing import Any, Callable

import pytest

from gputui.config.free import FREE_SECTION, FreeRule
from gputui.config.profile import parse_profile
from gputui.model.errors import UserError
from gputui.model.telemetry import FleetColumns, GpuColumns, GpuProcess, GpuSample, HostSnapshot, HostState, utilisations
from gputui.monitor.lab import (Lab, LabFilter, UNKNOWN_USER, filter_lines, free_gpus, free_rule, held_now, host_line,
                                is_free, sort_lines)

RULE = FreeRule()


def gpu(index: int, util: float | None = 0.0, mem: float | None = 100.0, total: float | None = 81920.0,
        procs: tuple[tuple[str | None, float | None], ...] = ()) -> GpuSample:
    processes = tuple(GpuProcess(1000 + index * 10 + n, "python train.py", user, m) for n, (user, m) in enumerate(procs))
    return GpuSample(index, name="H100", util_pct=util, mem_used_mib=mem, mem_total_mib=total, processes=processes)


def host(name: str, *gpus: GpuSample, state: HostState = HostState.OK, at: float = 1000.0,
         message: str | None = None) -> HostSnapshot:
    return HostSnapshot(name, state, at, kind="ssh", gpus=gpus, message=message)


def test_a_gpu_is_free_only_without_processes_and_below_both_thresholds() -> None:
    assert is_free(gpu(0, util=10.0, mem=1024.0), RULE)  # the thresholds themselves are free
    assert not is_free(gpu(0, util=10.5), RULE)
    assert not is_free(gpu(0, mem=1025.0), RULE)
    assert not is_free(gpu(0, procs=(("alice", 10.0),)), RULE)  # a process, however small
    assert is_free(gpu(0, procs=(("alice", 10.0),)), FreeRule(allow_processes=True))
    assert is_free(gpu(0, util=None), RULE) and is_free(gpu(0, mem=None), RULE)  # n/a is not held against it
    assert not is_free(gpu(0, util=None, mem=None), RULE)  # but nothing known is never free


def test_the_free_table_is_read_from_the_profile_and_checked() -> None:
    profile = parse_profile("[free]\nmax_util_pct = 2.5\nmax_memory_mib = 300\nallow_processes = true\n")
    assert free_rule(profile) == FreeRule(2.5, 300.0, True)
    assert free_rule(parse_profile("")) == FreeRule() == free_rule(None)
    with pytest.raises(UserError, match="max_util_pct"):
        parse_profile("[free]\nmax_util_pct = 120\n")
    with pytest.raises(UserError, match="unknown"):
        parse_profile("[free]\nmax_util = 1\n")
    assert set(FREE_SECTION.fields) == {"max_util_pct", "max_memory_mib", "allow_processes"}


def test_a_host_line_counts_free_gpus_and_names_the_top_account() -> None:
    line = host_line(host("a", gpu(0), gpu(1, 95.0, 60000.0, procs=(("bob", 30000.0), ("alice", 20000.0))),
                          gpu(2, 90.0, 50000.0, procs=(("alice", 25000.0),)), gpu(3, None, None)), RULE)
    assert (line.gpus, line.free, line.busy) == (4, 1, 3)
    assert (line.top_user, line.top_user_mib) == ("alice", 45000.0)  # 20,000 + 25,000 over bob's 30,000
    assert line.users == {"alice", "bob"}
    assert [c.free for c in line.cells] == [True, False, False, False]
    assert line.util_pct == pytest.approx((0.0 + 95.0 + 90.0) / 3)  # the GPU with n/a is left out
    assert line.mem_used_mib == 100.0 + 60000.0 + 50000.0
    assert sorted(line.held) == [("alice", 2, 45000.0, 2), ("bob", 1, 30000.0, 1)]  # (account, GPUs, MiB, processes)


def test_what_each_account_holds_is_summed_from_the_host_lines_as_counted_gpu_by_gpu() -> None:
    import random

    draw = random.Random(5)
    names = ("alice", "bob", None, "carol")
    hosts = [host(f"h{i}", *(gpu(g, 50.0, procs=tuple((draw.choice(names), draw.choice((None, 100.0, 250.0)))
                                                       for _ in range(draw.randint(0, 3)))) for g in range(4)),
                  state=HostState.OK if i % 5 else HostState.UNREACHABLE) for i in range(12)]
    naive: dict[str, list[float]] = {}  # account -> [GPUs, MiB, hosts, processes], GPU by GPU
    for h in hosts:
        if not h.state.worked:
            continue
        on_host = set()
        for g in h.gpus:
            for user in {p.user or UNKNOWN_USER for p in g.processes}:
                naive.setdefault(user, [0, 0.0, 0, 0])[0] += 1
                on_host.add(user)
            for p in g.processes:
                naive[p.user or UNKNOWN_USER][1] += p.gpu_memory_mib or 0.0
                naive[p.user or UNKNOWN_USER][3] += 1
        for user in on_host:
            naive[user][2] += 1
    assert len(naive) == 4 and any(h.state.worked and h.gpus[0].processes for h in hosts)
    assert held_now(hosts) == {u: (int(g), m, int(n), int(p)) for u, (g, m, n, p) in naive.items()}
    frame = Lab(RULE).update(hosts, 1000.0)
    assert {(t.user, t.gpus, t.memory_mib, t.hosts, t.processes) for t in frame.users} == {
        (u, g, m, n, p) for u, (g, m, n, p) in naive.items()}
    assert all(line.held == () for line in frame.lines if not line.reachable)  # a host down holds nothing now


def test_the_fleet_line_counts_unreachable_hosts_gpus_as_last_seen() -> None:
    lab = Lab(RULE)
    lab.update([host("a", gpu(0), gpu(1, 90.0)), host("b", *(gpu(i) for i in range(8))),
                host("c", state=HostState.UNREACHABLE, message="connection refused")])
    frame = lab.update([host("a", gpu(0), gpu(1, 90.0)), host("b", state=HostState.UNREACHABLE, message="timed out"),
                        host("c", state=HostState.UNREACHABLE, message="connection refused")])
    t = frame.totals
    assert (t.hosts, t.gpus, t.free, t.busy, t.unreachable) == (3, 10, 1, 1, 8)
    assert t.line() == "1 of 10 GPUs free on 1 host; 1 busy; 8 unreachable (1 host not reached yet)"
    assert frame.lines[1].gpus == 8 and not frame.lines[1].reachable and frame.lines[1].message == "timed out"


def test_the_fleet_line_at_lab_scale_uses_thousands_separators() -> None:
    rounds = [host(f"h{i:03d}", *(gpu(g, 90.0 if (i + g) % 7 else 0.0, procs=(("u", 1.0),) if (i + g) % 7 else ())
                                  for g in range(8))) for i in range(256)]
    line = Lab(RULE).update(rounds).totals.line()
    free = sum(1 for i in range(256) for g in range(8) if not (i + g) % 7)
    assert line == f"{free} of 2,048 GPUs free on 256 hosts; {2048 - free:,} busy"


def test_sorting_puts_unreachable_hosts_last_whatever_the_key() -> None:
    lines = [host_line(h, RULE) for h in (
        host("b", gpu(0, 50.0, 2000.0), gpu(1)), host("a", gpu(0, 90.0, 9000.0), gpu(1, 80.0, 5000.0)),
        host("down", state=HostState.UNREACHABLE), host("c", gpu(0), gpu(1)))]
    assert [ln.name for ln in sort_lines(lines, "name")] == ["a", "b", "c", "down"]
    assert [ln.name for ln in sort_lines(lines, "util")] == ["a", "b", "c", "down"]
    assert [ln.name for ln in sort_lines(lines, "free")] == ["c", "b", "a", "down"]
    assert [ln.name for ln in sort_lines(lines, "memory")] == ["a", "b", "c", "down"]
    assert [ln.name for ln in sort_lines(lines, "memory", reverse=True)] == ["c", "b", "a", "down"]
    with pytest.raises(ValueError, match="sort key"):
        sort_lines(lines, "colour")
    named = [host_line(host(n, gpu(0)), RULE) for n in ("gpu-10", "GPU-9", "gpu-2", "gpu-2b", "a")]
    assert [ln.name for ln in sort_lines(named, "name")] == ["a", "gpu-2", "gpu-2b", "GPU-9", "gpu-10"]


def test_the_filter_keeps_hosts_by_name_account_free_gpus_and_state() -> None:
    lines = [host_line(h, RULE) for h in (
        host("gpu-a1", gpu(0, 90.0, procs=(("alice", 1.0),)), gpu(1)), host("gpu-b2", gpu(0, 90.0, procs=(("bob", 1.0),))),
        host("cpu-a3", state=HostState.UNREACHABLE))]

    def kept(text: str) -> list[str]:
        return [ln.name for ln in filter_lines(lines, LabFilter.parse(text))]

    assert kept("") == ["gpu-a1", "gpu-b2", "cpu-a3"]
    assert kept("user:bob") == ["gpu-b2"]
    assert kept("free") == ["gpu-a1"]
    assert kept("A") == ["gpu-a1", "cpu-a3"]  # part of the name, any case
    assert kept("gpu user:alice free") == ["gpu-a1"]  # every part holds
    assert kept("down") == ["cpu-a3"]
    assert str(LabFilter.parse("gpu user:bob free")) == "gpu user:bob free"


def test_free_gpus_are_least_used_first_and_meet_the_memory_asked() -> None:
    hosts = [host("b", gpu(0, 3.0, 500.0), gpu(1, 0.0, 500.0), gpu(2, 90.0, 70000.0, procs=(("x", 1.0),))),
             host("a", gpu(0, 0.0, 20.0, total=16384.0), gpu(1, 1.0, None)),
             host("down", state=HostState.UNREACHABLE)]
    assert [f.label for f in free_gpus(hosts, RULE)] == ["a:0", "b:1", "b:0", "a:1"]  # n/a memory last
    assert [f.label for f in free_gpus(hosts, RULE, min_free_mib=20 * 1024)] == ["b:1", "b:0"]  # a:0 has 16 GiB


def test_gpu_hours_accumulate_per_account_between_polls_of_a_host() -> None:
    lab = Lab(RULE)
    start = time.mktime((2026, 11, 27, 9, 0, 0, 0, 0, -1))

    def round_at(t: float) -> list[HostSnapshot]:
        return [host("a", gpu(0, 90.0, procs=(("alice", 10.0), ("alice", 5.0))), gpu(1, 90.0, procs=(("bob", 7.0),)),
                     gpu(2, 90.0, procs=((None, 3.0),)), at=t)]

    lab.update(round_at(start), start)
    lab.update(round_at(start + 1800), start + 1800)  # capped: at most MAX_CREDIT_S of a gap counts
    frame = lab.update(round_at(start + 1860), start + 1860)
    users = {u.user: u for u in frame.users}
    assert set(users) == {"alice", "bob", UNKNOWN_USER}
    assert users["alice"].gpus == 1 and users["alice"].processes == 2 and users["alice"].memory_mib == 15.0
    assert users["alice"].gpu_hours == pytest.approx((300 + 60) / 3600)  # one GPU, two processes: counted once
    assert users["bob"].gpu_hours == pytest.approx(360 / 3600)
    again = lab.update(round_at(start + 1860), start + 1870)  # the same snapshot again: nothing more
    assert {u.user: u.gpu_hours for u in again.users} == {u.user: u.gpu_hours for u in frame.users}
    idle = lab.update([host("a", gpu(0), gpu(1), gpu(2), at=start + 1920)], start + 1920)
    assert {u.user: (u.gpus, u.gpu_hours > 0) for u in idle.users} == {"alice": (0, True), "bob": (0, True),
                                                                       UNKNOWN_USER: (0, True)}


def test_gpu_hours_start_again_at_local_midnight() -> None:
    lab = Lab(RULE)
    late = time.mktime((2026, 11, 27, 23, 59, 0, 0, 0, -1))
    busy = (gpu(0, 90.0, procs=(("alice", 10.0),)),)
    lab.update([host("a", *busy, at=late)], late)
    frame = lab.update([host("a", *busy, at=late + 120)], late + 120)  # 00:01 the next day
    assert frame.users[0].gpu_hours == pytest.approx(60 / 3600)  # only the minute after midnight


def test_the_simulation_builds_the_same_samples_as_the_dataclasses_do() -> None:
    from dataclasses import fields

    from gputui.sources.sim import SimSource

    hosts = SimSource(hosts=6, gpus=4, seed=3, clock=lambda: 1000.0).poll()
    samples = [g for h in hosts for g in h.gpus]
    assert any(g.processes for g in samples) and any(not g.processes for g in samples)
    plain = (int, float, str, bool, tuple, type(None))  # no numpy scalar leaks out of the simulation's arrays
    for h in hosts:
        assert all(type(getattr(h, f.name)) in plain + (HostState, GpuColumns) for f in fields(HostSnapshot)), h
        assert list(vars(h)) == [f.name for f in fields(HostSnapshot)]  # adopted: every field, in order
        assert HostSnapshot(**{f.name: getattr(h, f.name) for f in fields(HostSnapshot)}) == h
        assert h.gpus == tuple(h.gpus) and len(h.gpus) == 4 and h.gpus[1] == tuple(h.gpus)[1]
    for g in samples:  # every field set, to what the generated __init__ gives
        assert GpuSample(**{f.name: getattr(g, f.name) for f in fields(GpuSample)}) == g
        assert all(type(v) in plain for v in vars(g).values()), g
        assert all(type(v) in plain for p in g.processes for v in vars(p).values()), g
        assert list(vars(g)) == [f.name for f in fields(GpuSample)]  # in their order: to_dict's keys
        for p in g.processes:
            assert list(vars(p)) == [f.name for f in fields(GpuProcess)] and GpuProcess(**vars(p)) == p


# -- a simulated lab's round read as arrays (FleetColumns): the same figures, no sample built ---------


def _as_tuples(hosts: list[HostSnapshot]) -> list[HostSnapshot]:
    from dataclasses import replace

    return [replace(h, gpus=tuple(h.gpus)) for h in hosts]


def _same_frames(a: object, b: object) -> None:
    assert a.totals == b.totals and a.users == b.users  # type: ignore[attr-defined]
    for la, lb in zip(a.lines, b.lines, strict=True):  # type: ignore[attr-defined]
        assert (la.name, la.frees, la.free, la.util_pct, la.mem_used_mib, la.mem_total_mib, la.top_user, la.top_user_mib,
                la.held) == (lb.name, lb.frees, lb.free, lb.util_pct, lb.mem_used_mib, lb.mem_total_mib, lb.top_user,
                             lb.top_user_mib, lb.held)
        assert la.cells == lb.cells and la.samples == lb.samples


@pytest.mark.parametrize("rule", [RULE, FreeRule(allow_processes=True), FreeRule(50.0, 70000.0)])
def test_a_simulated_rounds_arrays_give_the_lab_the_figures_its_samples_give(rule: FreeRule) -> None:
    from gputui.sources.sim import SimSource

    source = SimSource(hosts=24, gpus=8, seed=5, clock=lambda: 1000.0)
    source.set_active(1, True)
    source.set_active(2, False)
    by_columns, by_samples = Lab(rule), Lab(rule)
    for n in range(50):  # runs start and end: GPUs with and without processes, one and two accounts a host
        if n == 10:
            pid = next(p.pid for g in source.poll()[1].gpus for p in g.processes)
            assert source.kill("sim-1", pid, "TERM")[0]
        hosts = source.poll()
        assert all(isinstance(h.gpus, GpuColumns) for h in hosts)
        _same_frames(by_columns.update(hosts, 1000.0 + n), by_samples.update(_as_tuples(hosts), 1000.0 + n))
        assert all(utilisations(h) == {g.index: g.util_pct for g in h.gpus} for h in hosts)


def test_the_lab_and_its_plain_view_build_no_sample_of_a_simulated_round() -> None:
    from gputui.sources.sim import SimSource
    from gputui.views.lab import LabOptions, lab_plain

    hosts = SimSource(hosts=64, gpus=8, seed=1).poll()
    fleet = hosts[0].gpus.fleet  # type: ignore[attr-defined]
    text = lab_plain(Lab(RULE).update(hosts), LabOptions())
    assert len(text.splitlines()) == 66 and {utilisations(h)[0] is not None for h in hosts} == {True}
    assert fleet._samples is None  # what a lab of 2,048 GPUs a second would otherwise build
    assert hosts[3].gpus[2].index == 2 and fleet._samples is not None  # and reading one builds them
    again = SimSource(hosts=4, gpus=2, seed=1).poll()
    from gputui.model.telemetry import round_to_dict

    assert len(round_to_dict(again, 0.0)["hosts"][1]["gpus"]) == 2
    assert "arrays" not in again[0].gpus.fleet._memo  # type: ignore[attr-defined]  # a JSON line needs no lab array


def _fleet(rows: list[list[GpuSample]]) -> list[HostSnapshot]:
    """Hosts whose GPUs are FleetColumns arrays made from these samples (at most one process a GPU)."""
    import numpy as np

    users: list[str | None] = []
    for g in (g for row in rows for g in row):
        for p in g.processes:
            if p.user not in users:
                users.append(p.user)

    def array(get: Callable[[GpuSample], float | None]) -> Any:
        return np.array([[np.nan if get(g) is None else get(g) for g in row] for row in rows], dtype=float)

    fleet = FleetColumns((len(rows), len(rows[0])), lambda: [g for row in rows for g in row], lambda: {
        "util_pct": array(lambda g: g.util_pct), "mem_used_mib": array(lambda g: g.mem_used_mib),
        "mem_total_mib": array(lambda g: g.mem_total_mib),
        "process_user": np.array([[users.index(g.processes[0].user) if g.processes else -1 for g in row] for row in rows]),
        "process_mem_mib": array(lambda g: g.processes[0].gpu_memory_mib if g.processes else 0.0)}, tuple(users))
    return [HostSnapshot(f"h{i}", HostState.OK, 1000.0, kind="sim", gpus=fleet.host(i)) for i in range(len(rows))]


def test_arrays_with_unknown_figures_and_accounts_give_the_lab_what_the_samples_do() -> None:
    rows = [[gpu(0, None, None), gpu(1, 5.0, None), gpu(2, None, 200.0), gpu(3, 3.0, 100.0, total=0.0)],
            [gpu(0, 95.0, 60000.0, procs=((None, 30000.0),)), gpu(1, 90.0, 50000.0, procs=(("alice", None),)),
             gpu(2, 2.0, 10.0, None, procs=(("bob", 10.0),)), gpu(3, 99.0, 70000.0, procs=(("bob", 40000.0),))],
            [gpu(0, 96.5, 61000.0, procs=(("bob", 20000.0),)), gpu(1, 97.5, 1.0, procs=(("alice", 20000.0),)),
             gpu(2), gpu(3, 10.0, 1024.0)]]
    hosts = _fleet(rows)
    for rule in (RULE, FreeRule(allow_processes=True), FreeRule(96.0, 60000.0)):
        _same_frames(Lab(rule).update(hosts, 1000.0), Lab(rule).update(_as_tuples(hosts), 1000.0))
    line = host_line(hosts[2], RULE)
    assert (line.top_user, line.held) == ("bob", (("bob", 1, 20000.0, 1), ("alice", 1, 20000.0, 1)))  # a tie: the greater name
    assert [c.util_pct for c in host_line(hosts[0], RULE).cells] == [None, 5.0, None, 3.0]
    assert [c.mem_pct for c in host_line(hosts[0], RULE).cells] == [None, None, 200.0 / 819.2, None]


def test_a_simulated_fleet_without_gpus_gives_the_same_lines() -> None:
    from gputui.sources.sim import SimSource

    hosts = SimSource(hosts=3, gpus=0, seed=2).poll()
    _same_frames(Lab(RULE).update(hosts, 1000.0), Lab(RULE).update(_as_tuples(hosts), 1000.0))


def test_a_rounds_samples_are_built_once_whichever_threads_read_them() -> None:
    import threading

    import numpy as np

    building, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def build() -> list[GpuSample]:
        calls.append(1)
        building.set()
        release.wait(30)
        return [gpu(0)]

    one = np.zeros((1, 1))
    fleet = FleetColumns((1, 1), build, lambda: {"util_pct": one, "mem_used_mib": one.copy(), "mem_total_mib": one.copy(),
                                                 "process_user": np.full((1, 1), -1), "process_mem_mib": one.copy()}, ())
    class Lock:
        """The fleet's lock, saying when a second reader is at it (while the first one builds)."""

        def __init__(self) -> None:
            self.inner, self.entries, self.second = threading.Lock(), 0, threading.Event()

        def __enter__(self) -> None:
            self.entries += 1
            if self.entries == 2:
                self.second.set()
            self.inner.acquire()

        def __exit__(self, *_exc: object) -> None:
            self.inner.release()

    lock = fleet._lock = Lock()  # type: ignore[assignment]
    got: list[list[GpuSample]] = []
    readers = [threading.Thread(target=lambda: got.append(fleet.samples())) for _ in range(2)]
    readers[0].start()
    assert building.wait(30), "the first reader never started building"
    readers[1].start()
    assert lock.second.wait(30) or len(calls) == 2, "the second reader neither waited for the first nor built"
    release.set()
    for r in readers:
        r.join(30)
        assert not r.is_alive(), "a reader is still waiting for the round's samples"
    assert len(calls) == 1 and len(got) == 2 and got[0] is got[1]
    with pytest.raises(ValueError):
        fleet.util_pct[0, 0] = 5.0  # a snapshot's arrays are read-only
