"""A stand-in for nvidia-ml-py's `pynvml` module: the same functions, constants and error
type, over devices described in Python, with functions that can be missing (an old driver
or an old pynvml), calls that raise NOT_SUPPORTED, and a count of every call made."""

from __future__ import annotations

import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15

CONSTANTS = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
}


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeDevice:
    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util: tuple[int, int] = (87, 41)  # gpu, memory
    memory: tuple[int, int] = (60 * 2**30, 80 * 2**30)  # used, total bytes
    temperature: int = 65
    power_mw: int = 312_500
    limit_mw: int = 400_000
    fan: int = 40
    clocks: tuple[int, int] = (1410, 1593)  # sm, mem
    pcie: tuple[int, int] = (2048, 512)  # rx, tx KB/s
    pstate: int = 0
    ecc: tuple[int, int] = (3, 0)
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # pid, used bytes
    not_supported: set[str] = field(default_factory=set)  # function names that raise NOT_SUPPORTED
    lost: bool = False  # every call raises GPU_IS_LOST


def make_pynvml(
    devices: list[FakeDevice],
    missing: set[str] = frozenset(),  # type: ignore[assignment]
    unlinked: set[str] = frozenset(),  # type: ignore[assignment]
    init_error: int | None = None,
    driver: str = "550.90.07",
) -> types.ModuleType:
    """A fake `pynvml`. `missing`: functions the module lacks (AttributeError, an old
    pynvml); `unlinked`: functions present but absent from the driver (FUNCTION_NOT_FOUND)."""
    mod = types.ModuleType("pynvml")
    calls: Counter[str] = Counter()
    state = {"init": False}
    mod.calls = calls  # type: ignore[attr-defined]
    mod.state = state  # type: ignore[attr-defined]
    mod.NVMLError = NVMLError  # type: ignore[attr-defined]
    for name, value in list(globals().items()):
        if name.startswith("NVML_"):
            setattr(mod, name, value)
    for name, value in CONSTANTS.items():
        setattr(mod, name, value)

    def api(fn: Any) -> Any:
        name = fn.__name__
        if name in missing:
            return None

        def wrapper(*args: Any) -> Any:
            calls[name] += 1
            if name in unlinked:
                raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
            if name not in ("nvmlInit", "nvmlShutdown") and not state["init"]:
                raise NVMLError(1)  # UNINITIALIZED
            if args and isinstance(args[0], FakeDevice):
                if args[0].lost:
                    raise NVMLError(NVML_ERROR_GPU_IS_LOST)
                if name in args[0].not_supported:
                    raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return fn(*args)

        wrapper.__name__ = name
        setattr(mod, name, wrapper)
        return wrapper

    @api
    def nvmlInit() -> None:
        if init_error is not None:
            raise NVMLError(init_error)
        state["init"] = True

    @api
    def nvmlShutdown() -> None:
        state["init"] = False

    @api
    def nvmlSystemGetDriverVersion() -> bytes:
        return driver.encode()

    @api
    def nvmlDeviceGetCount() -> int:
        return len(devices)

    @api
    def nvmlDeviceGetHandleByIndex(i: int) -> FakeDevice:
        return devices[i]

    # getters that return one attribute of the device (some take a sensor or kind argument)
    for name, attr in {
        "nvmlDeviceGetName": "name",
        "nvmlDeviceGetUUID": "uuid",
        "nvmlDeviceGetTemperature": "temperature",
        "nvmlDeviceGetPowerUsage": "power_mw",
        "nvmlDeviceGetEnforcedPowerLimit": "limit_mw",
        "nvmlDeviceGetFanSpeed": "fan",
        "nvmlDeviceGetPerformanceState": "pstate",
    }.items():
        getter = lambda d, *_, attr=attr: getattr(d, attr)  # noqa: E731
        getter.__name__ = name
        api(getter)

    @api
    def nvmlDeviceGetUtilizationRates(d: FakeDevice) -> Any:
        return types.SimpleNamespace(gpu=d.util[0], memory=d.util[1])

    @api
    def nvmlDeviceGetMemoryInfo(d: FakeDevice) -> Any:
        return types.SimpleNamespace(used=d.memory[0], total=d.memory[1], free=d.memory[1] - d.memory[0])

    @api
    def nvmlDeviceGetClockInfo(d: FakeDevice, kind: int) -> int:
        return d.clocks[0] if kind == CONSTANTS["NVML_CLOCK_SM"] else d.clocks[1]

    @api
    def nvmlDeviceGetPcieThroughput(d: FakeDevice, counter: int) -> int:
        return d.pcie[0] if counter == CONSTANTS["NVML_PCIE_UTIL_RX_BYTES"] else d.pcie[1]

    @api
    def nvmlDeviceGetTotalEccErrors(d: FakeDevice, kind: int, counter: int) -> int:
        return d.ecc[0] if kind == CONSTANTS["NVML_MEMORY_ERROR_TYPE_CORRECTED"] else d.ecc[1]

    def processes(d: FakeDevice) -> list[Any]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in d.processes]

    for suffix in ("_v3", "_v2", ""):
        name = "nvmlDeviceGetComputeRunningProcesses" + suffix
        fn = lambda d: processes(d)  # noqa: E731
        fn.__name__ = name
        api(fn)

    @api
    def nvmlSystemGetProcessName(pid: int) -> bytes:
        return b"/usr/bin/fake-process"

    return mod
