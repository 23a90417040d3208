"""A whole lab at a glance: which GPUs are free, who holds the others, one line per host.

The data layer of the lab view (`gputui monitor` when the GPUs do not fit, the dashboard's
hosts panel), of `gputui monitor --free` and `--users`. No UI here: frozen records built from
polling rounds, the rule that says "free" (the profile's `[free]` table, `FreeRule`), sorting
and filtering, and the per-account totals, GPU-hours included, that only a sequence of polls
can give (`Lab`).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from gputui.config.free import FreeRule
from gputui.model.telemetry import FleetColumns, GpuColumns, GpuSample, HostSnapshot, HostState, plain_rows

UNKNOWN_USER = "n/a"  # the account of a process whose owner the host did not say
MAX_CREDIT_S = 300.0  # a host silent longer than this between two polls is credited this much at most
SORT_KEYS = ("name", "util", "free", "memory")
_DIGITS = re.compile(r"(\d+)")


def free_rule(profile: Any | None) -> FreeRule:
    """The profile's `[free]` table (the defaults without one, or without a profile)."""
    table = getattr(profile, "tables", {}).get("free") if profile is not None else None
    return FreeRule() if table is None else FreeRule.from_table(table)


def is_free(gpu: GpuSample, rule: FreeRule) -> bool:
    """Whether a GPU is free by `rule` (see FreeRule: a missing figure is not held against it,
    but a GPU with neither utilisation nor memory known is never free)."""
    if gpu.processes and not rule.allow_processes:
        return False
    util, mem = gpu.util_pct, gpu.mem_used_mib
    if util is None and mem is None:
        return False
    return (util is None or util <= rule.max_util_pct) and (mem is None or mem <= rule.max_memory_mib)


class GpuCell(NamedTuple):
    """One GPU of a host line: what its cell in the strip shows (made only for the lines drawn)."""

    gpu: int  # its index on the host (`index` would hide tuple.index)
    util_pct: float | None
    mem_pct: float | None
    free: bool
    held: bool  # a compute process runs on it


@dataclass(frozen=True)
class HostLine:
    """One host of the lab view. An unreachable host keeps the GPU count it had when last seen."""

    name: str
    state: HostState
    message: str | None
    gpus: int
    samples: Sequence[GpuSample] = ()  # the round's GPUs (their cells are made when a line is drawn)
    frees: tuple[bool, ...] = ()  # which of them are free, by the lab's rule
    free: int = 0
    util_pct: float | None = None  # the mean of the GPUs that say
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    top_user: str | None = None  # the account holding the most GPU memory here
    top_user_mib: float | None = None
    # Per account on this host: (account, GPUs it runs a process on, their memory MiB, processes);
    # the fleet's totals and GPU-hours are sums of these (one pass over a round's GPUs).
    held: tuple[tuple[str, int, float, int], ...] = ()

    @property
    def reachable(self) -> bool:
        return self.state.worked

    @cached_property
    def users(self) -> frozenset[str]:
        """The accounts with a process here."""
        return frozenset(user for user, *_ in self.held)

    @cached_property
    def cells(self) -> tuple[GpuCell, ...]:
        """The strip's cells, one a GPU: a lab round has 2,048 GPUs and a screen shows ~30 lines."""
        if isinstance(self.samples, GpuColumns):  # from the round's arrays: no sample is built
            fleet, row = self.samples.fleet, self.samples.row
            return tuple(map(GpuCell, range(fleet.gpus), fleet.listed("util_pct")[row], _mem_pcts(fleet)[row],
                             self.frees, _held(fleet)[row]))
        return tuple(GpuCell(g.index, g.util_pct, g.mem_pct, free, bool(g.processes)) for g, free in zip(self.samples, self.frees))

    @property
    def busy(self) -> int:
        return self.gpus - self.free if self.reachable else 0

    @property
    def mem_pct(self) -> float | None:
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return 100.0 * self.mem_used_mib / self.mem_total_mib


def host_line(host: HostSnapshot, rule: FreeRule, known_gpus: int = 0) -> HostLine:
    """The lab view's line of one host snapshot; `known_gpus`: its GPU count when last seen.
    One pass over the GPUs (a lab's round makes 2,048 cells)."""
    if not host.state.worked:
        return HostLine(host.name, host.state, host.message, max(known_gpus, len(host.gpus)))
    if isinstance(host.gpus, GpuColumns):
        return _columns_line(host, host.gpus, rule)
    frees = []
    free = 0
    util_sum, util_n = 0.0, 0
    used: float | None = None
    total: float | None = None
    memory: dict[str, float] = {}
    gpus: dict[str, int] = {}
    processes: dict[str, int] = {}
    for g in host.gpus:
        util, mem, size, procs = g.util_pct, g.mem_used_mib, g.mem_total_mib, g.processes
        free_now = is_free(g, rule)
        free += free_now
        if util is not None:
            util_sum += util
            util_n += 1
        if mem is not None:
            used = mem if used is None else used + mem
        if size is not None:
            total = size if total is None else total + size
        frees.append(free_now)
        if not procs:
            continue
        for p in procs:
            user = p.user or UNKNOWN_USER
            memory[user] = memory.get(user, 0.0) + (p.gpu_memory_mib or 0.0)
            processes[user] = processes.get(user, 0) + 1
        for user in {p.user or UNKNOWN_USER for p in procs} if len(procs) > 1 else (procs[0].user or UNKNOWN_USER,):
            gpus[user] = gpus.get(user, 0) + 1  # a GPU counts once for each account with a process on it
    top = max(memory.items(), key=lambda kv: (kv[1], kv[0])) if memory else None
    return HostLine(host.name, host.state, host.message, len(frees), host.gpus, tuple(frees), free,
                    util_sum / util_n if util_n else None, used, total,
                    top[0] if top else None, top[1] if top else None,
                    tuple((u, gpus[u], memory[u], processes[u]) for u in gpus))


class _FleetFigures(NamedTuple):
    """host_line's figures for every host of a FleetColumns round, by one rule: lists by host row."""

    frees: list[tuple[bool, ...]]
    free: list[int]
    util: list[float | None]
    used: list[float | None]
    total: list[float | None]
    held: list[tuple[tuple[str, int, float, int], ...]]
    top: list[tuple[str, float] | None]


def _columns_line(host: HostSnapshot, gpus: GpuColumns, rule: FreeRule) -> HostLine:
    """host_line from the round's arrays: the same line, figure for figure (tests/test_lab.py)."""
    fig = gpus.fleet.memo(("lab", rule), lambda: _fleet_figures(gpus.fleet, rule))
    row = gpus.row
    top = fig.top[row]
    return HostLine(host.name, host.state, host.message, len(gpus), gpus, fig.frees[row], fig.free[row], fig.util[row],
                    fig.used[row], fig.total[row], top[0] if top else None, top[1] if top else None, fig.held[row])


def _fleet_figures(fleet: FleetColumns, rule: FreeRule) -> _FleetFigures:
    """is_free and host_line's sums over a whole round at once (numpy). A sum runs GPU after GPU
    (cumsum) as host_line's does, so the floats are the same, not merely close."""
    import numpy as np

    util, used, total = fleet.util_pct, fleet.mem_used_mib, fleet.mem_total_mib
    known_util, known_used, known_total = ~np.isnan(util), ~np.isnan(used), ~np.isnan(total)
    free = (known_util | known_used) & (~known_util | (util <= rule.max_util_pct)) & (~known_used | (used <= rule.max_memory_mib))
    if not rule.allow_processes:
        free &= fleet.process_user < 0

    def sums(values: Any, known: Any) -> list[float | None]:
        if not fleet.gpus:
            return [None] * fleet.hosts
        return [s if n else None for s, n in zip(np.where(known, values, 0.0).cumsum(1)[:, -1].tolist(), known.sum(1).tolist())]

    util_sums = sums(util, known_util)
    counts = known_util.sum(1).tolist()
    held: list[dict[str, list[Any]]] = [{} for _ in range(fleet.hosts)]
    if fleet.users and fleet.gpus:
        user = fleet.process_user[:, :, None] == np.arange(len(fleet.users))  # (hosts, gpus, users)
        gpus = user.sum(1)
        memory = (user * np.nan_to_num(fleet.process_mem_mib)[:, :, None]).cumsum(1)[:, -1, :]
        first = user.argmax(1)
        rows, ks = np.nonzero(gpus)
        for row, k, n, mib, at in sorted(zip(rows.tolist(), ks.tolist(), gpus[rows, ks].tolist(), memory[rows, ks].tolist(),
                                              first[rows, ks].tolist()), key=lambda e: (e[0], e[4])):
            name = fleet.users[k] or UNKNOWN_USER
            entry = held[row].setdefault(name, [0, 0.0, 0])
            entry[0] += n
            entry[1] += mib
            entry[2] += n  # one process a GPU
    return _FleetFigures(
        frees=[tuple(r) for r in free.tolist()], free=free.sum(1).tolist(),
        util=[s / n if s is not None else None for s, n in zip(util_sums, counts)],
        used=sums(used, known_used), total=sums(total, known_total),
        held=[tuple((u, g, m, p) for u, (g, m, p) in h.items()) for h in held],
        top=[_top_of(h) for h in held])


def _top_of(held: dict[str, list[Any]]) -> tuple[str, float] | None:
    """The account with the most GPU memory (the greater name on a tie), as host_line says."""
    top = max(((m, u) for u, (_g, m, _p) in held.items()), default=None)
    return None if top is None else (top[1], top[0])


def _mem_pcts(fleet: FleetColumns) -> list[list[float | None]]:
    """GpuSample.mem_pct of every GPU of the round, by host row."""
    def make() -> list[list[float | None]]:
        import numpy as np

        used, total = fleet.mem_used_mib, fleet.mem_total_mib
        with np.errstate(divide="ignore", invalid="ignore"):
            pct = np.where(np.isnan(used) | np.isnan(total) | (total == 0), np.nan, 100.0 * used / total)
        return plain_rows(pct)

    return fleet.memo("mem_pct", make)


def _held(fleet: FleetColumns) -> list[list[bool]]:
    return fleet.memo("held", lambda: (fleet.process_user >= 0).tolist())


@dataclass(frozen=True)
class FleetTotals:
    """The fleet in one line: GPUs free, busy and on unreachable hosts."""

    hosts: int = 0
    gpus: int = 0
    free: int = 0
    busy: int = 0
    unreachable: int = 0  # GPUs of hosts that do not answer (as many as when last seen)
    hosts_with_free: int = 0
    hosts_unreachable: int = 0
    hosts_never_seen: int = 0  # unreachable since the start: their GPUs are not counted

    def line(self) -> str:
        """"37 of 2,048 GPUs free on 9 hosts; 1,611 busy; 400 unreachable"."""
        from gputui.model.units import plural

        text = (f"{self.free:,} of {plural(self.gpus, 'GPU', thousands=True)} free on "
                f"{plural(self.hosts_with_free, 'host', thousands=True)}; {self.busy:,} busy")
        if self.hosts_unreachable:
            text += f"; {self.unreachable:,} unreachable"
        if self.hosts_never_seen:
            text += f" ({plural(self.hosts_never_seen, 'host', thousands=True)} not reached yet)"
        return text


def totals(lines: Sequence[HostLine], never_seen: int = 0) -> FleetTotals:
    """The totals of these host lines (`never_seen`: how many of the unreachable ones never answered)."""
    reach = [ln for ln in lines if ln.reachable]
    down = [ln for ln in lines if not ln.reachable]
    return FleetTotals(
        hosts=len(lines), gpus=sum(ln.gpus for ln in lines), free=sum(ln.free for ln in reach),
        busy=sum(ln.busy for ln in reach), unreachable=sum(ln.gpus for ln in down),
        hosts_with_free=sum(1 for ln in reach if ln.free), hosts_unreachable=len(down), hosts_never_seen=never_seen,
    )


# -- sorting and filtering ---------------------------------------------------------------------


def name_order(name: str) -> tuple[tuple[int, int | str], ...]:
    """A host name's place in a list: numbers as numbers ("gpu-2" before "gpu-10"), any case."""
    return tuple((0, int(part)) if part.isdigit() else (1, part.lower()) for part in _DIGITS.split(name) if part)


def sort_lines(lines: Iterable[HostLine], key: str = "name", reverse: bool = False) -> list[HostLine]:
    """Hosts by name (A-Z, numbers as numbers), utilisation (busiest first), free GPUs (most
    first) or memory in use (most first); unreachable hosts last whatever the key, ties by name."""
    if key not in SORT_KEYS:
        raise ValueError(f"sort key {key!r}: expected one of {', '.join(SORT_KEYS)}")

    def measure(line: HostLine) -> float:
        value = {"util": line.util_pct, "free": float(line.free), "memory": line.mem_used_mib}.get(key)
        return -(value if value is not None else -1.0)

    ordered = sorted(lines, key=lambda ln: name_order(ln.name))
    if key != "name":
        ordered.sort(key=measure)
    if reverse:
        ordered.reverse()
    ordered.sort(key=lambda ln: not ln.reachable)  # stable: the order above within each part
    return ordered


@dataclass(frozen=True)
class LabFilter:
    """What `/` keeps: words of a host's name, `user:NAME` (a host where that account runs a
    process), `free` (a host with a free GPU), `down` (a host that does not answer); all must hold."""

    words: tuple[str, ...] = ()
    user: str | None = None
    free: bool = False
    down: bool = False

    @classmethod
    def parse(cls, text: str) -> "LabFilter":
        words: list[str] = []
        user = None
        free = down = False
        for token in text.split():
            low = token.lower()
            if low.startswith("user:") and len(token) > 5:
                user = token[5:]
            elif low == "free":
                free = True
            elif low in ("down", "unreachable"):
                down = True
            else:
                words.append(low)
        return cls(tuple(words), user, free, down)

    def __str__(self) -> str:
        parts = list(self.words) + ([f"user:{self.user}"] if self.user else []) + (["free"] if self.free else [])
        return " ".join(parts + (["down"] if self.down else []))

    def keeps(self, line: HostLine) -> bool:
        if self.free and not line.free:
            return False
        if self.down and line.reachable:
            return False
        if self.user is not None and self.user not in line.users:
            return False
        name = line.name.lower()
        return all(word in name for word in self.words)


def filter_lines(lines: Iterable[HostLine], wanted: LabFilter) -> list[HostLine]:
    return [ln for ln in lines if wanted.keeps(ln)]


# -- free GPUs for scripts -----------------------------------------------------------------------


@dataclass(frozen=True)
class FreeGpu:
    host: str
    kind: str  # local, ssh, sim, replay
    gpu: GpuSample

    @property
    def label(self) -> str:
        """"HOST:INDEX"."""
        return f"{self.host}:{self.gpu.index}"


def free_gpus(hosts: Iterable[HostSnapshot], rule: FreeRule, min_free_mib: float | None = None) -> list[FreeGpu]:
    """Every free GPU of these hosts, least used first (memory in use, utilisation, host, index);
    with `min_free_mib`, only those with at least that much memory free (known)."""
    found: list[FreeGpu] = []
    for host in hosts:
        if not host.state.worked:
            continue
        for gpu in host.gpus:
            if not is_free(gpu, rule):
                continue
            if min_free_mib is not None:
                if gpu.mem_total_mib is None or gpu.mem_used_mib is None or gpu.mem_total_mib - gpu.mem_used_mib < min_free_mib:
                    continue
            found.append(FreeGpu(host.name, host.kind, gpu))

    def load(f: FreeGpu) -> tuple[float, float, str, int]:
        g = f.gpu
        return (g.mem_used_mib if g.mem_used_mib is not None else float("inf"),
                g.util_pct if g.util_pct is not None else float("inf"), f.host, g.index)

    return sorted(found, key=load)


# -- who holds what ------------------------------------------------------------------------------


@dataclass(frozen=True)
class UserTotal:
    """One account across the fleet: GPUs it runs a process on now, their memory, GPU-hours today."""

    user: str
    gpus: int
    memory_mib: float
    gpu_hours: float
    hosts: int
    processes: int

    def to_dict(self) -> dict[str, object]:
        return {"user": self.user, "gpus": self.gpus, "memory_mib": round(self.memory_mib, 1),
                "gpu_hours_today": round(self.gpu_hours, 4), "hosts": self.hosts, "processes": self.processes}


def held_now(hosts: Iterable[HostSnapshot]) -> dict[str, tuple[int, float, int, int]]:
    """Per account: (GPUs held, GPU memory MiB, hosts, processes) in this round. A GPU counts
    once for each account with a process on it."""
    return held_by([host_line(h, FreeRule()) for h in hosts])


def held_by(lines: Iterable[HostLine]) -> dict[str, tuple[int, float, int, int]]:
    """held_now's figures from a round's host lines."""
    out: dict[str, tuple[int, float, int, int]] = {}
    for line in lines:
        for user, gpus, memory, processes in line.held:
            before = out.get(user)
            out[user] = (gpus, memory, 1, processes) if before is None else (
                before[0] + gpus, before[1] + memory, before[2] + 1, before[3] + processes)
    return out


@dataclass(frozen=True)
class LabFrame:
    """One round of the lab: every host's line (in the round's order), the totals, the accounts
    (most GPU memory first)."""

    time: float
    lines: tuple[HostLine, ...]
    totals: FleetTotals
    users: tuple[UserTotal, ...] = ()


def _day(when: float) -> tuple[int, int, int]:
    t = time.localtime(when)
    return (t.tm_year, t.tm_mon, t.tm_mday)


@dataclass
class Lab:
    """Rounds in, lab frames out. Remembers each host's GPU count (an unreachable host's GPUs
    still count) and credits each account GPU-hours between two polls of a host (at most
    MAX_CREDIT_S for one gap), from local midnight on. Fed from one thread."""

    rule: FreeRule = field(default_factory=FreeRule)
    clock: Callable[[], float] = time.time
    _known: dict[str, int] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _last_poll: dict[str, float] = field(default_factory=dict)
    _hours: dict[str, float] = field(default_factory=dict)
    _day: tuple[int, int, int] | None = None

    def update(self, hosts: Sequence[HostSnapshot], now: float | None = None) -> LabFrame:
        now = self.clock() if now is None else now
        day = _day(now)
        if day != self._day:
            self._day, self._hours = day, {}
        lines = []
        for host in hosts:
            line = host_line(host, self.rule, self._known.get(host.name, 0))
            if host.state.worked:
                self._known[host.name] = len(host.gpus)
                self._seen.add(host.name)
                self._credit(host, line, now)
            lines.append(line)
        never = sum(1 for h in hosts if not h.state.worked and h.name not in self._seen)
        held = held_by(lines)
        users = [UserTotal(u, g, m, self._hours.get(u, 0.0), n, p) for u, (g, m, n, p) in held.items()]
        users += [UserTotal(u, 0, 0.0, h, 0, 0) for u, h in self._hours.items() if u not in held]
        users.sort(key=lambda t: (-t.memory_mib, -t.gpus, -t.gpu_hours, t.user))
        return LabFrame(now, tuple(lines), totals(lines, never), tuple(users))

    def _credit(self, host: HostSnapshot, line: HostLine, now: float) -> None:
        """GPU-hours for the accounts holding this host's GPUs (its `line`) since its previous
        poll (a snapshot seen again, unchanged, adds nothing)."""
        taken = host.time
        before = self._last_poll.get(host.name)
        self._last_poll[host.name] = taken
        if before is None or taken <= before:
            return
        if _day(before) != _day(taken):
            before = max(before, time.mktime((*_day(taken), 0, 0, 0, 0, 0, -1)))
        span = min(taken - before, MAX_CREDIT_S) / 3600.0
        for user, gpus, _memory, _processes in line.held:
            self._hours[user] = self._hours.get(user, 0.0) + gpus * span
