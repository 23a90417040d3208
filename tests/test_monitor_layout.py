"""`gputui monitor`'s table at 80, 100, 120 and 200 columns, fed from the real H100 reading plus
an A100 host whose name holds markup, an unreachable host with a long reason and a CPU-only host
that is training: every value whole on a line, with its unit, no line wider than the terminal,
columns dropped in the documented order; and the local host's CPU % on the first poll."""

from __future__ import annotations

import io
import json
import re
from collections import namedtuple
from pathlib import Path

import pytest
from rich.cells import cell_len
from rich.console import Console

from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, round_from_dict
from gputui.monitor.processes import rows as process_rows
from gputui.views.telemetry import DROP_ORDER, HOST_LINE, HostsTable, ProcessesTable, _columns, layout

from .conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "h100"
WIDTHS = (80, 100, 120, 200)
REASON = ("ssh: connect to host 10.0.0.7 port 22: Connection timed out after 10 s "
          "(is the instance up? check its security group and that sshd listens)")


def h100_round() -> list[HostSnapshot]:
    return round_from_dict(json.loads((FIXTURES / "monitor-once-training.json").read_text()))


def hosts() -> list[HostSnapshot]:
    a100 = GpuSample(0, name="NVIDIA A100-SXM4-40GB", util_pct=93.0, mem_util_pct=41.0, mem_used_mib=4096.0,
                     mem_total_mib=40960.0, temperature_c=36.0, power_w=57.0, power_limit_w=400.0, fan_pct=None,
                     clock_sm_mhz=1410.0, clock_mem_mhz=1215.0, pstate="P0", throttle=())
    return [
        *h100_round(),
        HostSnapshot("a100-[cloud]", HostState.OK, 1.0, duration_s=0.21, kind="ssh", cpu_pct=12.0,
                     mem_used_mib=20480.0, mem_total_mib=257000.0, gpus=(a100,)),
        HostSnapshot("gpu-node-2.example.org", HostState.UNREACHABLE, 1.0, kind="ssh", message=REASON),
        HostSnapshot("cpu-trainer", HostState.NO_DRIVER, 1.0, duration_s=0.01, kind="local", cpu_pct=97.5,
                     mem_used_mib=3300.0, mem_total_mib=15800.0, message="no NVIDIA driver (libnvidia-ml.so not found)"),
    ]


def render(width: int, table: object = None) -> list[str]:
    console = Console(width=width, file=io.StringIO(), color_system=None, highlight=False, legacy_windows=False)
    console.print(HostsTable(hosts()) if table is None else table)
    return console.file.getvalue().splitlines()  # type: ignore[attr-defined]


# Each appears whole on one line at every width: names, and numbers with their units after a space.
VALUES = ("NVIDIA H100 80GB HBM3", "118/700 W", "35°C", "1.1/80 GiB", "NVIDIA A100-SXM4-40GB", "57/400 W", "36°C",
          "4.0/40 GiB", "93%", "a100-[cloud]", "gpu-node-2.example.org", "unreachable", "cpu-trainer", "no-driver")


@pytest.mark.parametrize("width", WIDTHS)
def test_every_value_is_whole_and_no_line_is_wider_than_the_terminal(width: int) -> None:
    lines = render(width)
    text = "\n".join(lines)
    too_wide = [line for line in lines if cell_len(line) > width]
    assert not too_wide, text
    missing = [value for value in VALUES if not any(value in line for line in lines)]
    assert not missing, f"cut or missing at {width} columns: {missing}\n{text}"
    assert "Power" in lines[1] and "Memory" in lines[1], text  # never dropped


@pytest.mark.parametrize("width", WIDTHS)
def test_the_reason_of_an_unreachable_host_reads_whole(width: int) -> None:
    """Word by word, in order, no word cut: it wraps at spaces in the Name / reason column."""
    lines = render(width)
    tokens = [t for line in lines for t in re.split(r"[\s│┃]+", line) if t]
    assert " ".join(REASON.split()) in " ".join(tokens), "\n".join(lines)


@pytest.mark.parametrize("width", WIDTHS)
def test_a_cpu_only_host_shows_its_cpu_and_ram(width: int) -> None:
    lines = render(width)
    at = next(i for i, line in enumerate(lines) if "cpu-trainer" in line)
    near = " ".join(lines[at:at + 2])  # its row, or its host line (two lines when narrow)
    assert "98%" in near and "3.2/15 GiB" in near, "\n".join(lines)
    tokens = [t for line in lines[at:] for t in re.split(r"[\s│┃]+", line) if t]
    assert "no NVIDIA driver (libnvidia-ml.so not found)" in " ".join(tokens), "\n".join(lines)


def test_wide_table_keeps_the_host_columns_and_the_clocks() -> None:
    lines = render(200)
    assert all(title in lines[1] for title in ("Host", "State", "CPU", "RAM", "Poll", "SM/Mem", "Fan")), lines[1]
    row = next(line for line in lines if "NVIDIA H100 80GB HBM3" in line)
    assert "vm" in row and "10%" in row and "1.1/126 GiB" in row and "150 ms" in row and "1980/2619 MHz" in row, row


def test_narrow_table_puts_the_host_on_a_line_of_its_own() -> None:
    lines = render(80)
    assert "Host" not in lines[1].replace("Host / GPU name", ""), lines[1]
    for piece in ("vm  ok", "CPU 10%", "RAM 1.1/126 GiB", "poll 150 ms", "cpu-trainer  no-driver", "CPU 98%",
                  "RAM 3.2/15 GiB", "gpu-node-2.example.org"):
        assert any(piece in line for line in lines), (piece, "\n".join(lines))


def test_columns_drop_in_the_documented_order() -> None:
    """At any width the dropped columns are the first N of DROP_ORDER, and fewer as it grows."""
    allowed = {tuple(c.key for c in _columns(set(DROP_ORDER[:n]))): n for n in range(len(DROP_ORDER) + 1)}
    seen = []
    for width in range(60, 260, 4):
        cols, host_line = layout(hosts(), width)
        keys = tuple(c.key for c in cols)
        assert keys in allowed, (width, keys)
        assert host_line == (allowed[keys] > DROP_ORDER.index(HOST_LINE)), width
        seen.append(allowed[keys])
    assert seen == sorted(seen, reverse=True) and seen[0] == len(DROP_ORDER) and seen[-1] == 0, seen


def test_monitor_once_json_has_the_local_cpu_percent() -> None:
    """psutil needs two readings for a CPU %: `gputui monitor --once --json` used to print null."""
    result = run_cli("monitor", "--once", "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    (host,) = json.loads(result.stdout)["hosts"]
    assert isinstance(host["cpu_pct"], float) and 0.0 <= host["cpu_pct"] <= 100.0, host
    assert host["mem_used_mib"] > 0 and host["mem_total_mib"] > 0, host


Times = namedtuple("Times", "user system idle")
Memory = namedtuple("Memory", "total available")


class SlowClock:
    """psutil whose CPU times advance 10 ms (all cores) per reading: a window of MIN_CPU_WINDOW_S
    needs several readings."""

    def __init__(self) -> None:
        self.total, self.calls = 0.0, 0

    def cpu_times(self) -> Times:
        self.calls += 1
        self.total += 0.01
        return Times(user=self.total * 0.2, system=self.total * 0.05, idle=self.total * 0.75)

    def virtual_memory(self) -> Memory:
        return Memory(total=16 * 2**30, available=12 * 2**30)


def test_the_first_cpu_reading_waits_for_a_second_and_later_ones_do_not() -> None:
    from gputui.sources.host import LocalHost

    host = LocalHost(first_wait_s=60.0)  # bounded; the fake clock, not the wall, ends the wait
    clock = SlowClock()
    host._psutil = clock  # type: ignore[assignment]
    host._last = host._times()
    cpu, used, total = host.sample()
    assert cpu == pytest.approx(25.0) and (used, total) == (4096.0, 16384.0)
    calls = clock.calls
    host.sample()  # right after: too short a window, and no wait (None until the window is long enough)
    assert clock.calls == calls + 1


@pytest.mark.parametrize("width", WIDTHS)
def test_the_process_table_keeps_numbers_whole_and_wraps_the_command(width: int) -> None:
    """The H100 run's process (gputui monitor --procs): its memory with its unit, its PID, and
    its command line word by word; no line wider than the terminal."""
    listed = process_rows(h100_round())
    lines = render(width, ProcessesTable(listed))
    text = "\n".join(lines)
    assert not [line for line in lines if cell_len(line) > width], text
    for value in ("612 MiB", "425", "vm"):
        assert any(value in line for line in lines), (value, text)
    command = listed[0].process.name
    tokens = [t for line in lines for t in re.split(r"[\s│┃]+", line) if t]
    assert command is not None and command in " ".join(tokens), text
