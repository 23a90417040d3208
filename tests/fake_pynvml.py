"""A stand-in for nvidia-ml-py's `pynvml` module: the same functions, constants and error
type, over devices described in Python, with functions that can be missing (an old driver
or an old pynvml), calls that raise NOT_SUPPORTED, and a count of every call made.

With `latency=H100_LATENCY_S` each call takes as long as it took on a real H100 (the
table of shared/reference/h100/README.md), so a poll's wall time is what it would be there.
"""

from __future__ import annotations

import time
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Mapping

NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25

CONSTANTS = {
    "NVML_TEMPERATURE_GPU": 0,
    "NVML_CLOCK_SM": 1,
    "NVML_CLOCK_MEM": 2,
    "NVML_PCIE_UTIL_TX_BYTES": 0,
    "NVML_PCIE_UTIL_RX_BYTES": 1,
    "NVML_MEMORY_ERROR_TYPE_CORRECTED": 0,
    "NVML_MEMORY_ERROR_TYPE_UNCORRECTED": 1,
    "NVML_VOLATILE_ECC": 0,
    "NVML_FI_DEV_PCIE_COUNT_TX_BYTES": 197,
    "NVML_FI_DEV_PCIE_COUNT_RX_BYTES": 198,
    "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": 3,
    "nvmlMemory_v2": 0x02000028,
}

MS = 1e-3
# Seconds per call measured on a real H100 (driver 580.159.04): mean of 20 calls after a warm-up.
H100_MEASURED_S: dict[str, float] = {
    "nvmlDeviceGetUtilizationRates": 0.002 * MS,
    "nvmlDeviceGetPowerUsage": 0.002 * MS,
    "nvmlDeviceGetTemperature": 0.002 * MS,
    "nvmlDeviceGetCurrentClocksEventReasons": 0.002 * MS,
    "nvmlDeviceGetMemoryInfo": 0.009 * MS,
    "nvmlDeviceGetMemoryInfo_v2": 0.009 * MS,
    "nvmlDeviceGetComputeRunningProcesses": 0.039 * MS,
    "nvmlDeviceGetComputeRunningProcesses_v2": 0.039 * MS,
    "nvmlDeviceGetComputeRunningProcesses_v3": 0.039 * MS,
    "nvmlDeviceGetFieldValues": 0.455 * MS,  # PCIe TX and RX byte counters in one call
    "nvmlDeviceGetProcessUtilization": 1.674 * MS,
    "nvmlDeviceGetTotalEnergyConsumption": 3.037 * MS,
    "nvmlDeviceGetPcieThroughput": 20.713 * MS,  # one direction
}
# Every other device call costs 0.002-0.04 ms there (issue 14): the top of that range, to be safe.
UNMEASURED_DEVICE_CALL_S = 0.04 * MS
SETUP_CALLS = frozenset({"nvmlInit", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlDeviceGetCount", "nvmlDeviceGetHandleByIndex"})


class H100Latency(dict):  # type: ignore[type-arg]
    """Call name -> seconds: the measured H100 table, the unmeasured device calls at 0.04 ms."""

    def __missing__(self, name: str) -> float:
        return 0.0 if name in SETUP_CALLS else UNMEASURED_DEVICE_CALL_S


H100_LATENCY_S: Mapping[str, float] = H100Latency(H100_MEASURED_S)


def busy_wait(seconds: float) -> None:
    """Block for `seconds` precisely (time.sleep oversleeps tens of microseconds)."""
    end = time.perf_counter() + seconds
    if seconds > 2 * MS:
        time.sleep(seconds - 1 * MS)
    while time.perf_counter() < end:
        pass


class NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"NVML error {value}")
        self.value = value


@dataclass
class FakeDevice:
    name: str = "NVIDIA A100-SXM4-80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    util: tuple[int, int] = (87, 41)  # gpu, memory
    memory: tuple[int, int] = (60 * 2**30, 80 * 2**30)  # used (as the v2 call counts it), total bytes
    reserved: int = 0  # bytes the driver keeps: the v1 call counts them as used, v2 does not
    temperature: int = 65
    power_mw: int = 312_500
    limit_mw: int = 400_000
    fan: int = 40
    clocks: tuple[int, int] = (1410, 1593)  # sm, mem
    pcie: tuple[int, int] = (2048, 512)  # rx, tx KB/s, as nvmlDeviceGetPcieThroughput reads them
    pcie_bytes: tuple[int, int] = (10**9, 4 * 10**9)  # cumulative tx, rx byte counters
    clock_us: int = 1_000_000  # the timestamp the field-value counters carry (microseconds)
    energy_mj: int = 5_000_000_000  # the total-energy counter (mJ since the driver loaded)
    pstate: int = 0
    ecc: tuple[int, int] = (3, 0)
    reasons: int = 0  # clocks-event reason bit mask
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # pid, used bytes
    process_sm: dict[int, int] = field(default_factory=dict)  # pid -> SM % (no entry: no sample)
    not_supported: set[str] = field(default_factory=set)  # function names that raise NOT_SUPPORTED
    lost: bool = False  # every call raises GPU_IS_LOST

    def advance(self, seconds: float, tx_bytes_s: float = 0.0, rx_bytes_s: float = 0.0) -> None:
        """Time passes on the device: its PCIe byte counters grow at these rates, and its energy
        counter by its power draw (mW x s = mJ)."""
        tx, rx = self.pcie_bytes
        self.pcie_bytes = (tx + int(tx_bytes_s * seconds), rx + int(rx_bytes_s * seconds))
        self.clock_us += int(seconds * 1e6)
        self.energy_mj += int(self.power_mw * seconds)


def make_pynvml(
    devices: list[FakeDevice],
    missing: set[str] = frozenset(),  # type: ignore[assignment]
    unlinked: set[str] = frozenset(),  # type: ignore[assignment]
    init_error: int | None = None,
    driver: str = "550.90.07",
    latency: Mapping[str, float] | None = None,
) -> types.ModuleType:
    """A fake `pynvml`. `missing`: functions the module lacks (AttributeError, an old
    pynvml; "nvmlMemory_v2" also drops the v2 memory version constant); `unlinked`: functions
    present but absent from the driver (FUNCTION_NOT_FOUND; "nvmlDeviceGetMemoryInfo_v2" is
    the C function behind `nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`).
    `latency`: seconds each call takes, by name (e.g. H100_LATENCY_S)."""
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
        if name not in missing:
            setattr(mod, name, value)

    def enter(name: str, args: tuple[Any, ...]) -> None:
        """What every call does first: count, take its time, fail as the driver would."""
        calls[name] += 1
        if latency is not None:
            busy_wait(latency[name])
        if name in unlinked:
            raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
        if name not in ("nvmlInit", "nvmlShutdown") and not state["init"]:
            raise NVMLError(1)  # UNINITIALIZED
        if args and isinstance(args[0], FakeDevice):
            if args[0].lost:
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if name in args[0].not_supported:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    def api(fn: Any) -> Any:
        name = fn.__name__
        if name in missing:
            return None

        def wrapper(*args: Any) -> Any:
            enter(name, args)
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
        "nvmlDeviceGetCurrentClocksEventReasons": "reasons",
        "nvmlDeviceGetCurrentClocksThrottleReasons": "reasons",  # the name before driver R535
        "nvmlDeviceGetTotalEnergyConsumption": "energy_mj",  # Volta+; not_supported on older GPUs
    }.items():
        getter = lambda d, *_, attr=attr: getattr(d, attr)  # noqa: E731
        getter.__name__ = name
        api(getter)

    @api
    def nvmlDeviceGetUtilizationRates(d: FakeDevice) -> Any:
        return types.SimpleNamespace(gpu=d.util[0], memory=d.util[1])

    if "nvmlDeviceGetMemoryInfo" not in missing:
        has_version = "nvmlMemory_v2" not in missing  # an old pynvml has neither the constant nor the argument

        def nvmlDeviceGetMemoryInfo(d: FakeDevice, version: int | None = None) -> Any:
            used, total = d.memory
            if not version:
                enter("nvmlDeviceGetMemoryInfo", (d,))
                return types.SimpleNamespace(used=used + d.reserved, total=total, free=total - used - d.reserved)
            if not has_version:
                raise TypeError("nvmlDeviceGetMemoryInfo() takes 1 positional argument but 2 were given")
            enter("nvmlDeviceGetMemoryInfo_v2", (d,))
            return types.SimpleNamespace(version=version, used=used, reserved=d.reserved, total=total,
                                         free=total - used - d.reserved)

        mod.nvmlDeviceGetMemoryInfo = nvmlDeviceGetMemoryInfo  # type: ignore[attr-defined]

    @api
    def nvmlDeviceGetClockInfo(d: FakeDevice, kind: int) -> int:
        return d.clocks[0] if kind == CONSTANTS["NVML_CLOCK_SM"] else d.clocks[1]

    @api
    def nvmlDeviceGetPcieThroughput(d: FakeDevice, counter: int) -> int:
        return d.pcie[0] if counter == CONSTANTS["NVML_PCIE_UTIL_RX_BYTES"] else d.pcie[1]

    @api
    def nvmlDeviceGetFieldValues(d: FakeDevice, field_ids: list[int]) -> list[Any]:
        out = []
        for fid in field_ids:
            known = {CONSTANTS["NVML_FI_DEV_PCIE_COUNT_TX_BYTES"]: d.pcie_bytes[0],
                     CONSTANTS["NVML_FI_DEV_PCIE_COUNT_RX_BYTES"]: d.pcie_bytes[1]}
            value = known.get(fid)
            ret = NVML_ERROR_NOT_SUPPORTED if value is None or "pcie_counters" in d.not_supported else NVML_SUCCESS
            out.append(types.SimpleNamespace(fieldId=fid, scopeId=0, timestamp=d.clock_us, latencyUsec=0,
                                             valueType=CONSTANTS["NVML_VALUE_TYPE_UNSIGNED_LONG_LONG"], nvmlReturn=ret,
                                             value=types.SimpleNamespace(ullVal=value or 0)))
        return out

    @api
    def nvmlDeviceGetTotalEccErrors(d: FakeDevice, kind: int, counter: int) -> int:
        return d.ecc[0] if kind == CONSTANTS["NVML_MEMORY_ERROR_TYPE_CORRECTED"] else d.ecc[1]

    @api
    def nvmlDeviceGetProcessUtilization(d: FakeDevice, last_seen: int) -> list[Any]:
        samples = [types.SimpleNamespace(pid=pid, timeStamp=d.clock_us, smUtil=sm, memUtil=0, encUtil=0, decUtil=0)
                   for pid, sm in d.process_sm.items()]
        if not samples:
            raise NVMLError(NVML_ERROR_NOT_FOUND)  # what the driver says when it has no sample
        return samples

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


def h100_from_reference(xml_path: Any) -> FakeDevice:
    """The H100 of the recorded fixtures, from nvidia-smi's XML report taken during training:
    total, reserved and used memory (MiB) and the training process."""
    import xml.etree.ElementTree as ET

    card = ET.parse(xml_path).getroot().find("gpu")
    assert card is not None

    def mib(path: str) -> int:
        return int(float(str(card.findtext(path)).split()[0]) * 2**20)

    pid = int(str(card.findtext("processes/process_info/pid")))
    return FakeDevice(name=str(card.findtext("product_name")), uuid=str(card.findtext("uuid")),
                      memory=(mib("fb_memory_usage/used"), mib("fb_memory_usage/total")),
                      reserved=mib("fb_memory_usage/reserved"), util=(0, 0), temperature=35, power_mw=117_750,
                      limit_mw=700_000, clocks=(1980, 2619), not_supported={"nvmlDeviceGetFanSpeed"},
                      processes=[(pid, mib("processes/process_info/used_memory"))])
