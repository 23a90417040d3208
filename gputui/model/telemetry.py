"""Telemetry snapshots: frozen per-GPU and per-host samples, and bounded metric histories.

Pure data and maths, no I/O. Any metric a driver or host does not provide is `None`
(shown as "n/a" by `fmt`), never an exception. Snapshots round-trip through JSON with
`to_dict()` / `from_dict()`; that JSON is what `gputui monitor --json` prints and what
`--record` writes.
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence, TypeVar, overload

SCHEMA_VERSION = 1  # of the JSON documents/lines written by `gputui monitor --json` and `--record`


class HostState(str, enum.Enum):
    """Where a host stands. Every state but `ok` comes with a one-line reason."""

    OK = "ok"
    CONNECTING = "connecting"
    UNREACHABLE = "unreachable"
    AUTH_FAILED = "auth-failed"
    HOST_KEY_UNKNOWN = "host-key-unknown"
    HOST_KEY_MISMATCH = "host-key-mismatch"
    NO_NVIDIA_SMI = "no-nvidia-smi"
    NO_DRIVER = "no-driver"  # NVML or nvidia-smi is there, but no NVIDIA driver answers: a normal state
    ERROR = "error"

    def __str__(self) -> str:
        return self.value

    @property
    def worked(self) -> bool:
        """True when the host answered (with or without GPUs)."""
        return self in (HostState.OK, HostState.NO_DRIVER)


# Why a GPU's clocks are held below their maximum: NVML's clocks-event (throttle) reason bits
# (nvmlClocksEventReason*, nvidia-smi's clocks_event_reasons.active) and their short codes.
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "idle"),  # nothing to do
    (0x2, "app-clocks"),  # held at the applications clocks setting
    (0x4, "power-cap"),  # software power capping
    (0x8, "hw-slowdown"),  # hardware slowdown (thermal or power brake, as the board decides)
    (0x10, "sync-boost"),  # held to the clocks of the other GPUs of its sync-boost group
    (0x20, "sw-thermal"),  # software thermal slowdown
    (0x40, "hw-thermal"),  # hardware thermal slowdown
    (0x80, "hw-power-brake"),  # an external power-brake signal
    (0x100, "display-clocks"),  # held at the display clocks setting
)
THROTTLE_CODES: tuple[str, ...] = tuple(code for _, code in THROTTLE_REASONS)
# The reasons that make a busy GPU slower than it could be (idle and the settings are not slowdowns).
SLOWDOWNS: frozenset[str] = frozenset({"power-cap", "hw-slowdown", "sync-boost", "sw-thermal", "hw-thermal", "hw-power-brake"})


def throttle_codes(mask: int) -> tuple[str, ...]:
    """The short codes of a clocks-event reason bit mask, in THROTTLE_REASONS order (unknown bits ignored)."""
    return tuple(code for bit, code in THROTTLE_REASONS if mask & bit)


def throttle_text(reasons: tuple[str, ...] | None) -> str:
    """Reasons for display: "n/a" when unknown, "-" when none, else the codes joined by ","."""
    if reasons is None:
        return "n/a"
    return ",".join(reasons) if reasons else "-"


_T = TypeVar("_T")


def adopt(cls: type[_T], values: dict[str, Any]) -> _T:
    """The instance of a frozen dataclass whose fields are `values`, without its generated
    __init__, which sets each field through object.__setattr__ (a simulated lab builds 2,048
    GpuSamples a second): the dict becomes the instance's own. Nothing is checked: the callers
    name every field, in their order (tests/test_lab.py compares with the dataclass's own)."""
    obj: Any = object.__new__(cls)
    object.__setattr__(obj, "__dict__", values)
    return obj


@dataclass(frozen=True)
class GpuProcess:
    """A compute process on a GPU. CPU % is over the last poll interval locally (since the
    process started on its first sighting) and since it started over SSH (as `ps` gives it)."""

    pid: int
    name: str | None = None  # the command line (or executable) where known
    user: str | None = None
    gpu_memory_mib: float | None = None
    sm_pct: float | None = None  # the process's share of the GPU's SM time (NVML only)
    cpu_pct: float | None = None  # of one core: 100 = one core busy
    rss_mib: float | None = None  # resident host memory
    running_s: float | None = None  # since the process started
    started: float | None = None  # when it started (epoch s, psutil's create_time; local only): a reused pid differs

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)  # its fields, in their order (a frozen dataclass's __dict__ holds nothing else)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GpuProcess":
        values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls)}
        return cls(**values)


# Numeric metrics of a GPU, in the order a table shows them; History tracks each.
GPU_METRICS: tuple[str, ...] = (
    "util_pct",
    "mem_util_pct",
    "mem_used_mib",
    "mem_total_mib",
    "temperature_c",
    "power_w",
    "power_limit_w",
    "fan_pct",
    "clock_sm_mhz",
    "clock_mem_mhz",
    "pcie_rx_kib_s",
    "pcie_tx_kib_s",
    "ecc_corrected",
    "ecc_uncorrected",
)


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment. Units: %, MiB, degrees C, W, MHz, KiB/s; None = not available."""

    index: int
    name: str | None = None
    uuid: str | None = None
    util_pct: float | None = None  # SM (kernel) utilisation
    mem_util_pct: float | None = None  # memory-bandwidth utilisation
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    temperature_c: float | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    fan_pct: float | None = None
    clock_sm_mhz: float | None = None
    clock_mem_mhz: float | None = None
    pcie_rx_kib_s: float | None = None
    pcie_tx_kib_s: float | None = None
    pstate: str | None = None  # "P0" (full speed) .. "P12" (idle)
    ecc_corrected: int | None = None  # volatile (since the driver loaded)
    ecc_uncorrected: int | None = None
    processes: tuple[GpuProcess, ...] = ()
    throttle: tuple[str, ...] | None = None  # active clocks-event reasons (THROTTLE_CODES); () none; None n/a
    # NVML's total-energy counter (mJ since the driver loaded; Volta+), on the polls that read it
    # (local GPUs, at most every nvml.ENERGY_EVERY_S); None on the others and where there is none
    energy_mj: float | None = None

    @property
    def throttled(self) -> bool:
        """True when a slowdown reason (power cap, thermal, hw slowdown, sync boost) holds the clocks."""
        return bool(self.throttle) and not SLOWDOWNS.isdisjoint(self.throttle or ())

    @property
    def mem_pct(self) -> float | None:
        """Memory used as a percentage of the total."""
        if self.mem_used_mib is None or not self.mem_total_mib:
            return None
        return 100.0 * self.mem_used_mib / self.mem_total_mib

    def to_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)  # its fields, in their order
        out["processes"] = [p.to_dict() for p in self.processes]
        out["throttle"] = None if self.throttle is None else list(self.throttle)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "GpuSample":
        values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls) if f.name not in ("processes", "throttle")}
        values["processes"] = tuple(GpuProcess.from_dict(p) for p in data.get("processes") or ())
        throttle = data.get("throttle")
        values["throttle"] = tuple(str(r) for r in throttle) if isinstance(throttle, (list, tuple)) else None
        return cls(**values)


class _Array:
    """One of a FleetColumns round's arrays, by its attribute's name (made on first read)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, fleet: Any, owner: type | None = None) -> Any:
        return fleet._array(self.name)


class FleetColumns:
    """One round of a uniform fleet (`hosts` x `gpus`) kept as arrays, GPU after GPU: what a
    simulated lab of 2,048 GPUs hands over each second. Its hosts' `gpus` are GpuColumns views;
    a GpuSample is built only when one is asked for (then the whole round's, once, by `build`).
    What the lab's figures need is here as (hosts, gpus) numpy arrays (made by `arrays` when
    first read), NaN where not known: `util_pct`, `mem_used_mib`, `mem_total_mib`;
    `process_user` (an index into `users`, -1: no compute process; at most one a GPU) and
    `process_mem_mib`. GPU g of a host has index g. These arrays and the samples `build` makes
    say the same thing (tests/test_lab.py compares them)."""

    def __init__(self, shape: tuple[int, int], build: Callable[[], list[GpuSample]],
                 arrays: Callable[[], Mapping[str, Any]], users: tuple[str | None, ...]) -> None:
        self.hosts, self.gpus = shape
        self._build = build
        self._make_arrays = arrays  # made when the lab first reads one (a JSON line reads none)
        self._samples: list[GpuSample] | None = None
        self._lock = threading.Lock()  # the poll's worker and the UI thread may both read a round
        self.users = users
        self._memo: dict[Any, Any] = {}

    def _array(self, name: str) -> Any:
        return self.memo("arrays", self._read_only_arrays)[name]

    def _read_only_arrays(self) -> dict[str, Any]:
        arrays = dict(self._make_arrays())
        for array in arrays.values():
            array.flags.writeable = False  # a snapshot: nobody changes it after the poll
        return arrays

    util_pct = _Array()
    mem_used_mib = _Array()
    mem_total_mib = _Array()
    process_user = _Array()
    process_mem_mib = _Array()

    def samples(self) -> list[GpuSample]:
        """Every GPU's sample, GPU after GPU (built the first time)."""
        if self._samples is None:
            with self._lock:
                if self._samples is None:
                    self._samples = self._build()
        return self._samples

    def memo(self, key: Any, make: Callable[[], _T]) -> _T:
        """A figure derived from this round, made once whoever asks (the lab's, for its rule)."""
        try:
            return self._memo[key]  # type: ignore[no-any-return]
        except KeyError:  # two threads may both make it: the same value, the last one kept
            value = self._memo[key] = make()
            return value

    def host(self, row: int) -> "GpuColumns":
        return GpuColumns(self, row)

    def listed(self, name: str) -> list[list[Any]]:
        """One of the arrays as a list per host of plain values (None where NaN), made once."""
        return self.memo(("listed", name), lambda: plain_rows(getattr(self, name)))


def plain_rows(array: Any) -> list[list[Any]]:
    """A (hosts, gpus) numpy array as a list per host of Python values, None where it holds NaN."""
    rows: list[list[Any]] = array.tolist()
    if array.dtype.kind == "f" and (array != array).any():
        rows = [[None if v != v else v for v in row] for row in rows]
    return rows


def utilisations(host: "HostSnapshot") -> dict[int, float | None]:
    """Each GPU's utilisation by its index (from the round's arrays when it has them)."""
    gpus = host.gpus
    if isinstance(gpus, GpuColumns):
        return dict(enumerate(gpus.fleet.listed("util_pct")[gpus.row]))
    return {g.index: g.util_pct for g in gpus}


class GpuColumns(Sequence[GpuSample]):
    """One host's GPUs in a FleetColumns round: a sequence of GpuSample like the tuple a real
    source gives (equal to it, GPU for GPU), whose samples are built only when read."""

    __slots__ = ("fleet", "row")

    def __init__(self, fleet: FleetColumns, row: int) -> None:
        self.fleet = fleet
        self.row = row

    def _tuple(self) -> tuple[GpuSample, ...]:
        start = self.row * self.fleet.gpus
        return tuple(self.fleet.samples()[start:start + self.fleet.gpus])

    def __len__(self) -> int:
        return self.fleet.gpus

    @overload
    def __getitem__(self, i: int) -> GpuSample: ...

    @overload
    def __getitem__(self, i: slice) -> tuple[GpuSample, ...]: ...

    def __getitem__(self, i: int | slice) -> GpuSample | tuple[GpuSample, ...]:
        return self._tuple()[i]

    def __iter__(self) -> Iterator[GpuSample]:
        return iter(self._tuple())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GpuColumns) and other.fleet is self.fleet and other.row == self.row:
            return True
        return isinstance(other, (tuple, GpuColumns)) and self._tuple() == tuple(other)

    def __hash__(self) -> int:
        return hash(self._tuple())

    def __repr__(self) -> str:
        return repr(self._tuple())


@dataclass(frozen=True)
class HostSnapshot:
    """One host at one moment: its state, its CPU and memory, and its GPUs."""

    name: str
    state: HostState
    time: float  # Unix seconds when the sample was taken (or the attempt made)
    duration_s: float | None = None  # how long taking the sample took
    kind: str = "local"  # local, ssh, sim, replay
    address: str | None = None  # user@host:port for remote hosts
    cpu_pct: float | None = None
    mem_used_mib: float | None = None
    mem_total_mib: float | None = None
    gpus: Sequence[GpuSample] = ()  # a tuple, or a GpuColumns view of a simulated fleet's round
    message: str | None = None  # one line: why the state is not ok, or a note ("no GPU")
    driver: str | None = None  # NVIDIA driver version where known

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "gpus"}
        out["state"] = self.state.value
        out["gpus"] = [g.to_dict() for g in self.gpus]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "HostSnapshot":
        values: dict[str, Any] = {f.name: data.get(f.name) for f in fields(cls) if f.name in data and f.name != "gpus"}
        values["state"] = HostState(data["state"])
        values["gpus"] = tuple(GpuSample.from_dict(g) for g in data.get("gpus") or ())
        return cls(**values)

    def with_state(self, state: HostState, message: str | None, time: float | None = None) -> "HostSnapshot":
        """This snapshot with another state and reason (and, optionally, time)."""
        return replace(self, state=state, message=message, time=self.time if time is None else time)


def round_to_dict(hosts: Iterable[HostSnapshot], time: float) -> dict[str, Any]:
    """One polling round as the JSON document of `gputui monitor --json`."""
    return {"version": SCHEMA_VERSION, "time": time, "hosts": [h.to_dict() for h in hosts]}


def round_from_dict(data: Mapping[str, Any]) -> list[HostSnapshot]:
    """The host snapshots of one round written by `round_to_dict`."""
    version = data.get("version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"telemetry schema version {version!r} (this gputui reads {SCHEMA_VERSION})")
    return [HostSnapshot.from_dict(h) for h in data["hosts"]]


def fmt(value: float | int | str | None, unit: str = "", digits: int = 0) -> str:
    """A metric for display: "n/a" for None, else the value rounded with its unit."""
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value:.{digits}f}{unit}"


def fmt_pair(used: float | None, total: float | None, unit: str = "", digits: int = 0) -> str:
    """"used/total unit", with "n/a" for a missing side."""
    if used is None and total is None:
        return "n/a"
    return f"{fmt(used, '', digits)}/{fmt(total, '', digits)}{unit}"


@dataclass
class History:
    """A bounded ring of (time, value) samples of one metric, for sparklines and rates."""

    maxlen: int = 300
    _samples: deque[tuple[float, float | None]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._samples = deque(maxlen=self.maxlen)

    def append(self, time: float, value: float | None) -> None:
        self._samples.append((time, value))

    def __len__(self) -> int:
        return len(self._samples)

    def __iter__(self) -> Iterator[tuple[float, float | None]]:
        return iter(self._samples)

    def values(self) -> list[float | None]:
        """The values, oldest first (None where the metric was not available)."""
        return [v for _, v in self._samples]

    @property
    def last(self) -> float | None:
        return self._samples[-1][1] if self._samples else None

    def _known(self, window: float | None) -> list[tuple[float, float]]:
        known = [(t, v) for t, v in self._samples if v is not None]
        if window is not None and known:
            start = known[-1][0] - window
            known = [(t, v) for t, v in known if t >= start]
        return known

    def mean(self, window: float | None = None) -> float | None:
        """Mean of the known values (over the last `window` seconds if given)."""
        known = self._known(window)
        return sum(v for _, v in known) / len(known) if known else None

    def peak(self, window: float | None = None) -> float | None:
        known = self._known(window)
        return max(v for _, v in known) if known else None

    def rate(self, window: float | None = None) -> float | None:
        """Change per second between the first and last known values (for counters)."""
        known = self._known(window)
        if len(known) < 2 or known[-1][0] <= known[0][0]:
            return None
        (t0, v0), (t1, v1) = known[0], known[-1]
        return (v1 - v0) / (t1 - t0)


HOST_METRICS: tuple[str, ...] = ("cpu_pct", "mem_used_mib", "duration_s")


class TelemetryHistory:
    """Histories of every metric of every host and GPU seen, fed one round at a time."""

    def __init__(self, maxlen: int = 300) -> None:
        self.maxlen = maxlen
        self._series: dict[tuple[str, int | None, str], History] = {}

    def update(self, hosts: Iterable[HostSnapshot]) -> None:
        """Add one round. A host that did not answer adds None, so gaps show."""
        for host in hosts:
            for metric in HOST_METRICS:
                self._get(host.name, None, metric).append(host.time, getattr(host, metric))
            for gpu in host.gpus:
                for metric in GPU_METRICS:
                    self._get(host.name, gpu.index, metric).append(host.time, getattr(gpu, metric))

    def _get(self, host: str, gpu: int | None, metric: str) -> History:
        key = (host, gpu, metric)
        series = self._series.get(key)
        if series is None:
            series = self._series[key] = History(self.maxlen)
        return series

    def gpu(self, host: str, index: int, metric: str) -> History:
        """The history of one GPU metric (empty if never seen)."""
        if metric not in GPU_METRICS:
            raise KeyError(metric)
        return self._series.get((host, index, metric)) or History(self.maxlen)

    def host(self, host: str, metric: str) -> History:
        """The history of one host metric (empty if never seen)."""
        if metric not in HOST_METRICS:
            raise KeyError(metric)
        return self._series.get((host, None, metric)) or History(self.maxlen)
