"""A simulated source for demos and tests: N hosts x M GPUs with seeded, plausible dynamics.

Each host alternates between training runs and idle spells (or follows `set_active`).
While a run is active, utilisation, memory and power rise; temperature follows power with
a lag; the fan follows temperature. The same seed gives the same sequence of readings.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Callable

from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState

GPU_NAME = "NVIDIA A100-SXM4-80GB (simulated)"
MEM_TOTAL_MIB = 81920.0
POWER_IDLE_W, POWER_LIMIT_W = 55.0, 400.0
AMBIENT_C = 30.0
THERMAL_SLOWDOWN_C = 72.0
_IDLE, _POWER_CAP, _THERMAL = ("idle",), ("power-cap",), ("sw-thermal",)
# The lab's accounts: host i's GPUs run the jobs of one or two of them (no random draw: the
# seeded readings stay what they were).
ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory")


def account(host: int, gpu: int, gpus: int) -> str:
    """Who runs the job on a simulated GPU: one account per host, two on every third host
    (its upper half of GPUs goes to the next account)."""
    second = host % 3 == 2 and gpu >= max(1, gpus // 2)
    return ACCOUNTS[(host * 7 + int(second)) % len(ACCOUNTS)]


@dataclass
class _Gpu:
    util: float = 0.0
    mem_used: float = 4.0
    power: float = POWER_IDLE_W
    temperature: float = AMBIENT_C + 6.0
    fixed: tuple[int, str] | None = None  # (pid, uuid): the uuid is made once per pid


@dataclass
class _Host:
    name: str
    gpus: list[_Gpu]
    active: bool = False
    steps_left: int = 0  # until the run (or the idle spell) ends
    forced: bool | None = None  # set_active() overrides the schedule
    mem_total: float = 515_000.0
    pids: list[int] = field(default_factory=list)
    users: list[str] = field(default_factory=list)  # the account of each GPU's job
    run_started: float = 0.0  # when the current run began (its processes' age)
    killed: set[int] = field(default_factory=set)  # pids signalled through kill(): gone until the next run


class SimSource:
    """Simulated hosts `sim-0` .. `sim-{N-1}`, each with M GPUs; one step per poll."""

    def __init__(self, hosts: int = 2, gpus: int = 4, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        if hosts < 1 or gpus < 0:
            raise ValueError("a simulation needs at least one host and no negative GPU count")
        self._rng = random.Random(seed)
        self._clock = clock
        self._hosts = [_Host(f"sim-{i}", [_Gpu() for _ in range(gpus)]) for i in range(hosts)]
        for host in self._hosts:
            host.active = self._rng.random() < 0.5
            host.steps_left = self._rng.randint(5, 40)
            host.pids = [self._rng.randint(2000, 60000) for _ in range(gpus)]
        for i, host in enumerate(self._hosts):
            host.users = [account(i, g, gpus) for g in range(gpus)]

    def set_active(self, host: int, active: bool | None) -> None:
        """Force a host's run on or off (None: back to the seeded schedule)."""
        self._hosts[host].forced = active

    def is_active(self, host: int) -> bool:
        h = self._hosts[host]
        return h.active if h.forced is None else h.forced

    def poll(self) -> list[HostSnapshot]:
        now = self._clock()
        return [self._step(i, h, now) for i, h in enumerate(self._hosts)]

    def kill(self, host_name: str, pid: int, signal_name: str) -> tuple[bool, str]:
        """Signal a simulated process: it leaves its GPU's process list until the next run."""
        for host in self._hosts:
            if host.name == host_name and pid in host.pids and pid not in host.killed:
                host.killed.add(pid)
                return True, f"SIG{signal_name} sent to pid {pid} on {host_name} (simulated)"
        return False, f"kill refused: pid {pid} is not running on {host_name}"

    def close(self) -> None:
        pass

    def _step(self, i: int, host: _Host, now: float) -> HostSnapshot:
        rng = self._rng
        host.steps_left -= 1
        was_active = self.is_active(i)
        if host.steps_left <= 0:
            host.active = not host.active
            host.steps_left = rng.randint(20, 60) if host.active else rng.randint(5, 20)
        active = self.is_active(i)
        if active and (not was_active or not host.run_started):
            host.run_started, host.killed = now, set()  # a new run: new processes
        samples = tuple(self._gpu_step(index, gpu, active and host.pids[index] not in host.killed, host.pids[index],
                                       now - host.run_started, host.users[index]) for index, gpu in enumerate(host.gpus))
        cpu = (35.0 + 20.0 * rng.random()) if active else (1.0 + 4.0 * rng.random())
        mem_used = (48_000.0 if active else 9_000.0) + 2_000.0 * rng.random()
        return HostSnapshot(
            name=host.name,
            state=HostState.OK,
            time=now,
            duration_s=0.002 + 0.003 * rng.random(),
            kind="sim",
            address="simulated",
            cpu_pct=round(cpu, 1),
            mem_used_mib=round(mem_used, 1),
            mem_total_mib=host.mem_total,
            gpus=samples,
            message=None if samples else "no GPU",
            driver="550.90.07 (simulated)",
        )

    def _gpu_step(self, index: int, gpu: _Gpu, active: bool, pid: int, running_s: float, user: str) -> GpuSample:
        # The same draws and arithmetic as ever (the seeded readings do not change), written for
        # a lab of 2,048 simulated GPUs a second: the rng's methods bound once, uniform(a, b)
        # as a + (b - a) * random() (what it is), the constant parts of a sample built once.
        rng = self._rng
        random = rng.random
        util = gpu.util
        util += (((90.0 + 9.0 * random()) if active else 2.0 * random()) - util) * 0.5
        mem_target = (60_000.0 + 8_000.0 * random()) if active else 4.0
        mem_used = gpu.mem_used = gpu.mem_used + (mem_target - gpu.mem_used) * 0.6
        power_target = POWER_IDLE_W + (POWER_LIMIT_W - POWER_IDLE_W) * (util / 100.0) ** 1.2
        power = gpu.power = min(POWER_LIMIT_W, power_target + rng.gauss(0.0, 4.0))
        temperature = gpu.temperature = gpu.temperature + (AMBIENT_C + 0.11 * power - gpu.temperature) * 0.15
        gpu.util = util
        busy = util > 5.0
        processes = (GpuProcess.quick(pid=pid, name="python -m gputui run", user=user, gpu_memory_mib=round(mem_used - 4.0),
                                      sm_pct=round(util), cpu_pct=round(90.0 + util / 10.0, 1), rss_mib=3100.0 + 16 * index,
                                      running_s=round(max(0.0, running_s), 1), started=None),) if active else ()
        if not busy:
            throttle: tuple[str, ...] = _IDLE
        elif power >= POWER_LIMIT_W * 0.97:
            throttle = _POWER_CAP  # the board's power limit holds the clocks
        elif temperature >= THERMAL_SLOWDOWN_C:
            throttle = _THERMAL
        else:
            throttle = ()
        if active:
            rx, tx = round(2e5 + (3e6 - 2e5) * random()), round(1e5 + (1e6 - 1e5) * random())
        else:
            rx, tx = round(500 * random()), round(500 * random())
        fixed = gpu.fixed
        if fixed is None or fixed[0] != pid:
            fixed = gpu.fixed = (pid, f"GPU-5151{index:04d}-0000-4000-8000-{pid:012d}")
        return GpuSample.quick(
            index=index, name=GPU_NAME, uuid=fixed[1], util_pct=round(util, 1), mem_util_pct=round(util * 0.55, 1),
            mem_used_mib=round(mem_used), mem_total_mib=MEM_TOTAL_MIB, temperature_c=round(temperature, 1),
            power_w=round(power, 1), power_limit_w=POWER_LIMIT_W,
            fan_pct=None,  # passively cooled, like the real one
            clock_sm_mhz=1410.0 if busy else 210.0, clock_mem_mhz=1593.0, pcie_rx_kib_s=rx, pcie_tx_kib_s=tx,
            pstate="P0" if busy else "P8", ecc_corrected=0, ecc_uncorrected=0, processes=processes, throttle=throttle, energy_mj=None,
        )
