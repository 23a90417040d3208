"""Sweep slots on cloud slaves the sweep starts itself, from the profile's `[cloud]` table.

The fleet is the cluster code's (gputui.cluster.manager.SlaveManager: spot first, the `[cloud]`
budget guard, host keys learnt from the console), under a cluster named after the sweep
(`sweep-NAME`), so the ledger shows the sweep's own spend. While the sweep holds its slaves, the
lease renewer (gputui.cloud.lease) keeps their self-stop away; at the end they are released unless
`[sweep] keep_slaves`. Each slave is bootstrapped and given workers as an SSH host is
(gputui.sweep.remote), with gputui's spot watcher beside each worker: an interruption notice ends
the worker, and the scheduler gives its trial back.

Each slot costs its share of the slave's hourly rate (`usd_per_hour`), which the scheduler's
budget rule projects (no new trial once spend + fleet rate x a trial's time would pass
`[sweep] budget_usd`).
"""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

from gputui.model.errors import GputuiError, UserError
from gputui.sweep.hostcode import ProgramCode
from gputui.sweep.remote import RemoteHost, RemoteSlot, bootstrapper, cluster_defaults, host_slots, prepare_host


def fleet_name(sweep: str) -> str:
    """The cluster name the sweep's slaves carry (tags, ledger)."""
    return f"sweep-{sweep}"[:63]


def sweep_cluster(profile: Any, spec: Any) -> Any:
    """A ClusterSettings for the sweep's slaves: `[cloud] count` of them, none of them static."""
    from gputui.cloud.settings import CloudSettings
    from gputui.cluster.settings import CLUSTER_SECTION, ClusterSettings

    try:
        cloud = CloudSettings(source=profile.path, **profile.tables["cloud"])
    except (TypeError, ValueError) as exc:
        raise UserError(f"{profile.path or 'profile'}: [cloud]: {exc}") from None
    remote_dir, python = cluster_defaults(profile)
    count = cloud.count
    return ClusterSettings(
        name=fleet_name(spec.name), hosts=(), cloud_slaves=count, nodes=count, nproc_per_node=1, min_nodes=1,
        master_trains=False, master_addr=None, rdzv_port=0, rendezvous="tunnel", max_restarts=0,
        join_timeout=CLUSTER_SECTION.fields["join_timeout"].default, keep_slaves=spec.keep_slaves,
        idle_stop_minutes=cloud.idle_stop_minutes, remote_dir=remote_dir, python=python, socket_ifname=None,
        cloud=cloud, source=profile.path)


class CloudFleet:
    """The cloud slaves of one sweep: started by `start` (which returns their slots), released
    once every slot is closed (the scheduler closes them all at its end), or by `release`."""

    def __init__(self, profile: Any, spec: Any, manager: Any = None, ssh_wait_s: float | None = None,
                 imds_url: str | None = None, code: ProgramCode | None = None) -> None:
        """`manager`: a SlaveManager (tests give one on a simulated cloud); default: the profile's.
        `code`: a program sweep's, sent to each slave once it is bootstrapped (gputui.sweep.hostcode)."""
        self.profile, self.spec, self.code = profile, spec, code
        self.settings = manager.settings if manager is not None else sweep_cluster(profile, spec)
        self.manager = manager
        self.ssh_wait_s = ssh_wait_s
        self.imds_url = imds_url if imds_url is not None else os.environ.get("GPUTUI_IMDS_URL")
        self.started: list[str] = []  # instances this sweep launched (released at its end)
        self.hosts: list[RemoteHost] = []
        self.slots: list[RemoteSlot] = []
        self.lease: Any = None
        self.released: list[str] | None = None
        self._open: set[str] = set()
        self._lock = threading.Lock()

    @property
    def run_id(self) -> str:
        return fleet_name(self.spec.name)

    def start(self) -> list[RemoteSlot]:
        """Start (or reuse) the slaves, bootstrap them, and make their slots; on a failure, what
        was started is released before the error goes on."""
        from gputui.cluster.bringup import in_parallel
        from gputui.cluster.context import CLOUD_SSH_WAIT_S

        if self.manager is None:
            from gputui.cluster.manager import SlaveManager, cloud_context

            self.manager = SlaveManager(self.settings, cloud_context(self.settings))
        ctx = self.manager.ctx
        ctx.ledger.start_run(self.run_id, ctx.cluster, ctx.clock())  # slaves with a run are not idle
        try:
            from gputui.cloud.lease import LeaseRenewer

            self.lease = LeaseRenewer(ctx).start()
            slaves = self.manager.ensure(self.settings.cloud_slaves, minimum=1,
                                         started=lambda infos: self.started.extend(i.instance_id for i in infos))
            boot = bootstrapper(self.profile)
            wait = CLOUD_SSH_WAIT_S if self.ssh_wait_s is None else self.ssh_wait_s

            def one(slave: Any) -> RemoteHost:
                record = ctx.ledger.get(slave.instance_id)
                rate = record.hourly_price if record is not None else 0.0
                connect: Callable[[], Any] = lambda: self.manager.connect(slave, wait)  # noqa: E731
                return prepare_host(slave.instance_id, connect, boot, rate, self.code, self.spec.name)

            self.hosts = in_parallel(one, slaves, lambda h: h.close())
        except BaseException:
            self.release("failed")
            raise
        for host in self.hosts:
            for slot in host_slots(host, self.spec, self.spec.name):
                slot.spot_watcher, slot.imds_url, slot.on_close = True, self.imds_url, self._closed
                self.slots.append(slot)
                self._open.add(slot.name)
        return self.slots

    def _closed(self, slot: RemoteSlot) -> None:
        with self._lock:
            self._open.discard(slot.name)
            last = not self._open
        if last:
            self.release("done")

    def spent_usd(self) -> float:
        """What the sweep's slaves cost so far (the ledger's view)."""
        if self.manager is None:
            return 0.0
        ctx = self.manager.ctx
        now = ctx.clock()
        return sum(r.cost(now) for r in ctx.ledger.instances(cluster=ctx.cluster))

    def release(self, status: str = "done") -> list[str]:
        """Stop renewing the lease, terminate the slaves this sweep started (unless keep_slaves),
        close the run in the ledger. Safe to call twice; the ids terminated."""
        with self._lock:
            if self.released is not None:
                return self.released
            self.released = []
        errors: list[BaseException] = []
        for host in self.hosts:  # each step runs whatever the ones before raised: the slaves cost money
            try:
                host.close()
            except Exception as exc:  # noqa: BLE001 - raised below, after the slaves are released
                errors.append(exc)
        if self.lease is not None:
            try:
                self.lease.stop()
            except Exception as exc:  # noqa: BLE001
                errors.append(exc)
        if self.manager is not None:
            ctx = self.manager.ctx
            try:
                self.released = self.manager.release(self.started, keep=self.spec.keep_slaves)
            finally:
                ctx.ledger.end_run(self.run_id, ctx.clock(), status)
        if len(errors) == 1:
            raise errors[0]
        if errors:  # one line for them all: the scheduler reports a failed step once
            raise GputuiError("; ".join(str(e) or type(e).__name__ for e in errors))
        return self.released


def cloud_slots(profile: Any, spec: Any, code: ProgramCode | None = None) -> list[RemoteSlot]:
    """The slots of the sweep's cloud slaves ([] without a `[cloud]` table); `code`: a program sweep's."""
    if "cloud" not in profile.tables:
        return []
    try:
        return CloudFleet(profile, spec, code=code).start()
    except UserError:
        raise
    except GputuiError as exc:
        raise GputuiError(f"sweep {spec.name}: cloud slaves: {exc}") from None

