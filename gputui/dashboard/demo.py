"""The demo's hosts: the seeded simulation, plus one host per spot slave (a simulated T4
each, "connecting" while the instance boots) and one dead host, so every state shows.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable, Sequence

from gputui.dashboard.cost import SlaveLine
from gputui.model.telemetry import HostSnapshot, HostState
from gputui.sources.sim import SimSource

T4_MEM_MIB, T4_POWER_W = 15360.0, 70.0
DEAD_HOST = "sim-dead"


class DemoSource:
    """SimSource hosts, the slaves as hosts, and a host that never answers."""

    def __init__(self, sim: SimSource, slaves: Callable[[], Sequence[SlaveLine]], seed: int = 0,
                 clock: Callable[[], float] = time.time) -> None:
        self.sim = sim
        self.slaves = slaves
        self.seed = seed
        self.clock = clock
        self._slave_sims: dict[str, SimSource] = {}

    def set_active(self, host: int, active: bool | None) -> None:
        self.sim.set_active(host, active)

    def poll(self) -> list[HostSnapshot]:
        now = self.clock()
        hosts = self.sim.poll()
        hosts.append(HostSnapshot(DEAD_HOST, HostState.UNREACHABLE, now, kind="sim", address="simulated",
                                  message="connection timed out after 5 s (a simulated dead host)"))
        for slave in self.slaves():
            if slave.state == "pending":
                hosts.append(HostSnapshot(slave.instance_id, HostState.CONNECTING, now, kind="sim",
                                          message="instance pending: booting"))
            elif slave.state == "running":
                hosts.append(self._slave_host(slave.instance_id))
        return hosts

    def _slave_host(self, instance_id: str) -> HostSnapshot:
        sim = self._slave_sims.get(instance_id)
        if sim is None:
            sim = self._slave_sims[instance_id] = SimSource(1, 1, seed=self.seed + len(self._slave_sims) + 1, clock=self.clock)
            sim.set_active(0, False)  # the slaves wait for work: nothing trains on them yet
        host = sim.poll()[0]
        scale = T4_MEM_MIB / (host.gpus[0].mem_total_mib or T4_MEM_MIB)
        gpus = tuple(replace(g, name="Tesla T4 (simulated)", mem_total_mib=T4_MEM_MIB,
                             mem_used_mib=None if g.mem_used_mib is None else round(g.mem_used_mib * scale),
                             power_limit_w=T4_POWER_W, power_w=None if g.power_w is None else round(g.power_w * 0.175, 1))
                     for g in host.gpus)
        return replace(host, name=instance_id, gpus=gpus, mem_total_mib=16384.0, mem_used_mib=2100.0)  # g4dn.xlarge: 16 GiB

    def kill(self, host_name: str, pid: int, signal_name: str) -> tuple[bool, str]:
        """Signal a simulated process (it leaves its GPU until that host's next run)."""
        if host_name == DEAD_HOST:
            return False, f"kill refused: {DEAD_HOST} is not connected (a simulated dead host)"
        sim = self._slave_sims.get(host_name)
        if sim is None:
            return self.sim.kill(host_name, pid, signal_name)
        ok, line = sim.kill("sim-0", pid, signal_name)
        return ok, line.replace("sim-0", host_name)

    def close(self) -> None:
        self._slave_sims.clear()
