"""A simulated source for demos and tests: N hosts x M GPUs with seeded, plausible dynamics.

Each host alternates between training runs and idle spells (or follows `set_active`).
While a run is active, utilisation, memory and power rise; temperature follows power with
a lag (the boards are passively cooled: no fan). The same seed gives the same sequence of
readings.

A lab's demo is 256 hosts x 8 GPUs polled every second, so a round is one step of numpy
arrays over the whole fleet (a fixed number of draws a round, whatever the hosts do), handed
over as those arrays (FleetColumns): the lab reads them as they are, and Python builds a
round's 2,048 samples only when something reads one (a JSON line, a host's screen).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from gputui.model.telemetry import FleetColumns, GpuProcess, GpuSample, HostSnapshot, HostState, adopt

GPU_NAME = "NVIDIA A100-SXM4-80GB (simulated)"
MEM_TOTAL_MIB = 81920.0
POWER_IDLE_W, POWER_LIMIT_W = 55.0, 400.0
AMBIENT_C = 30.0
THERMAL_SLOWDOWN_C = 72.0
DRIVER = "550.90.07 (simulated)"
PROCESS_NAME = "python -m gputui run"
# The throttle reasons by code: 0 none, 1 idle, 2 the board's power limit holds the clocks, 3 thermal.
_THROTTLE: tuple[tuple[str, ...], ...] = ((), ("idle",), ("power-cap",), ("sw-thermal",))
# The lab's accounts: host i's GPUs run the jobs of one or two of them (no random draw).
ACCOUNTS = ("alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy", "mallory")


def account(host: int, gpu: int, gpus: int) -> str:
    """Who runs the job on a simulated GPU: one account per host, two on every third host
    (its upper half of GPUs goes to the next account)."""
    second = host % 3 == 2 and gpu >= max(1, gpus // 2)
    return ACCOUNTS[(host * 7 + int(second)) % len(ACCOUNTS)]


class SimSource:
    """Simulated hosts `sim-0` .. `sim-{N-1}`, each with M GPUs; one step per poll."""

    def __init__(self, hosts: int = 2, gpus: int = 4, seed: int = 0, clock: Callable[[], float] = time.time) -> None:
        import numpy as np  # only a simulation needs it (the dashboard's demo, --sim, tests)

        if hosts < 1 or gpus < 0:
            raise ValueError("a simulation needs at least one host and no negative GPU count")
        self._np = np
        self._rng = np.random.default_rng(seed)
        self._clock = clock
        self._names = [f"sim-{i}" for i in range(hosts)]
        shape = (hosts, gpus)
        # Each host's schedule: running or idle, for how many more polls; set_active() overrides it.
        self._active = self._rng.random(hosts) < 0.5
        self._steps_left = self._rng.integers(5, 41, hosts)
        self._forced = np.full(hosts, -1, dtype=np.int8)  # set_active(): -1 the schedule, 0 off, 1 on
        self._run_started = np.zeros(hosts)  # when the current run began (its processes' age)
        self._pids = self._rng.integers(2000, 60001, shape)
        self._killed = np.zeros(shape, dtype=bool)  # signalled through kill(): gone until the host's next run
        # Each GPU's state, carried from round to round.
        self._util = np.zeros(shape)
        self._mem = np.full(shape, 4.0)
        self._temperature = np.full(shape, AMBIENT_C + 6.0)
        # What never changes, GPU after GPU over the fleet (the order of a round's samples).
        self._index_flat = [g for _ in range(hosts) for g in range(gpus)]
        self._pid_flat: list[int] = self._pids.ravel().tolist()
        self._user_flat = [account(i, g, gpus) for i in range(hosts) for g in range(gpus)]
        self._user_index = np.array([ACCOUNTS.index(u) for u in self._user_flat], dtype=int).reshape(shape)
        self._uuid_flat = [f"GPU-5151{g:04d}-0000-4000-8000-{pid:012d}" for g, pid in zip(self._index_flat, self._pid_flat)]

    def set_active(self, host: int, active: bool | None) -> None:
        """Force a host's run on or off (None: back to the seeded schedule)."""
        self._forced[host] = -1 if active is None else int(active)

    def is_active(self, host: int) -> bool:
        forced = int(self._forced[host])
        return bool(self._active[host]) if forced < 0 else forced == 1

    def kill(self, host_name: str, pid: int, signal_name: str) -> tuple[bool, str]:
        """Signal a simulated process: it leaves its GPU's process list until the host's next run."""
        if host_name in self._names:
            i = self._names.index(host_name)
            mine = self._pids[i] == pid
            if mine.any() and not self._killed[i][mine].all():
                self._killed[i][mine] = True
                return True, f"SIG{signal_name} sent to pid {pid} on {host_name} (simulated)"
        return False, f"kill refused: pid {pid} is not running on {host_name}"

    def close(self) -> None:
        pass

    def poll(self) -> list[HostSnapshot]:
        np = self._np
        now = self._clock()
        hosts, gpus = self._pids.shape
        forced = self._forced.copy()  # this round's, whatever set_active() does meanwhile
        was_active = np.where(forced < 0, self._active, forced == 1)
        # The schedules: a host whose spell ends starts the other kind (a run of 20-60 polls, idle 5-20).
        self._steps_left -= 1
        ends = self._steps_left <= 0
        self._active ^= ends
        spell = self._rng.random((hosts,))
        fresh = np.where(self._active, 20 + (41 * spell).astype(int), 5 + (16 * spell).astype(int))
        self._steps_left = np.where(ends, fresh, self._steps_left)
        active = np.where(forced < 0, self._active, forced == 1)
        new_run = active & (~was_active | (self._run_started == 0))
        self._run_started[new_run] = now
        self._killed[new_run] = False  # a new run: new processes
        running = active[:, None] & ~self._killed

        # One step of every GPU: utilisation and memory move towards the run's (or idleness's)
        # level, power follows utilisation with noise, temperature follows power with a lag.
        draws = self._rng.random((4, hosts, gpus))
        util = self._util = self._util + (np.where(running, 90.0 + 9.0 * draws[0], 2.0 * draws[0]) - self._util) * 0.5
        mem = self._mem = self._mem + (np.where(running, 60_000.0 + 8_000.0 * draws[1], 4.0) - self._mem) * 0.6
        power = np.minimum(POWER_LIMIT_W, POWER_IDLE_W + (POWER_LIMIT_W - POWER_IDLE_W) * (util / 100.0) ** 1.2
                           + 4.0 * self._rng.standard_normal((hosts, gpus)))
        temperature = self._temperature = self._temperature + (AMBIENT_C + 0.11 * power - self._temperature) * 0.15
        busy = util > 5.0
        throttle = np.where(~busy, 1, np.where(power >= POWER_LIMIT_W * 0.97, 2, np.where(temperature >= THERMAL_SLOWDOWN_C, 3, 0)))
        rx = np.rint(np.where(running, 2e5 + (3e6 - 2e5) * draws[2], 500.0 * draws[2])).astype(int)
        tx = np.rint(np.where(running, 1e5 + (1e6 - 1e5) * draws[3], 500.0 * draws[3])).astype(int)
        host_draws = self._rng.random((3, hosts))
        cpu = np.round(np.where(active, 35.0 + 20.0 * host_draws[0], 1.0 + 4.0 * host_draws[0]), 1)
        host_mem = np.round(np.where(active, 48_000.0, 9_000.0) + 2_000.0 * host_draws[1], 1)
        duration = 0.002 + 0.003 * host_draws[2]
        running_s = np.round(np.maximum(0.0, now - self._run_started), 1)

        # The round as arrays (what the lab reads: FleetColumns); its samples, GPU after GPU over
        # the fleet, are built only if something reads one (a JSON line, a host's screen).
        util_pct, mem_used = np.round(util, 1), np.rint(mem).astype(int)
        columns = (util_pct, np.round(util * 0.55, 1), mem_used, np.round(temperature, 1),
                   np.round(power, 1), busy, throttle, rx, tx, running, np.rint(mem - 4.0).astype(int),
                   np.rint(util).astype(int), np.round(90.0 + util / 10.0, 1), np.repeat(running_s, gpus))
        fleet = FleetColumns((hosts, gpus), lambda: self._samples(columns), lambda: {
            "util_pct": util_pct, "mem_used_mib": mem_used.astype(float), "mem_total_mib": np.full((hosts, gpus), MEM_TOTAL_MIB),
            "process_user": np.where(running, self._user_index, -1), "process_mem_mib": np.where(running, columns[10], 0).astype(float)},
            ACCOUNTS)
        return [adopt(HostSnapshot, {
            "name": name, "state": HostState.OK, "time": now, "duration_s": duration_s, "kind": "sim", "address": "simulated",
            "cpu_pct": cpu_pct, "mem_used_mib": ram_used, "mem_total_mib": 515_000.0, "gpus": fleet.host(i),
            "message": None if gpus else "no GPU", "driver": DRIVER})
                for i, (name, cpu_pct, ram_used, duration_s) in enumerate(zip(self._names, cpu.tolist(), host_mem.tolist(),
                                                                              duration.tolist()))]

    def _samples(self, columns: tuple[Any, ...]) -> list[GpuSample]:
        """A round's samples from its arrays: plain Python values, each sample's dict literal
        adopted as its fields (the dict a dataclass __init__ would build)."""
        samples = []
        for (index, uuid, pid, user, util_pct, mem_util, mem_used, temperature_c, power_w, busy_now, throttled, rx_kib, tx_kib,
             run, proc_mem, sm, proc_cpu, age) in zip(self._index_flat, self._uuid_flat, self._pid_flat, self._user_flat,
                                                      *(c.ravel().tolist() for c in columns)):
            samples.append(adopt(GpuSample, {
                "index": index, "name": GPU_NAME, "uuid": uuid, "util_pct": util_pct, "mem_util_pct": mem_util,
                "mem_used_mib": mem_used, "mem_total_mib": MEM_TOTAL_MIB, "temperature_c": temperature_c, "power_w": power_w,
                "power_limit_w": POWER_LIMIT_W, "fan_pct": None,  # passively cooled, like the real one
                "clock_sm_mhz": 1410.0 if busy_now else 210.0, "clock_mem_mhz": 1593.0, "pcie_rx_kib_s": rx_kib,
                "pcie_tx_kib_s": tx_kib, "pstate": "P0" if busy_now else "P8", "ecc_corrected": 0, "ecc_uncorrected": 0,
                "processes": (adopt(GpuProcess, {
                    "pid": pid, "name": PROCESS_NAME, "user": user, "gpu_memory_mib": proc_mem, "sm_pct": sm, "cpu_pct": proc_cpu,
                    "rss_mib": 3100.0 + 16 * index, "running_s": age, "started": None}),) if run else (),
                "throttle": _THROTTLE[throttled], "energy_mj": None}))
        return samples
