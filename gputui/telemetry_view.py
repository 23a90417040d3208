"""Rich tables of host snapshots for `gputui monitor` (the dashboard draws its own).

Names, states and messages come from remote hosts: every cell is a `Text`, never markup,
cleaned of control characters.
"""

from __future__ import annotations

from typing import Sequence

from rich.table import Table
from rich.text import Text

from gputui.model.telemetry import HostSnapshot, HostState, fmt, fmt_pair, throttle_text
from gputui.model.text import MAX_CHARS, clean
from gputui.processes import ProcessRow

NAME_W = 40  # a longer GPU name is cut with an ellipsis
COMMAND_W = 60  # a process's command line in the process table
MESSAGE_CHARS = 300  # a host's message folds in its cell up to this length
STATE_STYLE = {
    HostState.OK: "green",
    HostState.NO_DRIVER: "yellow",
    HostState.CONNECTING: "cyan",
}


def _gib(mib: float | None) -> float | None:
    return None if mib is None else mib / 1024


def safe(value: object, style: str = "", width: int | None = None, limit: int = MAX_CHARS) -> Text:
    """A cell from outside the process: plain text (no markup), without control characters, at
    most `limit` characters; with a `width`, one line of at most that many cells."""
    text = Text(clean(str(value), limit), style=style)
    if width is not None:
        text.no_wrap, text.overflow = True, "ellipsis"
        text.truncate(width, overflow="ellipsis")
    return text


def _add_row(table: Table, *cells: Text | str) -> None:
    """A row whose plain strings (numbers, or what a replayed file put there) are text, not markup."""
    table.add_row(*(cell if isinstance(cell, Text) else safe(cell) for cell in cells))


def _host_cells(host: HostSnapshot) -> list[Text | str]:
    style = STATE_STYLE.get(host.state, "bold red")
    took = "n/a" if host.duration_s is None else f"{host.duration_s * 1000:.0f} ms"
    return [
        safe(host.name, "bold", width=48),
        Text(host.state.value, style=style),
        fmt(host.cpu_pct, "%"),
        fmt_pair(_gib(host.mem_used_mib), _gib(host.mem_total_mib), " GiB"),
        took,
    ]


def hosts_table(hosts: Sequence[HostSnapshot]) -> Table:
    """One row per GPU; a host without GPUs (or not ok) gets one row with its reason."""
    table = Table(show_lines=False, header_style="bold", pad_edge=False)
    for title in ("Host", "State", "CPU", "RAM", "Poll", "GPU", "Name / reason", "Util", "MemBW", "Memory MiB", "Temp", "Power W", "Fan", "SM/Mem MHz", "P", "Throttle", "Procs"):
        table.add_column(title, no_wrap=title not in ("Name / reason",), overflow="fold")
    for host in hosts:
        cells = _host_cells(host)
        if not host.gpus:
            _add_row(table, *cells, "", safe(host.message or "", "dim" if host.state.worked else "red", limit=MESSAGE_CHARS), *[""] * 10)
            continue
        for n, gpu in enumerate(host.gpus):
            _add_row(
                table,
                *(cells if n == 0 else [""] * len(cells)),
                str(gpu.index),
                safe(gpu.name or "n/a", width=NAME_W),
                fmt(gpu.util_pct, "%"),
                fmt(gpu.mem_util_pct, "%"),
                fmt_pair(gpu.mem_used_mib, gpu.mem_total_mib),
                fmt(gpu.temperature_c, "C"),
                fmt_pair(gpu.power_w, gpu.power_limit_w),
                fmt(gpu.fan_pct, "%"),
                fmt_pair(gpu.clock_sm_mhz, gpu.clock_mem_mhz),
                safe(fmt(gpu.pstate), width=5),
                Text(throttle_text(gpu.throttle), style="bold yellow" if gpu.throttled else "dim"),
                str(len(gpu.processes)),
            )
    return table


def duration(seconds: float | None) -> str:
    """A process's age: "42s", "3:07" (m:ss), "5:03:07" (h:mm:ss) or "2d 05h"."""
    if seconds is None:
        return "n/a"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}:{s % 60:02d}"
    if s < 86400:
        return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
    return f"{s // 86400}d {s % 86400 // 3600:02d}h"


def processes_table(rows: Sequence[ProcessRow]) -> Table:
    """One row per compute process (gputui monitor --procs); users and commands are text."""
    table = Table(show_lines=False, header_style="bold", pad_edge=False, title="Processes")
    for title in ("Host", "GPU", "PID", "User", "GPU MiB", "SM", "CPU", "RSS MiB", "Time", "Command"):
        table.add_column(title, no_wrap=True, overflow="ellipsis", justify="right" if title in ("GPU", "PID", "GPU MiB", "SM", "CPU", "RSS MiB", "Time") else "left")
    if not rows:
        table.add_row(*[""] * 9, Text("no compute process", style="dim"))
    for row in rows:
        p = row.process
        _add_row(table, safe(row.host, "bold", width=32), str(row.gpu), str(p.pid), safe(p.user or "n/a", width=16),
                 fmt(p.gpu_memory_mib), fmt(p.sm_pct, "%"), fmt(p.cpu_pct, "%"), fmt(p.rss_mib), duration(p.running_s),
                 safe(p.name or "n/a", width=COMMAND_W))
    return table
