"""The paper's master: cloud slaves on and off as needed.

- `ensure(n)`: a run needs n cloud slaves; those of the cluster still up (kept by an
  earlier run) are reused, the missing ones started (spot, through the provider Protocol),
  unless the budget guard says the cluster's budget is spent or committed;
- `replace(id)`: a slave was interrupted or died mid-run: record it, start another;
- `release(ids)`: at the end of a run, terminate the slaves it started unless keep_slaves;
- `idle_stop(util)`: slaves with no run and GPU utilisation under 5% for
  idle_stop_minutes are terminated and recorded (ended_by "idle").

Time is injectable (the CloudContext's clock), so tests drive it by hand.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from gputui.model import units
from gputui.cloud.budget import BudgetGuard
from gputui.cloud.leaks import ls_command
from gputui.cloud.lifecycle import UpResult, launch, plan_launch, terminate, wait_running
from gputui.cloud.context import CloudContext
from gputui.cluster.settings import ClusterSettings
from gputui.cluster.store import ClusterStore
from gputui.model.errors import GputuiError
from gputui.config.hosts import HostSpec
from gputui.model.cloud import ENDED_STATES, InstanceInfo
from gputui.model.units import plural

if TYPE_CHECKING:
    from gputui.cluster.sshnode import SlaveConnection

IDLE_UTIL_PCT = 5.0
# utilisation of a slave's GPUs in percent (the busiest), None when unknown
Utilisation = Callable[[InstanceInfo], "float | None"]
# told about the instances of each launch the moment it returns (before the wait for them to run)
Started = Callable[[Sequence[InstanceInfo]], None]
# a sleep for the waits of a bring-up: a stop-aware one raises to end the wait (sleep(0) checks only)
Sleep = Callable[[float], None]


@dataclass(frozen=True)
class CloudSlave:
    """A running cloud slave and how to reach it."""

    instance_id: str
    spec: HostSpec
    started_here: bool  # launched for this run (else: kept from an earlier one)


def default_host_spec(settings: ClusterSettings) -> Callable[[InstanceInfo], HostSpec]:
    """SSH to a cloud slave: its public address, [cloud] ssh_user, the private half of public_key."""
    cloud = settings.cloud
    assert cloud is not None

    def spec(info: InstanceInfo) -> HostSpec:
        public = cloud.public_key_path()
        private = public.with_suffix("") if public.suffix == ".pub" else None
        return HostSpec(name=info.instance_id, address=str(info.public_ip), user=cloud.ssh_user,
                        identity_file=private if private is not None and private.is_file() else None,
                        trust_on_first_use=cloud.trust_on_first_use, connect_timeout=10.0, command_timeout=60.0,
                        proxy_jump=cloud.proxy_jump)

    return spec


class SlaveManager:
    """Cloud slaves of one cluster, through a CloudContext (ec2 or sim)."""

    def __init__(self, settings: ClusterSettings, ctx: CloudContext, host_spec: Callable[[InstanceInfo], HostSpec] | None = None,
                 store: ClusterStore | None = None, resolver: Callable[[], str] | None = None) -> None:
        self.settings = settings
        self.ctx = ctx
        self.host_spec = host_spec or default_host_spec(settings)
        self.store = store or ClusterStore(ctx.ledger.path)
        self.resolver = resolver
        self.guard = BudgetGuard(ctx, interval_s=60.0)

    def connect(self, slave: CloudSlave, wait_s: float, sleep: Sleep | None = None) -> "SlaveConnection":
        """SSH to a cloud slave, its host key first learnt from its console output and pinned
        (unless [cloud] trust_on_first_use): a key the network substitutes is refused.
        `sleep` paces the waits (a stop-aware one ends them)."""
        from gputui.cluster.sshnode import SlaveConnection

        if not slave.spec.trust_on_first_use:
            self.pin_host_key(slave, wait_s, sleep)
        if sleep is None:
            return SlaveConnection(slave.spec).open_or_raise(wait_s)
        return SlaveConnection(slave.spec).open_or_raise(wait_s, sleep=sleep)

    def pin_host_key(self, slave: CloudSlave, wait_s: float, sleep: Sleep | None = None) -> list[str]:
        """Wait (up to `wait_s`, on the context's clock) for the host keys on the slave's console;
        make them the only ones gputui knows for its address. The keys pinned."""
        from gputui.sources.hostkeys import SshOptions, known_name, pin_host_keys

        deadline = self.ctx.clock() + wait_s
        delay = 2.0
        while True:
            keys = self.ctx.provider.console_host_keys(slave.instance_id)
            if keys:
                break
            left = deadline - self.ctx.clock()
            if left <= 0:
                raise GputuiError(f"cloud slave {slave.instance_id}: no SSH host key in its console output after "
                                  f"{wait_s:g} s (cloud-init prints them at boot); use an image with cloud-init, or set "
                                  f"[cloud] trust_on_first_use = true in {self.settings.source} to accept the first key")
            (sleep or self.ctx.sleep)(min(delay, left))
            delay = min(delay * 1.5, 15.0)
        spec = slave.spec
        pin_host_keys(SshOptions().gputui_known_hosts_path(), known_name(spec.address, spec.port or 22), keys)
        return keys

    def _record(self, kind: str, message: str, instance_id: str | None = None) -> None:
        self.ctx.record([self.ctx.event(kind, message, instance_id)])

    def up(self) -> list[InstanceInfo]:
        """The cluster's slaves that run now (the ledger's open records, checked with the cloud)."""
        p = self.ctx.provider
        ids = [r.instance_id for r in self.ctx.ledger.instances(p.name, p.region, cluster=self.ctx.cluster, running=True)]
        return [i for i in p.describe(ids) if i.state == "running" and i.public_ip] if ids else []

    def ensure(self, count: int, minimum: int = 0, started: Started = lambda infos: None,
               sleep: Sleep | None = None) -> list[CloudSlave]:
        """`count` running slaves: reuse those up, start the rest (budget permitting).

        Fewer than `count` (but at least `minimum`) when the budget or the cloud's capacity
        stops the launches; a GputuiError below `minimum`. `started` hears of every instance
        launched as its launch returns, so a caller can release them whatever fails after.
        """
        have = self.up()[:count]
        slaves = [CloudSlave(i.instance_id, self.host_spec(i), False) for i in have]
        missing = count - len(slaves)
        if missing > 0:
            new = self._start(missing, started, sleep)
            slaves += [CloudSlave(i.instance_id, self.host_spec(i), True) for i in new]
        if len(slaves) < minimum:
            self.release([s.instance_id for s in slaves if s.started_here])
            raise GputuiError(f"cluster {self.ctx.cluster}: only {len(slaves)} of the {plural(minimum, 'cloud slave')} "
                              f"needed could be started; see `{ls_command(self.ctx)}` and the budget in {self.settings.source}")
        now = self.ctx.clock()
        for slave in slaves:
            self.store.mark_busy(slave.instance_id, self.ctx.cluster, now)
        return slaves

    def budget_allows(self, count: int) -> bool:
        """Whether starting `count` more slaves keeps the cluster under its budget (for one guard interval)."""
        status = self.guard.status()
        if status.level == "stop":
            return False
        plan_rate = 0.0
        try:
            plan = plan_launch(self.ctx, count, **({"resolver": self.resolver} if self.resolver else {}))
            plan_rate = plan.first_rate or 0.0
        except GputuiError:
            return True  # no price known: the launch itself will say so
        extra = count * plan_rate * max(self.guard.interval_s, 60.0) / 3600.0
        return status.spent_usd + status.committed_usd + extra < status.budget_usd

    def _start(self, count: int, started: Started = lambda infos: None, sleep: Sleep | None = None) -> list[InstanceInfo]:
        if not self.budget_allows(count):
            self._record("budget_refused", f"not starting {plural(count, 'slave')}: the budget of "
                         f"{units.money(self.ctx.settings.budget_usd, fixed=True)} is spent or committed")
            return []
        plan = plan_launch(self.ctx, count, **({"resolver": self.resolver} if self.resolver else {}))
        ctx = self.ctx if sleep is None else replace(self.ctx, sleep=sleep)
        launched = launch(ctx, plan, started=started, proceed=lambda: sleep(0) if sleep is not None else None)
        result: UpResult = wait_running(ctx, launched)
        running = [i for i in result.instances if i.state == "running" and i.public_ip]
        self._record("on_demand_start", f"started {len(running)} of {plural(count, 'missing slave')} for a run")
        return running

    def replace(self, instance_id: str, started: Started = lambda infos: None,
                sleep: Sleep | None = None) -> CloudSlave | None:
        """A slave was lost mid-run: close its record (interrupted or not) and start another."""
        found = self.ctx.provider.describe([instance_id])
        info = found[0] if found else None
        now = self.ctx.clock()
        if info is None or info.state in ENDED_STATES:
            ended_by = "interrupted" if info is not None and info.interrupted else "vanished"
            if self.ctx.ledger.record_end(instance_id, now, info.state if info else "terminated", ended_by):
                self._record("interrupted" if ended_by == "interrupted" else "terminated",
                             f"{instance_id} lost during a run ({ended_by})", instance_id)
        else:  # alive but unusable (its trainer died, SSH broke): do not pay for it any longer
            terminate(self.ctx, [info], ended_by="replaced")
        self.store.forget(instance_id)
        new = self._start(1, started, sleep)
        if not new:
            return None
        self.store.mark_busy(new[0].instance_id, self.ctx.cluster, now)
        return CloudSlave(new[0].instance_id, self.host_spec(new[0]), True)

    def release(self, ids: Sequence[str], keep: bool | None = None) -> list[str]:
        """At a run's end: terminate these slaves unless keep_slaves; returns the ids terminated."""
        now = self.ctx.clock()
        for instance_id in ids:
            self.store.mark_busy(instance_id, self.ctx.cluster, now)
        if (self.settings.keep_slaves if keep is None else keep) or not ids:
            return []
        infos = [i for i in self.ctx.provider.describe(list(ids)) if i.state not in ENDED_STATES]
        terminate(self.ctx, infos, ended_by="run-end")
        return [i.instance_id for i in infos]

    def idle_stop(self, utilisation: Utilisation, active_runs: int | None = None) -> list[str]:
        """Terminate the slaves idle for idle_stop_minutes; returns their ids.

        Busy means: a run of this cluster is going (the ledger's runs), or the slave's GPU
        utilisation is at least 5%. Unknown utilisation counts as idle only with no run.
        """
        minutes = self.settings.idle_stop_minutes
        if minutes <= 0:
            return []
        now = self.ctx.clock()
        if active_runs is None:
            active_runs = sum(1 for r in self.ctx.ledger.runs() if r[1] == self.ctx.cluster and r[3] is None)
        stop = []
        for info in self.up():
            util = utilisation(info)
            if active_runs or (util is not None and util >= IDLE_UTIL_PCT):
                self.store.mark_busy(info.instance_id, self.ctx.cluster, now)
                continue
            since = self.store.last_busy(info.instance_id)
            if since is None:  # first look at it: its idle clock starts now
                self.store.mark_busy(info.instance_id, self.ctx.cluster, now)
                continue
            if now - since >= minutes * 60.0:
                stop.append((info, now - since))
        if stop:
            terminate(self.ctx, [info for info, _ in stop], ended_by="idle")
            for info, idle_s in stop:
                self.store.forget(info.instance_id)
                self._record("idle_stop", f"{info.instance_id} idle for {units.duration(idle_s, 'words')} (no run, GPU under "
                             f"{IDLE_UTIL_PCT:g}%): terminated", info.instance_id)
        return [info.instance_id for info, _ in stop]


def cloud_context(settings: ClusterSettings, provider_kind: str | None = None, ledger_path: Path | None = None) -> CloudContext:
    """The CloudContext of a cluster's cloud slaves (provider from GPUTUI_CLOUD or ec2)."""
    from gputui.cloud.ledger import Ledger
    from gputui.cloud.provider import default_owner
    from gputui.cloud.factory import make_provider

    assert settings.cloud is not None
    provider = make_provider(provider_kind, settings.cloud.region)
    return CloudContext(settings.cloud, provider, Ledger(ledger_path), settings.name, default_owner())

