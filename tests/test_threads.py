"""Torch's CPU threads come from what is free on the machine (gputui.train.threads): the rule on
made-up machines, the cgroup quota and /proc/stat readers on made-up files, and the places that
use it (a run's start event, DDP ranks' environment, sweep workers, bench's busy note)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputui.jobs import bench
from gputui.jobs import run as runner
from gputui.runs import store as runs
from gputui.jobs.bench import BenchRow
from gputui.cli import main
from gputui.config.run import RunSettings
from gputui.sweep.space import default_threads
from gputui.train import threads
from gputui.train.threads import CpuView, Sample, choose_threads


def test_an_idle_machine_gets_a_thread_per_core() -> None:
    assert choose_threads(1, CpuView(cores=2, affinity=2, busy=0.05))[0] == 2
    assert choose_threads(1, CpuView(cores=16, busy=0.0))[0] == 16


def test_a_machine_other_processes_keep_busy_gets_what_is_left_and_at_least_one() -> None:
    n, why = choose_threads(1, CpuView(cores=2, affinity=2, busy=2.0))  # two CPU hogs on two cores
    assert n == 1 and "others busy 2.0" in why
    assert choose_threads(1, CpuView(cores=2, busy=9.0))[0] == 1  # load 9 on 2 cores
    assert choose_threads(1, CpuView(cores=8, busy=3.2))[0] == 5  # 4.8 free
    assert choose_threads(1, CpuView(cores=2, busy=0.6))[0] == 1  # 1.4 free
    assert choose_threads(1, CpuView(cores=2, busy=0.4))[0] == 2  # 1.6 free


def test_affinity_and_the_cgroup_quota_bound_the_count() -> None:
    n, why = choose_threads(1, CpuView(cores=16, affinity=4, busy=0.0))
    assert n == 4 and "affinity 4 of 16 cores" in why
    n, why = choose_threads(1, CpuView(cores=8, affinity=8, quota=1.5, busy=0.0))
    assert n == 1 and "cgroup quota 1.5 CPUs" in why  # a second spinning thread would be throttled
    assert choose_threads(1, CpuView(cores=8, quota=4.0, busy=0.0))[0] == 4


def test_workers_split_what_is_free() -> None:
    n, why = choose_threads(2, CpuView(cores=8, busy=0.0))
    assert n == 4 and why.endswith("over 2 workers")
    assert choose_threads(3, CpuView(cores=8, busy=0.0))[0] == 2
    assert choose_threads(2, CpuView(cores=8, busy=4.0))[0] == 2
    assert choose_threads(4, CpuView(cores=2, busy=0.0))[0] == 1


def test_unknown_load_uses_the_usable_cpus() -> None:
    n, why = choose_threads(1, CpuView(cores=4, busy=None))
    assert n == 4 and "not known" in why


def test_cpu_max_and_cfs_quota_parse() -> None:
    assert threads.parse_cpu_max("max 100000\n") is None
    assert threads.parse_cpu_max("150000 100000\n") == 1.5
    assert threads.parse_cpu_max("garbage") is None
    assert threads.parse_cfs("-1\n", "100000\n") is None
    assert threads.parse_cfs("200000\n", "100000\n") == 2.0
    assert threads.parse_cfs("", "100000") is None


def test_the_tightest_quota_over_the_cgroup_and_its_parents(tmp_path: Path) -> None:
    v2 = tmp_path / "v2"
    (v2 / "a" / "b").mkdir(parents=True)
    (v2 / "a" / "cpu.max").write_text("300000 100000\n")
    (v2 / "a" / "b" / "cpu.max").write_text("max 100000\n")
    (tmp_path / "cg2").write_text("0::/a/b\n")
    assert threads.cgroup_quota(v2, tmp_path / "cg2") == 3.0
    v1 = tmp_path / "v1"
    (v1 / "cpu,cpuacct" / "job").mkdir(parents=True)
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu,cpuacct" / "job" / "cpu.cfs_period_us").write_text("100000\n")
    (tmp_path / "cg1").write_text("12:memory:/job\n4:cpu,cpuacct:/job\n")
    assert threads.cgroup_quota(v1, tmp_path / "cg1") == 0.5
    (tmp_path / "none").write_text("0::/\n")
    assert threads.cgroup_quota(tmp_path / "empty", tmp_path / "none") is None
    assert threads.cgroup_quota(v2, tmp_path / "missing") is None


def test_others_busy_is_the_machine_less_this_process(tmp_path: Path) -> None:
    assert threads.busy_between(Sample(0.0, 10.0, 1.0), Sample(2.0, 14.0, 2.0)) == pytest.approx(1.5)
    assert threads.busy_between(Sample(0.0, 10.0, 1.0), Sample(1.0, 10.5, 1.9)) == 0.0  # never below zero
    assert threads.busy_between(Sample(0.0, None, 0.0), Sample(1.0, None, 0.0)) is None
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 0 50 800 50 0 0 0 0 0\ncpu0 50 0 25 400 25 0 0 0 0 0\n")
    import os

    assert threads._busy_seconds(stat) == pytest.approx(150 / os.sysconf("SC_CLK_TCK"))
    stat.write_text("nonsense\n")
    assert threads._busy_seconds(stat) is None


def test_a_setting_or_a_parents_choice_goes_before_the_machine() -> None:
    view = CpuView(cores=8, busy=0.0)
    assert threads.run_threads(3, {"OMP_NUM_THREADS": "5"}, view=view) == (3, "set by --threads or the profile")
    env = threads.child_env({"PATH": "/bin"}, 2, "2.0 of 8 cores free, over 4 workers")
    assert env["PATH"] == "/bin" and env["OMP_NUM_THREADS"] == "2"
    assert threads.run_threads(None, env, view=view) == (2, "2.0 of 8 cores free, over 4 workers")
    assert threads.run_threads(None, {"OMP_NUM_THREADS": "6"}, view=view) == (6, "OMP_NUM_THREADS")
    assert threads.run_threads(None, {"OMP_NUM_THREADS": "zero"}, view=view)[0] == 8


def test_sweep_workers_share_what_is_free() -> None:
    view = CpuView(cores=8, busy=2.0)
    assert default_threads(2, view) == choose_threads(2, view)[0] == 3


def test_the_start_event_says_the_threads_and_why(small_data: Path, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the suite's one thread (tests/conftest.py) off: the real choice
    assert main(["run", "--model", "fast", "--epochs", "1", "--data", str(small_data), "--json"]) == 0
    start = next(e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e["event"] == "start")
    assert isinstance(start["threads"], int) and start["threads"] >= 1
    assert " free" in start["threads_why"]
    assert main(["run", "--model", "fast", "--epochs", "1", "--data", str(small_data), "--json", "--threads", "1"]) == 0
    start = next(e for e in map(json.loads, capsys.readouterr().out.splitlines()) if e["event"] == "start")
    assert (start["threads"], start["threads_why"]) == (1, "set by --threads or the profile")


def test_ddp_ranks_get_their_share_in_their_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}

    def launch(run: Any, nproc: int, resume: bool, show: Any, env: Any = None) -> str:
        seen.update(nproc=nproc, env=env)
        return "done"

    monkeypatch.setattr("gputui.train.distributed.launch", launch)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    cfg = RunSettings(strategy="ddp", nproc=2, device="cpu").resolve()
    runner.execute(runs.create(tmp_path / "r"), cfg, False, runner_view())
    env = seen["env"]
    assert seen["nproc"] == 2 and int(env["OMP_NUM_THREADS"]) >= 1
    assert env[threads.WHY_ENV].endswith("over 2 workers")


def runner_view() -> Any:
    from gputui.views.progress import CollectView

    return CollectView()


def row(label: str, workers: int, rate: float, busy: float | None, load: float | None = None) -> BenchRow:
    return BenchRow(label, "seed", "cpu", "single" if workers == 1 else "ddp", workers, "seed cpu x1", "ok", rate,
                    60000 / rate, busy=busy, load=load)


def test_bench_says_when_the_machine_was_busy() -> None:
    rows = [row("seed cpu x1", 1, 1000.0, busy=1.8, load=7.2), row("seed cpu ddp x2", 2, 1500.0, busy=1.7, load=7.0)]
    note = bench.busy_note(rows, cores=2)
    assert note is not None and "busy while 2 of the rows ran" in note and "1.8 of 2 CPUs" in note
    assert "load average up to 7.2" in note
    assert bench.busy_note([row("seed cpu x1", 1, 1000.0, busy=0.1, load=0.3)], cores=2) is None
    assert bench.busy_note([row("seed cpu x1", 1, 1000.0, busy=None, load=3.5)], cores=2) is not None


def test_an_efficiency_over_100_percent_says_why() -> None:
    rows = [row("seed cpu x1", 1, 442.0, busy=1.9, load=7.2), row("seed cpu ddp x2", 2, 5848.0, busy=0.2, load=2.1)]
    bench.add_speedups(rows, cores=2)
    assert rows[1].efficiency is not None and rows[1].efficiency > 1
    assert rows[1].detail == ("superlinear: the 1-process baseline was slowed by a busy machine "
                              "(others used 1.9 CPUs, load 7.2)")
    line = next(ln for ln in bench.table(rows).splitlines() if ln.startswith("seed cpu ddp x2"))
    assert "%" in line and "superlinear: the 1-process baseline was slowed" in line
    quiet = [row("seed cpu x1", 1, 1000.0, busy=0.0), row("seed cpu ddp x2", 2, 2100.0, busy=0.1)]
    bench.add_speedups(quiet, cores=2)
    assert quiet[1].detail.startswith("superlinear: more than linear scaling")
    linear = [row("seed cpu x1", 1, 1000.0, busy=0.0), row("seed cpu ddp x2", 2, 1800.0, busy=0.0)]
    bench.add_speedups(linear, cores=2)
    assert linear[1].detail == ""


def test_the_governor_follows_the_load_while_a_run_trains() -> None:
    """Idle at the start (2 threads), two hogs arrive (1 thread), they leave (2 again); a window
    shorter than every_s decides nothing; this process's own spinning threads are not 'others'."""
    from gputui.train.threads import CpuView, Governor, Sample

    samples: list[Sample] = []
    clock = {"t": 0.0, "busy": 0.0, "own": 0.0}

    def sample() -> Sample:
        s = Sample(clock["t"], clock["busy"], clock["own"])
        samples.append(s)
        return s

    def run(seconds: float, others: float, own: float = 2.0) -> None:
        clock["t"] += seconds
        clock["own"] += own * seconds
        clock["busy"] += (others + own) * seconds

    gov = Governor(2, every_s=5.0, view=CpuView(cores=2), sample=sample)
    run(6, others=0.0)
    assert gov.tick() is None and gov.threads == 2  # we alone keep both cores busy: nothing changes
    run(6, others=2.0, own=0.0)  # two hogs: our spinning threads are starved
    assert gov.tick() == 1 and gov.threads == 1
    run(2, others=0.0, own=1.0)
    assert gov.tick() is None  # 2 s: too short a window to decide
    run(4, others=0.0, own=1.0)
    assert gov.tick() == 2 and gov.changes == 2  # the hogs left


def test_a_thread_count_set_past_the_usable_cpus_is_warned() -> None:
    from gputui.train.threads import too_many_threads

    two = CpuView(cores=2, busy=1.9)  # what others use does not count: it changes while a run goes on
    assert too_many_threads(2, 1, two) is None
    assert too_many_threads(1, 2, two) is None
    said = too_many_threads(3, 1, two)
    assert said is not None and said.startswith("3 threads (--threads or the profile) are more than the 2 cores here")
    said = too_many_threads(2, 2, two)
    assert said is not None and said.startswith("2 threads in each of 2 processes (--threads")
    assert "cgroup quota 1.5 CPUs" in (too_many_threads(2, 1, CpuView(cores=8, quota=1.5)) or "")
    assert "affinity 4 of 64 cores" in (too_many_threads(5, 1, CpuView(cores=64, affinity=4)) or "")


def test_gputui_run_warns_of_too_many_threads_in_one_line(small_data: Path, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.cli import main
    from gputui.train import threads

    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(threads, "cgroup_quota", lambda: None)
    args = ["run", "--json", "--data", str(small_data), "--epochs", "1", "--batch-size", "256"]
    assert main([*args, "--threads", "3"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warned == ["gputui: warning: 3 threads (--threads or the profile) are more than the 2 cores here: they "
                      "wait on each other and the run slows down; leave threads unset and gputui picks what is free"]
    assert main([*args, "--threads", "1"]) == 0
    assert "warning" not in capsys.readouterr().err
