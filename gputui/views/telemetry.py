"""Rich tables of host snapshots for `gputui monitor` (the dashboard draws its own).

Names, states and messages come from remote hosts: every cell is a `Text`, never markup,
cleaned of control characters. Numbers are formatted by `gputui.model.units` and always carry
their unit ("57/400 W", "36°C", "1.1/80 GiB").

The table fits the width it is drawn at without cutting a value: each column is as wide as
its widest value, and when they do not all fit, whole columns drop, in this fixed order
(first dropped first):

 1. Throttle        2. Procs       3. SM/Mem (clocks)   4. P (performance state)
 5. Fan             6. Poll
 7. Host, State, CPU and RAM leave their columns for a host line: a row of its own above
    the host's GPUs, "vm  ok  CPU 10%  RAM 1.1/126 GiB  poll 150 ms", on more lines where
    narrow (never between a label and its value, or a number and its unit)
 8. MemBW           9. Temp       10. Util
GPU, Name / reason, Memory and Power never drop. A host's reason (unreachable, failed, no
driver) is in the Name / reason column, which takes the width the others leave and wraps
at spaces, so the reason is read whole at any width. Rich lays the table out; this module
only chooses the columns (`layout`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, RenderResult
from rich.table import Table
from rich.text import Text

from gputui.model import units
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, throttle_text
from gputui.model.text import MAX_CHARS, clean
from gputui.monitor.processes import ProcessRow

NAME_W = 40  # a longer GPU name is cut with an ellipsis
HOST_W = 48  # a longer host name is cut with an ellipsis
COMMAND_W = 60  # a process's command line in the process table
MESSAGE_CHARS = 300  # a host's message folds in its cell up to this length
REASON_MIN_W = 24  # the Name / reason column is never narrower than this (a reason wraps at spaces)
STATE_STYLE = {
    HostState.OK: "green",
    HostState.NO_DRIVER: "yellow",
    HostState.CONNECTING: "cyan",
}


@dataclass(frozen=True)
class _Col:
    key: str
    title: str
    right: bool = False  # numbers are right-aligned


HOST_COLS = (_Col("host", "Host"), _Col("state", "State"), _Col("cpu", "CPU", True), _Col("ram", "RAM", True),
             _Col("poll", "Poll", True))
GPU_COLS = (_Col("gpu", "GPU", True), _Col("name", "Name / reason"), _Col("util", "Util", True),
            _Col("membw", "MemBW", True), _Col("memory", "Memory", True), _Col("temp", "Temp", True),
            _Col("power", "Power", True), _Col("fan", "Fan", True), _Col("clocks", "SM/Mem", True),
            _Col("pstate", "P"), _Col("throttle", "Throttle"), _Col("procs", "Procs", True))
HOST_LINE = "host-line"  # the drop step that moves Host, State, CPU, RAM (and Poll) to a line of their own
DROP_ORDER = ("throttle", "procs", "clocks", "pstate", "fan", "poll", HOST_LINE, "membw", "temp", "util")
INLINE_HOST = ("host", "state", "cpu", "ram")


def safe(value: object, style: str = "", width: int | None = None, limit: int = MAX_CHARS) -> Text:
    """A cell from outside the process: plain text (no markup), without control characters, at
    most `limit` characters; with a `width`, one line of at most that many cells."""
    text = Text(clean(str(value), limit), style=style)
    if width is not None:
        text.no_wrap, text.overflow = True, "ellipsis"
        text.truncate(width, overflow="ellipsis")
    return text


def _num(fn: object, *values: object) -> Text:
    """A number through its `units` format; a value that is text where a number belongs (a
    replayed file) is shown as that text, cleaned."""
    if any(isinstance(v, str) for v in values):
        return safe("/".join("" if v is None else str(v) for v in values), width=16)
    return Text(fn(*values))  # type: ignore[operator]


def _poll(host: HostSnapshot) -> str:
    return units.NA if host.duration_s is None else f"{host.duration_s * 1000:.0f} ms"


def _host_cells(host: HostSnapshot) -> dict[str, Text]:
    return {
        "host": safe(host.name, "bold", width=HOST_W),
        "state": Text(host.state.value, style=STATE_STYLE.get(host.state, "bold red")),
        "cpu": _num(units.pct, host.cpu_pct),
        "ram": _num(units.mem, host.mem_used_mib, host.mem_total_mib),
        "poll": Text(_poll(host)),
    }


def _host_line(host: HostSnapshot, width: int | None) -> Text:
    """Everything about the host above its GPUs: name and state, CPU, RAM and poll time, packed
    into lines of `width` cells; a label stays on the line of its value ("RAM 3.2/15 GiB").
    Without a width, one piece a line (what the column must hold)."""
    state = Text(host.state.value, style=STATE_STYLE.get(host.state, "bold red"))
    pieces = [Text.assemble(safe(host.name, "bold", width=HOST_W), "  ", state)]
    if host.cpu_pct is not None or host.mem_total_mib is not None:
        pieces.append(Text.assemble("CPU ", _num(units.pct, host.cpu_pct)))
        pieces.append(Text.assemble("RAM ", _num(units.mem, host.mem_used_mib, host.mem_total_mib)))
    if host.duration_s is not None:
        pieces.append(Text(f"poll {_poll(host)}", style="dim"))
    if width is None:
        return Text("\n").join(pieces)
    lines = [pieces[0]]
    for piece in pieces[1:]:
        if lines[-1].cell_len + 2 + piece.cell_len <= width:
            lines[-1] = Text.assemble(lines[-1], "  ", piece)
        else:
            lines.append(piece)
    return Text("\n").join(lines)


def _reason(host: HostSnapshot) -> Text:
    """Why the host has no GPU row (or a note), styled by whether the poll worked."""
    text = host.message or ("no GPU" if host.state.worked else host.state.value)
    return safe(text, "dim" if host.state.worked else "red", limit=MESSAGE_CHARS)


def _gpu_cells(gpu: GpuSample) -> dict[str, Text]:
    return {
        "gpu": Text(str(gpu.index)),
        "name": safe(gpu.name or units.NA, width=NAME_W),
        "util": _num(units.pct, gpu.util_pct),
        "membw": _num(units.pct, gpu.mem_util_pct),
        "memory": _num(units.mem, gpu.mem_used_mib, gpu.mem_total_mib),
        "temp": _num(units.temp, gpu.temperature_c),
        "power": _num(units.power, gpu.power_w, gpu.power_limit_w),
        "fan": _num(units.pct, gpu.fan_pct),
        "clocks": _num(_mhz, gpu.clock_sm_mhz, gpu.clock_mem_mhz),
        "pstate": safe(units.NA if gpu.pstate is None else gpu.pstate, width=5),
        "throttle": Text(throttle_text(gpu.throttle), style="bold yellow" if gpu.throttled else "dim"),
        "procs": Text(str(len(gpu.processes))),
    }


def _mhz(sm: float | None, mem: float | None) -> str:
    """Clocks: "1980/2619 MHz"."""
    if sm is None and mem is None:
        return units.NA
    return "/".join(units.NA if v is None else f"{v:.0f}" for v in (sm, mem)) + " MHz"


def _rows(hosts: Sequence[HostSnapshot], host_line: bool, name_w: int | None = None) -> list[dict[str, Text]]:
    """The table's rows as cells by column key (a key left out is an empty cell); `name_w` is
    the width the Name / reason column gets, where known."""
    rows: list[dict[str, Text]] = []
    for host in hosts:
        if host_line:
            rows.append({"name": _host_line(host, name_w)})
            if not host.gpus:
                rows.append({"name": _reason(host)})
            rows.extend(_gpu_cells(gpu) for gpu in host.gpus)
            continue
        cells = _host_cells(host)
        if not host.gpus:
            rows.append({**cells, "name": _reason(host)})
        for n, gpu in enumerate(host.gpus):
            rows.append({**(cells if n == 0 else {}), **_gpu_cells(gpu)})
    return rows


def _columns(dropped: set[str]) -> list[_Col]:
    host = [] if HOST_LINE in dropped else [c for c in HOST_COLS if c.key not in dropped]
    return host + [c for c in GPU_COLS if c.key not in dropped]


def _needed(col: _Col, rows: list[dict[str, Text]]) -> int:
    """Cells the column needs to show every value whole: the widest value (or header); the
    Name / reason column wraps, so it needs its GPU names and REASON_MIN_W."""
    widths = [cell_len(col.title)]
    for row in rows:
        cell = row.get(col.key)
        if cell is None:
            continue
        if col.key == "name" and not cell.no_wrap:  # a reason or a host line: wraps at spaces
            first, *more = cell.plain.split("\n")  # a host line's CPU, RAM and poll stay whole
            widths.extend([min(cell_len(first), REASON_MIN_W), *map(cell_len, more)])
        else:
            widths.append(cell.cell_len)
    return max(widths)


def table_width(widths: Sequence[int]) -> int:
    """Cells a HEAVY_HEAD table takes for columns of these content widths (padding 0,1, a
    border on each side and between columns)."""
    n = len(widths)
    return sum(widths) + 3 * n + 1 if n else 0


class _Needs:
    """The rows of both table shapes (host columns, host lines), each built once, and each
    column's need in each, measured once: `layout` tries up to 11 drop steps on them."""

    def __init__(self, hosts: Sequence[HostSnapshot]) -> None:
        self.hosts = hosts
        self._rows: dict[bool, list[dict[str, Text]]] = {}
        self._needs: dict[tuple[bool, str], int] = {}

    def rows(self, host_line: bool) -> list[dict[str, Text]]:
        rows = self._rows.get(host_line)
        if rows is None:
            rows = self._rows[host_line] = _rows(self.hosts, host_line)
        return rows

    def need(self, col: _Col, host_line: bool) -> int:
        need = self._needs.get((host_line, col.key))
        if need is None:
            need = self._needs[(host_line, col.key)] = _needed(col, self.rows(host_line))
        return need


def _layout(hosts: Sequence[HostSnapshot], width: int, needs: _Needs) -> tuple[list[_Col], bool]:
    # no GPU on any host: the GPU columns would all be empty; the reason column says why
    dropped: set[str] = set() if any(h.gpus for h in hosts) else {c.key for c in GPU_COLS if c.key != "name"}
    for step in (None, *DROP_ORDER):
        if step is not None:
            dropped.add(step)
        cols = _columns(dropped)
        host_line = HOST_LINE in dropped
        if table_width([needs.need(c, host_line) for c in cols]) <= width:
            break
    return cols, HOST_LINE in dropped


def layout(hosts: Sequence[HostSnapshot], width: int) -> tuple[list[_Col], bool]:
    """The columns that fit `width` (dropping in DROP_ORDER) and whether hosts get a host line."""
    return _layout(hosts, width, _Needs(hosts))


def hosts_table(hosts: Sequence[HostSnapshot], width: int = 200) -> Table:
    """One row per GPU; a host without GPUs (or not ok) gets one row with its reason. The
    columns are those that fit `width` (see the module's docstring)."""
    needs = _Needs(hosts)
    cols, host_line = _layout(hosts, width, needs)
    others = [needs.need(c, host_line) for c in cols if c.key != "name"]
    if host_line:  # the host lines are packed to the width the name column gets
        rows = _rows(hosts, host_line, name_w=width - table_width([*others, 0]))
        name_need = _needed(next(c for c in cols if c.key == "name"), rows)
    else:
        rows = needs.rows(False)
        name_need = needs.need(next(c for c in cols if c.key == "name"), False)
    table = Table(show_lines=False, header_style="bold")
    for col in cols:
        if col.key == "name":
            title = "Host / GPU name" if host_line else col.title
            table.add_column(title, no_wrap=False, overflow="fold", min_width=name_need)
        else:
            table.add_column(col.title, no_wrap=True, overflow="ellipsis", min_width=needs.need(col, host_line),
                             justify="right" if col.right else "left")
    for row in rows:
        table.add_row(*(row.get(c.key, Text("")) for c in cols))
    return table


class HostsTable:
    """The hosts table as a renderable laid out for the width it is drawn at (so a live view
    follows the terminal's resizes)."""

    def __init__(self, hosts: Sequence[HostSnapshot]) -> None:
        self.hosts = list(hosts)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield hosts_table(self.hosts, options.max_width)


PROC_COLS = (_Col("host", "Host"), _Col("gpu", "GPU", True), _Col("pid", "PID", True), _Col("user", "User"),
             _Col("memory", "GPU mem", True), _Col("sm", "SM", True), _Col("cpu", "CPU", True), _Col("rss", "RSS", True),
             _Col("time", "Time", True), _Col("command", "Command"))
PROC_DROP_ORDER = ("rss", "time", "sm", "cpu", "user")  # Host, GPU, PID, GPU mem and Command stay
COMMAND_MIN_W = 16  # the command wraps (at spaces) to what the other columns leave, never below this


def _process_cells(row: ProcessRow) -> dict[str, Text]:
    p = row.process
    return {
        "host": safe(row.host, "bold", width=32), "gpu": Text(str(row.gpu)), "pid": Text(str(p.pid)),
        "user": safe(p.user or units.NA, width=16), "memory": _num(units.mib, p.gpu_memory_mib),
        "sm": _num(units.pct, p.sm_pct), "cpu": _num(units.pct, p.cpu_pct), "rss": _num(units.mib, p.rss_mib),
        "time": Text(units.duration(p.running_s, "clock")), "command": safe(p.name or units.NA, limit=COMMAND_W * 4),
    }


def processes_table(rows: Sequence[ProcessRow], width: int = 200) -> Table:
    """One row per compute process (gputui monitor --procs); users and commands are text. The
    command wraps (at spaces) to the width the other columns leave; where they do not fit, RSS,
    Time, SM, CPU and User drop, in that order."""
    cells = [_process_cells(row) for row in rows]

    def need(col: _Col) -> int:
        if col.key == "command":
            return max([cell_len(col.title), COMMAND_MIN_W])
        return max([cell_len(col.title), *(c[col.key].cell_len for c in cells)])

    for n in range(len(PROC_DROP_ORDER) + 1):
        cols = [c for c in PROC_COLS if c.key not in PROC_DROP_ORDER[:n]]
        if table_width([need(c) for c in cols]) <= width:
            break
    table = Table(show_lines=False, header_style="bold", title="Processes")
    for col in cols:
        if col.key == "command":
            table.add_column(col.title, no_wrap=False, overflow="fold", min_width=need(col))
        else:
            table.add_column(col.title, no_wrap=True, overflow="ellipsis", min_width=need(col),
                             justify="right" if col.right else "left")
    if not cells:
        table.add_row(*[""] * (len(cols) - 1), Text("no compute process", style="dim"))
    for c in cells:
        table.add_row(*(c[col.key] for col in cols))
    return table


class ProcessesTable:
    """The process table as a renderable laid out for the width it is drawn at."""

    def __init__(self, rows: Sequence[ProcessRow]) -> None:
        self.rows = list(rows)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield processes_table(self.rows, options.max_width)
