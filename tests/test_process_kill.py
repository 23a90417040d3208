"""The process table's local kill signals the process the snapshot saw and no other: a pid that
now belongs to another process (another start time) gets nothing."""

from __future__ import annotations

import os
from typing import Iterator

import psutil
import pytest

from gputui.model.telemetry import GpuProcess
from gputui.monitor.processes import kill_local
from gputui.sources.nvml import HostProcesses
from tests.proc_support import Child
from tests.signal_counter import signal_counter, signals_got


@pytest.fixture
def counter() -> Iterator[Child]:
    with signal_counter() as child:
        yield child


def test_a_pid_that_now_belongs_to_another_process_gets_no_signal(counter: Child) -> None:
    pid = counter.proc.pid
    started = psutil.Process(pid).create_time()
    # the snapshot saw an earlier process under this pid: one that started a minute before this one
    seen = GpuProcess(pid, name="python train.py", user=psutil.Process(pid).username(), started=started - 60.0)
    result = kill_local(pid, "TERM", seen, host="box")
    assert not result.ok
    assert result.line == f"kill refused: process {pid} has ended (its PID now belongs to another process): nothing sent"
    assert signals_got(counter) == 0


def test_the_snapshots_own_process_gets_the_signal(counter: Child) -> None:
    pid = counter.proc.pid
    seen = GpuProcess(pid, name="python counter", started=psutil.Process(pid).create_time())
    result = kill_local(pid, "TERM", seen, host="box")
    assert result.ok and result.line == f"SIGTERM sent to pid {pid} (python counter) on box"
    assert signals_got(counter) == 1


def test_the_nvml_source_keeps_each_process_start_time() -> None:
    seen = HostProcesses().read(os.getpid())
    assert seen.started == psutil.Process().create_time()
