"""Local GPUs through NVML (nvidia-ml-py's `pynvml`, imported lazily).

NVML is initialised once and its device handles kept. Optional calls are probed on first
use: one a driver lacks (NOT_SUPPORTED, FUNCTION_NOT_FOUND, or a pynvml without it) is
remembered per device and never called again, so a poll costs only the calls that work.
No library, no driver and no GPU are normal states of the host, not exceptions.
"""

from __future__ import annotations

import socket
import time
from types import ModuleType
from typing import Any, Callable

from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.model.text import clean
from gputui.sources.host import LocalHost

MAX_COMMAND_CHARS = 200
_PROCESS_CALLS = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetComputeRunningProcesses",
)


class _Unsupported(Exception):
    """This call will never work on this device: stop asking."""


def _text(value: Any) -> str:
    """A string NVML gives (GPU name, driver version): decoded, without control characters."""
    return clean(value.decode(errors="replace") if isinstance(value, bytes) else str(value))


class NvmlSource:
    """The local host and its NVIDIA GPUs. `module` replaces `pynvml` (tests use a fake)."""

    def __init__(self, name: str | None = None, module: ModuleType | None = None, host: LocalHost | None = None) -> None:
        self.name = name or socket.gethostname() or "localhost"
        self._module = module
        self._host = host if host is not None else LocalHost()
        self._nv: Any = None
        self._handles: list[Any] = []
        self._state = HostState.CONNECTING
        self._message: str | None = None
        self._driver: str | None = None
        self._unsupported: set[tuple[int, str]] = set()
        self._process_call: dict[int, str | None] = {}  # device -> the process call that works
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
        gpus = tuple(self._read_gpu(i, h) for i, h in enumerate(self._handles)) if self._nv is not None else ()
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

    def _read_gpu(self, i: int, h: Any) -> GpuSample:
        nv = self._nv
        util = self._call(i, "util", lambda: nv.nvmlDeviceGetUtilizationRates(h))
        memory = self._call(i, "memory", lambda: nv.nvmlDeviceGetMemoryInfo(h))
        power = self._call(i, "power", lambda: nv.nvmlDeviceGetPowerUsage(h))
        limit = self._call(i, "power_limit", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h))
        rx = self._call(i, "pcie_rx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES))
        tx = self._call(i, "pcie_tx", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES))
        pstate = self._call(i, "pstate", lambda: nv.nvmlDeviceGetPerformanceState(h))

        def ecc(kind: int) -> Any:
            return nv.nvmlDeviceGetTotalEccErrors(h, kind, nv.NVML_VOLATILE_ECC)

        return GpuSample(
            index=i,
            name=_opt(self._call(i, "name", lambda: _text(nv.nvmlDeviceGetName(h)))),
            uuid=_opt(self._call(i, "uuid", lambda: _text(nv.nvmlDeviceGetUUID(h)))),
            util_pct=None if util is None else float(util.gpu),
            mem_util_pct=None if util is None else float(util.memory),
            mem_used_mib=None if memory is None else memory.used / 2**20,
            mem_total_mib=None if memory is None else memory.total / 2**20,
            temperature_c=_num(self._call(i, "temperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))),
            power_w=None if power is None else power / 1000.0,
            power_limit_w=None if limit is None else limit / 1000.0,
            fan_pct=_num(self._call(i, "fan", lambda: nv.nvmlDeviceGetFanSpeed(h))),
            clock_sm_mhz=_num(self._call(i, "clock_sm", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))),
            clock_mem_mhz=_num(self._call(i, "clock_mem", lambda: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM))),
            pcie_rx_kib_s=_num(rx),
            pcie_tx_kib_s=_num(tx),
            pstate=None if pstate is None or pstate == 32 else f"P{int(pstate)}",  # 32 = unknown
            ecc_corrected=_int(self._call(i, "ecc_corrected", lambda: ecc(nv.NVML_MEMORY_ERROR_TYPE_CORRECTED))),
            ecc_uncorrected=_int(self._call(i, "ecc_uncorrected", lambda: ecc(nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED))),
            processes=self._processes(i, h),
        )

    def _processes(self, i: int, h: Any) -> tuple[GpuProcess, ...]:
        """Compute processes, through the newest process call this driver has (probed once)."""
        if i not in self._process_call:
            self._process_call[i] = None
            for name in _PROCESS_CALLS:
                fn = getattr(self._nv, name, None)
                if fn is None:
                    continue
                found = self._call(i, name, lambda: fn(h))
                if found is not None:
                    self._process_call[i] = name
                    return tuple(self._process(p) for p in found)
            return ()
        chosen = self._process_call[i]
        if chosen is None:
            return ()
        found = self._call(i, chosen, lambda: getattr(self._nv, chosen)(h))
        return () if found is None else tuple(self._process(p) for p in found)

    def _process(self, info: Any) -> GpuProcess:
        memory = getattr(info, "usedGpuMemory", None)
        command: str | None
        user, command = _describe_pid(int(info.pid))
        if command is None:
            command = _opt(self._call(-1, "process_name", lambda: _text(self._nv.nvmlSystemGetProcessName(info.pid))))
        return GpuProcess(
            pid=int(info.pid),
            name=command,
            user=user,
            gpu_memory_mib=None if memory is None else memory / 2**20,
        )


def _describe_pid(pid: int) -> tuple[str | None, str | None]:
    """(user, command line) of a local process, None where it cannot be read."""
    try:
        import psutil

        proc = psutil.Process(pid)
        with proc.oneshot():
            user = proc.username()
            command = " ".join(proc.cmdline()) or proc.name()
        return clean(user), clean(command, MAX_COMMAND_CHARS) or None
    except Exception:  # noqa: BLE001 - gone, or another user's: n/a
        return None, None


def _opt(value: Any) -> str | None:
    return None if value in (None, "") else str(value)


def _num(value: Any) -> float | None:
    return None if value is None else float(value)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
