"""The lab view of `gputui monitor`: one line per host when the GPU rows do not fit, and the
per-account table of `--users`.

Built from plain strings (f-strings), not a rich Table per row: a fleet of 256 hosts is drawn
every second, so a line costs microseconds. A host line reads, at 80 columns:

    sim-3   ok     ▇█▇▇○○▁?   2 free   71%  412/640 GiB  alice 410 GiB
    sim-9   unreachable  --------  ssh: connect to host 10.0.0.9 port 22: Connection refused

The strip has one cell per GPU: a block as high as the GPU's utilisation (▁ below 12.5%, █ from
87.5%), `○` for a free GPU (by the profile's [free] rule), `?` when utilisation is not
available. On a terminal a cell's colour is its memory in use (blue below 25%, cyan below 50%,
yellow below 75%, red above; a free GPU green); off a terminal the colours are dropped and the
line is the same text. An unreachable host shows a `-` for each GPU it had when last seen, and
its reason. Names and reasons come from remote hosts: cleaned of control characters, and drawn
as `Text`, never markup.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterable, NamedTuple, Sequence

from rich.console import Group
from rich.text import Text

from gputui.model import units
from gputui.model.telemetry import HostSnapshot, HostState
from gputui.model.text import clean
from gputui.monitor.lab import GpuCell, HostLine, LabFilter, LabFrame, UserTotal, filter_lines, sort_lines

LEVELS = "▁▂▃▄▅▆▇█"  # utilisation, in eighths
FREE_MARK = "○"  # as the dashboard's hosts panel draws it
NA_MARK = "?"  # utilisation not available
DOWN_MARK = "-"  # a GPU of a host that does not answer
NAME_MAX = 24  # a longer host name is cut with an ellipsis
USER_MAX = 16  # an account name in a host line
REASON_CHARS = 300  # an unreachable host's reason, off a terminal
DEFAULT_LINES = 50  # off a terminal, more GPU rows than $LINES (default this) switch to the lab view
MORE_HINT = "(--filter, --hosts-sort)"
STATE_STYLE = {HostState.OK: "green", HostState.NO_DRIVER: "yellow", HostState.CONNECTING: "cyan"}


def table_rows(hosts: Sequence[HostSnapshot]) -> int:
    """Lines the GPU table takes (a row per GPU, one for a host without GPUs, the heading and
    borders): what decides between the GPU table and the lab view."""
    return sum(len(h.gpus) or 1 for h in hosts) + 4


def cell_char(cell: GpuCell) -> str:
    """A GPU's cell in its host's strip: `○` free, a block as high as its utilisation, `?` n/a."""
    if cell.free:
        return FREE_MARK
    try:
        level = int(cell.util_pct * 0.08)  # type: ignore[operator]
    except (TypeError, ValueError):  # None, text from a recording, NaN
        return NA_MARK
    return LEVELS[7 if level > 7 else 0 if level < 0 else level]


def cell_style(cell: GpuCell) -> str:
    """The cell's colour on a terminal: green when free, else by its memory in use."""
    if cell.free:
        return "bold green"
    mem = cell.mem_pct
    if not isinstance(mem, (int, float)) or mem != mem:
        return "dim"
    return "blue" if mem < 25 else "cyan" if mem < 50 else "yellow" if mem < 75 else "red"


def strip(line: HostLine) -> str:
    """The host's cells, one character per GPU."""
    if not line.reachable:
        return DOWN_MARK * line.gpus if line.gpus else NA_MARK
    return "".join(map(cell_char, line.cells))


def _name(name: str) -> str:
    name = clean(name, 200)
    return name if len(name) <= NAME_MAX else name[: NAME_MAX - 1] + "…"


def _top(line: HostLine) -> str:
    if line.top_user is not None:
        return f"{clean(line.top_user, USER_MAX)} {units.mib(line.top_user_mib)}"
    return clean(line.message, REASON_CHARS) if line.message else ""


class _Fields(NamedTuple):
    """What a host line prints, computed once for the columns' widths and the line itself."""

    line: HostLine
    name: str
    memory: str


def _fields(line: HostLine) -> _Fields:
    memory = units.mem(line.mem_used_mib, line.mem_total_mib) if line.reachable else ""
    return _Fields(line, _name(line.name), memory)


@dataclass(frozen=True)
class Columns:
    """The widths of a set of host lines' columns."""

    name: int
    state: int
    strip: int
    memory: int

    @classmethod
    def of(cls, rows: Sequence[_Fields]) -> "Columns":
        return cls(
            name=max([4, *(len(r.name) for r in rows)]),
            state=max([5, *(len(r.line.state.value) for r in rows)]),
            strip=max([4, *(r.line.gpus for r in rows)]),
            memory=max([6, *(len(r.memory) for r in rows)]),
        )

    def header(self) -> str:
        return (f"{'Host':<{self.name}}  {'State':<{self.state}}  {'GPUs':<{self.strip}}  {'Free':>7}  {'Util':>4}  "
                f"{'Memory':>{self.memory}}  Top account (GPU memory)")


def host_text(row: _Fields, cols: Columns) -> str:
    """One host as a line of plain text."""
    line = row.line
    head = f"{row.name:<{cols.name}}  {line.state.value:<{cols.state}}  {strip(line):<{cols.strip}}  "
    if not line.reachable:
        return head + clean(line.message or line.state.value, REASON_CHARS)
    return f"{head}{line.free:>2} free  {units.pct(line.util_pct):>4}  {row.memory:>{cols.memory}}  {_top(line)}".rstrip()


def host_rich(row: _Fields, cols: Columns) -> Text:
    """One host as a styled line for a terminal (the same text as host_text): one row, cut at the width."""
    line = row.line
    text = Text(no_wrap=True, overflow="ellipsis")
    text.append(f"{row.name:<{cols.name}}", "bold")
    text.append("  ")
    text.append(f"{line.state.value:<{cols.state}}", STATE_STYLE.get(line.state, "bold red"))
    text.append("  ")
    if not line.reachable:
        text.append(f"{strip(line):<{cols.strip}}", "red")
        text.append("  ")
        text.append(clean(line.message or line.state.value, REASON_CHARS), "red")
        return text
    run_style = ""
    run: list[str] = []
    for cell in line.cells:  # one span per run of cells of one colour
        style = cell_style(cell)
        if style != run_style and run:
            text.append("".join(run), run_style)
            run = []
        run_style = style
        run.append(cell_char(cell))
    if run:
        text.append("".join(run), run_style)
    text.append(" " * (cols.strip - len(line.cells)))
    text.append(f"  {line.free:>2} free", "bold green" if line.free else "dim")
    text.append(f"  {units.pct(line.util_pct):>4}  {row.memory:>{cols.memory}}")
    top = _top(line)
    if top:
        text.append(f"  {top}", "" if line.top_user is not None else "dim")
    return text


@dataclass(frozen=True)
class LabOptions:
    """What the lab view's flags ask for: the order (--hosts-sort) and the filter (--filter)."""

    sort: str = "name"
    wanted: LabFilter | None = None

    def lines(self, frame: LabFrame) -> list[HostLine]:
        """The frame's host lines this view shows, in its order."""
        lines: Iterable[HostLine] = frame.lines
        if self.wanted is not None:
            lines = filter_lines(lines, self.wanted)
        return sort_lines(lines, self.sort)


def fleet_text(frame: LabFrame, shown: int, options: LabOptions) -> str:
    """The fleet line, and which hosts a filter keeps."""
    line = frame.totals.line()
    if options.wanted is not None:
        line += f"  [filter {str(options.wanted)!r}: {shown:,} of {len(frame.lines):,} hosts]"
    return line


def lab_plain(frame: LabFrame, options: LabOptions) -> str:
    """Every host line of the round, as plain text (off a terminal): the fleet line, the
    columns' heading, one line a host."""
    rows = [_fields(ln) for ln in options.lines(frame)]
    cols = Columns.of(rows)
    out = [fleet_text(frame, len(rows), options), cols.header()]
    out.extend(host_text(row, cols) for row in rows)
    return "\n".join(out)


def lab_live(frame: LabFrame, options: LabOptions, height: int, header: Text | None = None) -> Group:
    """The lab view for a terminal of `height` rows: only the host lines that fit are built,
    then "... N more hosts"."""
    lines = options.lines(frame)
    room = max(1, height - 2 - (header is not None))  # the header, the fleet line, the heading
    more = 0
    if len(lines) > room:
        room = max(1, room - 1)  # the "more" line
        more = len(lines) - room
        lines = lines[:room]
    rows = [_fields(ln) for ln in lines]
    cols = Columns.of(rows)
    parts: list[Text] = [] if header is None else [header]
    parts.append(Text(fleet_text(frame, len(lines) + more, options), style="bold", no_wrap=True, overflow="ellipsis"))
    parts.append(Text(cols.header(), style="bold dim", no_wrap=True, overflow="ellipsis"))
    parts.extend(host_rich(row, cols) for row in rows)
    if more:
        parts.append(Text(f"... {more:,} more {'host' if more == 1 else 'hosts'} {MORE_HINT}", style="dim"))
    return Group(*parts)


# -- gputui monitor --users ------------------------------------------------------------------------


def counted_since(started: float, now: float) -> tuple[float, str]:
    """When this monitor's GPU-hours today start: its start, or local midnight when later."""
    t = time.localtime(now)
    midnight = time.mktime((t.tm_year, t.tm_mon, t.tm_mday, 0, 0, 0, 0, 0, -1))
    if started >= midnight:
        return started, "this monitor's start"
    return midnight, "local midnight"


def users_plain(users: Sequence[UserTotal], since: float, why: str) -> str:
    """One row per account, most GPU memory first, under a line that says from when GPU-hours count."""
    width = max([7, *(len(clean(u.user, 32)) for u in users)])
    stamp = time.strftime("%H:%M:%S", time.localtime(since))
    out = [f"{len(users)} {'account' if len(users) == 1 else 'accounts'}; GPU-hours today counted from {stamp} ({why})",
           f"{'Account':<{width}}  {'GPUs':>5}  {'GPU memory':>10}  {'GPU-hours':>9}  {'Hosts':>5}  {'Procs':>5}"]
    for u in users:
        out.append(f"{clean(u.user, 32):<{width}}  {u.gpus:>5}  {units.mib(u.memory_mib):>10}  {u.gpu_hours:>9.2f}  "
                   f"{u.hosts:>5}  {u.processes:>5}")
    if not users:
        out.append("no compute process on any GPU")
    return "\n".join(out)
