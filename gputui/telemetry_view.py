"""Rich tables of host snapshots for `gputui monitor` (the dashboard draws its own)."""

from __future__ import annotations

from typing import Sequence

from rich.table import Table
from rich.text import Text

from gputui.model.telemetry import HostSnapshot, HostState, fmt, fmt_pair

STATE_STYLE = {
    HostState.OK: "green",
    HostState.NO_DRIVER: "yellow",
    HostState.CONNECTING: "cyan",
}


def _gib(mib: float | None) -> float | None:
    return None if mib is None else mib / 1024


def _host_cells(host: HostSnapshot) -> list[Text | str]:
    style = STATE_STYLE.get(host.state, "bold red")
    took = "n/a" if host.duration_s is None else f"{host.duration_s * 1000:.0f} ms"
    return [
        Text(host.name, style="bold"),
        Text(host.state.value, style=style),
        fmt(host.cpu_pct, "%"),
        fmt_pair(_gib(host.mem_used_mib), _gib(host.mem_total_mib), " GiB"),
        took,
    ]


def hosts_table(hosts: Sequence[HostSnapshot]) -> Table:
    """One row per GPU; a host without GPUs (or not ok) gets one row with its reason."""
    table = Table(show_lines=False, header_style="bold", pad_edge=False)
    for title in ("Host", "State", "CPU", "RAM", "Poll", "GPU", "Name / reason", "Util", "MemBW", "Memory MiB", "Temp", "Power W", "Fan", "SM/Mem MHz", "P", "Procs"):
        table.add_column(title, no_wrap=title not in ("Name / reason",), overflow="fold")
    for host in hosts:
        cells = _host_cells(host)
        if not host.gpus:
            table.add_row(*cells, "", Text(host.message or "", style="dim" if host.state.worked else "red"), *[""] * 9)
            continue
        for n, gpu in enumerate(host.gpus):
            table.add_row(
                *(cells if n == 0 else [""] * len(cells)),
                str(gpu.index),
                gpu.name or "n/a",
                fmt(gpu.util_pct, "%"),
                fmt(gpu.mem_util_pct, "%"),
                fmt_pair(gpu.mem_used_mib, gpu.mem_total_mib),
                fmt(gpu.temperature_c, "C"),
                fmt_pair(gpu.power_w, gpu.power_limit_w),
                fmt(gpu.fan_pct, "%"),
                fmt_pair(gpu.clock_sm_mhz, gpu.clock_mem_mhz),
                fmt(gpu.pstate),
                str(len(gpu.processes)),
            )
    return table
