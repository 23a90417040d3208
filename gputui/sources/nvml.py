"""Local GPUs through NVML (nvidia-ml-py's `pynvml`, imported lazily).

NVML is initialised once and its device handles kept. Optional calls are probed on first
use: one a driver lacks (NOT_SUPPORTED, FUNCTION_NOT_FOUND, or a pynvml without it) is
remembered per device and never called again, so a poll costs only the calls that work.
No library, no driver and no GPU are normal states of the host, not exceptions.

What a poll costs (per-call latencies measured on an H100, shared/reference/h100): name,
UUID and power limit are read once; memory comes from the v2 call (used excludes the
driver's reserve, as nvidia-smi counts it), falling back to v1; PCIe rates come from the
cumulative byte counters (`nvmlDeviceGetFieldValues`, both directions in one 0.46 ms call)
as a rate between two polls, never from `nvmlDeviceGetPcieThroughput` (20.7 ms per
direction). Per-process SM % (`nvmlDeviceGetProcessUtilization`, 1.7 ms) is read only
while `process_sm` is on (a process table is shown) and only for GPUs running processes.
The total-energy counter (`nvmlDeviceGetTotalEnergyConsumption`, 3.0 ms) is read at most
every `energy_every_s` per GPU (the first poll, then every 30 s): the counter is cumulative,
so reading it seldom loses nothing, and the poll keeps to its 2 ms per GPU.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable

from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState, throttle_codes
from gputui.model.outside import number as _num  # the one helper for a number from outside
from gputui.model.text import clean
from gputui.sources.host import LocalHost

MAX_COMMAND_CHARS = 200
MIN_CPU_WINDOW_S = 0.5  # a process's CPU % is measured over at least this long
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)
_REASON_CALLS = ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons")
ENERGY_EVERY_S = 30.0  # the energy counter costs 3 ms a call on an H100: read at most this often per GPU
_NO_V2 = (3, 13, 25)  # NOT_SUPPORTED, FUNCTION_NOT_FOUND, ARGUMENT_VERSION_MISMATCH: this driver has v1 only


class _Unsupported(Exception):
    """This call will never work on this device: stop asking."""


def _text(value: Any) -> str:
    """A string NVML gives (GPU name, driver version): decoded, without control characters."""
    return clean(value.decode(errors="replace") if isinstance(value, bytes) else str(value))


class NvmlSource:
    """The local host and its NVIDIA GPUs. `module` replaces `pynvml` (tests use a fake)."""

    def __init__(self, name: str | None = None, module: ModuleType | None = None, host: LocalHost | None = None,
                 process_sm: bool = False, energy_every_s: float | None = ENERGY_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name or socket.gethostname() or "localhost"
        self.process_sm = process_sm  # read each process's SM % (1.7 ms per GPU running processes)
        self.energy_every_s = energy_every_s  # how often the energy counter is read (None: never)
        self._clock = clock
        self._energy_at: dict[int, float] = {}  # device -> when its energy counter was last read
        self._module = module
        self._host = host if host is not None else LocalHost()
        self._nv: Any = None
        self._handles: list[Any] = []
        self._state = HostState.CONNECTING
        self._message: str | None = None
        self._driver: str | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._process_call: dict[int, str | None] = {}  # device -> the process call that works
        self._statics: dict[int, _Static] = {}
        self._memory_v2: dict[int, bool] = {}  # device -> whether the v2 memory call works
        self._pcie_last: dict[int, tuple[float, int | None, int | None]] = {}  # device -> (s, tx, rx bytes)
        self._sm_seen: dict[int, int] = {}  # device -> timestamp of the newest process sample read
        self._host_procs = HostProcesses()
        self._started = False

    # -- life cycle -------------------------------------------------------------------------

    def _start(self) -> None:
        self._started = True
        try:
            nv = self._module if self._module is not None else __import__("pynvml")
        except ImportError:
            self._state, self._message = HostState.ERROR, "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            self._state, self._message = self._init_failure(nv, exc)
            return
        except OSError as exc:  # a broken libnvidia-ml.so
            self._state, self._message = HostState.NO_DRIVER, f"no NVIDIA driver ({exc})"
            return
        self._nv = nv
        try:
            self._driver = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            self._driver = None
        try:
            self._handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError as exc:
            self._state, self._message = HostState.ERROR, f"NVML cannot list the GPUs: {exc}"
            return
        self._state = HostState.OK
        self._message = None if self._handles else "no GPU"

    @staticmethod
    def _init_failure(nv: Any, exc: Exception) -> tuple[HostState, str]:
        code = getattr(exc, "value", None)
        if code == getattr(nv, "NVML_ERROR_LIBRARY_NOT_FOUND", 12):
            return HostState.NO_DRIVER, "no NVIDIA driver (libnvidia-ml.so not found)"
        if code == getattr(nv, "NVML_ERROR_DRIVER_NOT_LOADED", 9):
            return HostState.NO_DRIVER, "no NVIDIA driver (the kernel driver is not loaded)"
        if code == getattr(nv, "NVML_ERROR_NO_PERMISSION", 4):
            return HostState.ERROR, "NVML: no permission to open the GPUs"
        return HostState.ERROR, f"NVML failed to start: {exc}"

    def close(self) -> None:
        """Shut NVML down (once); later polls start it again."""
        if self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except self._nv.NVMLError:
                pass
        self._nv, self._handles, self._started = None, [], False
        self._statics, self._pcie_last, self._sm_seen, self._energy_at = {}, {}, {}, {}

    @property
    def driver_version(self) -> str | None:
        if not self._started:
            self._start()
        return self._driver

    def gpu_count(self) -> int | None:
        """GPUs NVML sees (None when NVML does not work here)."""
        if not self._started:
            self._start()
        return len(self._handles) if self._nv is not None else None

    @property
    def message(self) -> str | None:
        return self._message

    # -- polling ----------------------------------------------------------------------------

    def poll(self) -> list[HostSnapshot]:
        """One snapshot of this host: every GPU read in one pass."""
        start = time.time()
        t0 = time.perf_counter()
        if not self._started:
            self._start()
        self._host_procs.new_round()
        gpus = tuple(self._read_gpu(i, h) for i, h in enumerate(self._handles)) if self._nv is not None else ()
        self._host_procs.forget_except({p.pid for g in gpus for p in g.processes})
        cpu, used, total = self._host.sample()
        return [
            HostSnapshot(
                name=self.name,
                state=self._state,
                time=start,
                duration_s=time.perf_counter() - t0,
                kind="local",
                cpu_pct=cpu,
                mem_used_mib=used,
                mem_total_mib=total,
                gpus=gpus,
                message=self._message,
                driver=self._driver,
            )
        ]

    def _call(self, index: int, key: str, fn: Callable[[], Any]) -> Any:
        """fn() or None; a call the device will never support is not made again."""
        if (index, key) in self._unsupported:
            return None
        try:
            return fn()
        except _Unsupported:
            self._unsupported.add((index, key))
        except self._nv.NVMLError as exc:
            if getattr(exc, "value", None) in (self._nv.NVML_ERROR_NOT_SUPPORTED, self._nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported.add((index, key))
        except AttributeError:  # this pynvml lacks the function
            self._unsupported.add((index, key))
        except (OSError, ValueError, TypeError):
            pass
        return None

    def _static(self, i: int, h: Any) -> _Static:
        """Name, UUID and power limit: read on the first poll only."""
        found = self._statics.get(i)
        if found is None or found.incomplete:
            nv = self._nv
            limit = self._call(i, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
            found = _Static(
                name=_opt(self._call(i, "name", lambda: _text(nv.nvmlDeviceGetName(h)))),
                uuid=_opt(self._call(i, "uuid", lambda: _text(nv.nvmlDeviceGetUUID(h)))),
                power_limit_w=None if limit is None else limit / 1000.0,
            )
            found.incomplete = found.name is None and found.uuid is None  # a lost GPU: ask again later
            self._statics[i] = found
        return found

    def _memory(self, i: int, h: Any) -> Any:
        """Memory through the v2 call (used excludes what the driver reserves) where this driver
        and pynvml have it, else v1 (which counts the reserve as used). Probed once per device."""
        nv = self._nv
        if self._memory_v2.get(i, True):
            version = getattr(nv, "nvmlMemory_v2", None)
            try:
                if version is None:
                    raise _Unsupported()
                found = nv.nvmlDeviceGetMemoryInfo(h, version=version)
                self._memory_v2[i] = True
                return found
            except nv.NVMLError as exc:
                if getattr(exc, "value", None) not in _NO_V2:
                    return None  # a transient error: v2 is tried again next poll
                self._memory_v2[i] = False
            except (_Unsupported, TypeError, AttributeError):  # an old pynvml: no version argument
                self._memory_v2[i] = False
        return self._call(i, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))

    def _reasons(self, i: int, h: Any) -> tuple[str, ...] | None:
        """Active clocks-event (throttle) reasons, through the call this pynvml/driver has."""
        nv = self._nv
        for name in _REASON_CALLS:
            if (i, name) in self._unsupported:
                continue
            fn = getattr(nv, name, None)
            if fn is None:
                self._unsupported.add((i, name))
                continue
            mask = self._call(i, name, lambda: fn(h))
            if mask is None and (i, name) in self._unsupported:
                continue  # this one will never work: try the older name
            return None if mask is None else throttle_codes(int(mask))
        return None

    def _pcie(self, i: int, h: Any) -> tuple[float | None, float | None]:
        """(rx, tx) KiB/s from the cumulative PCIe byte counters (one call for both
        directions) as a rate since the previous poll; None on the first poll."""
        nv = self._nv
        ids = (getattr(nv, "NVML_FI_DEV_PCIE_COUNT_TX_BYTES", 197), getattr(nv, "NVML_FI_DEV_PCIE_COUNT_RX_BYTES", 198))
        values = self._call(i, "pcie_counters", lambda: nv.nvmlDeviceGetFieldValues(h, list(ids)))
        if values is None:
            return None, None
        counters: list[int | None] = []
        stamp = 0
        for value in values:
            ok = getattr(value, "nvmlReturn", 1) == 0
            counters.append(int(value.value.ullVal) if ok else None)
            stamp = max(stamp, int(getattr(value, "timestamp", 0) or 0)) if ok else stamp
        if all(c is None for c in counters):
            self._unsupported.add((i, "pcie_counters"))  # no counters on this GPU: stop asking
            return None, None
        now = stamp / 1e6 if stamp > 0 else time.monotonic()
        previous = self._pcie_last.get(i)
        self._pcie_last[i] = (now, counters[0], counters[1])
        if previous is None:
            return None, None
        elapsed = now - previous[0]
        tx = _rate(previous[1], counters[0], elapsed)
        rx = _rate(previous[2], counters[1], elapsed)
        return rx, tx

    def _energy(self, i: int, h: Any) -> float | None:
        """The energy counter in mJ, when it is due (at most once a poll and every
        `energy_every_s`); a GPU without one (NOT_SUPPORTED: before Volta) is not asked again."""
        if self.energy_every_s is None:
            return None
        now = self._clock()
        last = self._energy_at.get(i)
        if last is not None and now - last < self.energy_every_s:
            return None
        nv = self._nv
        found = self._call(i, "energy", lambda: nv.nvmlDeviceGetTotalEnergyConsumption(h))
        if found is None:
            return None  # unsupported (never asked again) or a passing error (asked next poll)
        self._energy_at[i] = now
        return float(found)

    def _read_gpu(self, i: int, h: Any) -> GpuSample:
        nv = self._nv
        static = self._static(i, h)
        util = self._call(i, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        memory = self._memory(i, h)
        power = self._call(i, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        rx, tx = self._pcie(i, h)
        pstate = self._call(i, "pstate", lambda: nv.nvmlDeviceGetPerformanceState(h))

        def ecc(kind: int) -> Any:
            return nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC)

        return GpuSample(
            index=i,
            name=static.name,
            uuid=static.uuid,
            util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_mib=None if memory is None else memory.used / 2**20,
            mem_total_mib=None if memory is None else memory.total / 2**20,
            temperature_c=_num(self._call(i, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            power_w=None if power is None else power / 1000.0,
            power_limit_w=static.power_limit_w,
            fan_pct=_num(self._call(i, "fan", lambda: nv.nvmlDeviceGetFanSpeed(h))),
            clock_sm_mhz=_num(self._call(i, "clock_sm", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            clock_mem_mhz=_num(self._call(i, "clock_mem", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            pcie_rx_kib_s=rx,
            pcie_tx_kib_s=tx,
            pstate=None if pstate is None or pstate == 32 else f"P{int(pstate)}",  # 32 = unknown
            ecc_corrected=_int(self._call(i, "ecc_corrected", lambda: ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED))),
            ecc_uncorrected=_int(self._call(i, "ecc_uncorrected", lambda: ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))),
            processes=self._processes(i, h),
            throttle=self._reasons(i, h),
            energy_mj=self._energy(i, h),
        )

    def _processes(self, i: int, h: Any) -> tuple[GpuProcess, ...]:
        """Compute processes, through the newest process call this driver has (probed once)."""
        found = self._running(i, h)
        if not found:
            return ()
        sm = self._sm(i, h) if self.process_sm else {}
        return tuple(self._process(p, sm) for p in found)

    def _running(self, i: int, h: Any) -> Any:
        if i not in self._process_call:
            self._process_call[i] = None
            for name in _PROCESS_CALLS:
                fn = getattr(self._nv, name, None)
                if fn is None:
                    continue
                found = self._call(i, name, lambda: fn(h))
                if found is not None:
                    self._process_call[i] = name
                    return found
            return None
        chosen = self._process_call[i]
        if chosen is None:
            return None
        return self._call(i, chosen, lambda: getattr(self._nv, chosen)(h))

    def _sm(self, i: int, h: Any) -> dict[int, float]:
        """pid -> SM % from the samples NVML took since the previous poll (1.7 ms a call on an
        H100: only made while `process_sm` is on and the GPU has compute processes)."""
        nv = self._nv
        since = self._sm_seen.get(i, 0)
        try:
            if (i, "process_util") in self._unsupported:
                return {}
            samples = nv.nvmlDeviceGetProcessUtilization(h, since)
        except nv.NVMLError as exc:
            if getattr(exc, "value", None) in (nv.NVML_ERROR_NOT_SUPPORTED, nv.NVML_ERROR_FUNCTION_NOT_FOUND):
                self._unsupported.add((i, "process_util"))
            return {}  # NOT_FOUND: no sample since `since` (nothing ran)
        except (AttributeError, OSError, ValueError, TypeError):
            self._unsupported.add((i, "process_util"))
            return {}
        out: dict[int, float] = {}
        latest = since
        for sample in samples:
            stamp = int(getattr(sample, "timeStamp", 0) or 0)
            latest = max(latest, stamp)
            out[int(sample.pid)] = max(out.get(int(sample.pid), 0.0), float(sample.smUtil))
        self._sm_seen[i] = latest
        return out

    def _process(self, info: Any, sm: dict[int, float]) -> GpuProcess:
        pid = int(info.pid)
        memory = getattr(info, "usedGpuMemory", None)
        seen = self._host_procs.read(pid)
        command = seen.command
        if command is None:
            command = _opt(self._call(-1, "process_name", lambda: _text(self._nv.nvmlSystemGetProcessName(info.pid))))
        return GpuProcess(
            pid=pid,
            name=command,
            user=seen.user,
            gpu_memory_mib=None if memory is None else memory / 2**20,
            sm_pct=sm.get(pid) if self.process_sm else None,
            cpu_pct=seen.cpu_pct,
            rss_mib=seen.rss_mib,
            running_s=seen.running_s,
            started=seen.started,
        )


@dataclass
class _Static:
    """What never changes while the driver is loaded: read once per GPU."""

    name: str | None
    uuid: str | None
    power_limit_w: float | None
    incomplete: bool = False


@dataclass(frozen=True)
class _Seen:
    user: str | None = None
    command: str | None = None
    cpu_pct: float | None = None
    rss_mib: float | None = None
    running_s: float | None = None
    started: float | None = None  # psutil's create_time


class HostProcesses:
    """User, command line, CPU %, RSS and age of local processes, through psutil.

    The user and command are read once per process (a pid reused by a new process is a new
    one), and a process on several GPUs is read once per poll; CPU % is the CPU time used
    since the previous reading at least MIN_CPU_WINDOW_S old over the wall time since then,
    or, until there is one, since it started (as `ps` gives it)."""

    def __init__(self) -> None:
        self._known: dict[int, _Known] = {}
        self._round: dict[int, _Seen] = {}

    def new_round(self) -> None:
        """A new poll: every process is read again."""
        self._round = {}

    def read(self, pid: int) -> _Seen:
        seen = self._round.get(pid)
        if seen is None:
            seen = self._round[pid] = self._read(pid)
        return seen

    def _read(self, pid: int) -> _Seen:
        try:
            import psutil

            known = self._known.get(pid)
            proc = known.proc if known is not None else psutil.Process(pid)
            with proc.oneshot():
                created = proc.create_time()
                if known is not None and known.created != created:  # the pid was reused
                    known, proc = None, psutil.Process(pid)
                    created = proc.create_time()
                times = proc.cpu_times()
                rss = proc.memory_info().rss / 2**20
                if known is None:
                    command = clean(" ".join(proc.cmdline()) or proc.name(), MAX_COMMAND_CHARS) or None
                    known = _Known(proc, created, clean(proc.username()), command, 0.0, created)
            cpu, now = times.user + times.system, time.time()
            wall = now - known.base_at
            cpu_pct = max(0.0, 100.0 * (cpu - known.base_cpu) / wall) if wall > 0 else None
            if wall >= MIN_CPU_WINDOW_S or pid not in self._known:  # else keep the older base
                known.base_cpu, known.base_at = cpu, now
            self._known[pid] = known
            return _Seen(known.user, known.command, cpu_pct, rss, max(0.0, now - created), created)
        except Exception:  # noqa: BLE001 - gone, or another user's: n/a
            self._known.pop(pid, None)
            return _Seen()

    def forget_except(self, pids: set[int]) -> None:
        """Drop what is kept of processes no longer on any GPU."""
        for pid in [p for p in self._known if p not in pids]:
            del self._known[pid]


@dataclass
class _Known:
    proc: Any  # psutil.Process, kept so that each poll reads only what changes
    created: float
    user: str | None
    command: str | None
    base_cpu: float  # CPU seconds at base_at (0 at the process's start)
    base_at: float


def _rate(before: int | None, after: int | None, elapsed: float) -> float | None:
    """KiB/s between two byte counter readings (None for a counter reset or no time)."""
    if before is None or after is None or elapsed <= 0 or after < before:
        return None
    return (after - before) / elapsed / 1024.0


def _opt(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
