"""The lease on every cloud slave, and how a slave that stopped itself is recognised.

Each slave carries tags its watchdog (gputui/cloud/watchdog.sh, installed by the user data)
reads from the instance metadata service:

- `gputui:lease-until`: the master renews it every `[cloud] renew_minutes` to now +
  `lease_minutes`, never later than `gputui:budget-until`, the moment the cluster's budget
  runs out at the current prices. A master that is gone (SIGKILL, a closed laptop, no
  network) stops renewing, and every slave powers itself off within lease + one watchdog
  check; with the budget's end as the cap, a dead master overspends by at most the checks'
  interval of the fleet's $/h.
- `gputui:max-until` (launch + `max_hours`) and `gputui:idle-seconds` ([cluster]
  idle_stop_minutes): the slave's own maximum life and idle stop.
- `gputui:stalled-seconds` (`stalled_minutes`): while a run is registered on the slave, no
  training heartbeat (gputui.cloud.heartbeat) for this long powers it off: a hung collective
  keeps the GPU busy and the master renewing, but no step comes.

The renewer runs where the master already runs something: the budget guard after `gputui
cloud up`, `gputui run` with a cluster, and the dashboard. A slave that powered itself off
ends with the state reason Client.InstanceInitiatedShutdown and says why on its console
(`gputui-watchdog: stopping: lease ...`); `ended_how` reads it back for the ledger.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Protocol, Sequence

from gputui.cloud.costs import cluster_spent
from gputui.cloud.tags import SELF_STOP_CODE, TAG_BUDGET, TAG_IDLE, TAG_LAUNCHED, TAG_LEASE, TAG_MAX, TAG_STALLED
from gputui.model.errors import GputuiError
from gputui.model.cloud import InstanceInfo

if TYPE_CHECKING:
    from gputui.cloud.context import CloudContext

REASONS = ("budget", "lease", "max_hours", "stalled", "idle")  # the watchdog's order of precedence
WHY = {"lease": "the master's lease passed", "budget": "the budget time came",
       "max_hours": "its max_hours passed", "stalled": "training made no progress for stalled_minutes",
       "idle": "idle (no gputui run, GPUs under 5%)"}
STOP_LINE = re.compile(r"gputui-watchdog: stopping: (lease|budget|idle|max_hours|stalled)\b[^\n]*?\bnow (\d+)")
STOP_LINE_ANY = re.compile(r"gputui-watchdog: stopping: (lease|budget|idle|max_hours|stalled)\b")


class Taggable(Protocol):
    """What renewing needs from a provider (both ec2 and sim have it)."""

    def set_tags(self, ids: Sequence[str], tags: Mapping[str, str]) -> None:
        """Create or overwrite these tags on every instance of `ids`."""


def budget_until(ctx: "CloudContext", now: float, extra_rate: float = 0.0) -> float | None:
    """When the cluster's budget runs out at the current prices: now + what is left divided by
    the fleet's $/h (its running slaves plus `extra_rate`, a launch). None with no rate."""
    p = ctx.provider
    rate = sum(r.hourly_price for r in ctx.ledger.instances(p.name, p.region, cluster=ctx.cluster, running=True))
    rate += extra_rate
    if rate <= 0:
        return None
    left = ctx.settings.budget_usd - cluster_spent(ctx.ledger, p.name, p.region, ctx.cluster, now)
    return now + max(0.0, left) / rate * 3600.0


def lease_tags(ctx: "CloudContext", now: float, extra_rate: float = 0.0) -> dict[str, str]:
    """The renewed lease: now + lease_minutes, capped by the budget's end (whole seconds, rounded down)."""
    lease = now + ctx.settings.lease_minutes * 60.0
    end = budget_until(ctx, now, extra_rate)
    tags = {TAG_LEASE: str(int(lease if end is None else min(lease, end)))}
    if end is not None:
        tags[TAG_BUDGET] = str(int(end))
    return tags


def launch_tags(ctx: "CloudContext", now: float, extra_rate: float) -> dict[str, str]:
    """The watchdog's tags at launch; `extra_rate` is the $/h the launch adds to the fleet."""
    s = ctx.settings
    tags = lease_tags(ctx, now, extra_rate)
    tags[TAG_LAUNCHED] = str(int(now))
    tags[TAG_IDLE] = str(int(s.idle_stop_minutes * 60))
    tags[TAG_STALLED] = str(int(s.stalled_minutes * 60))
    if s.max_hours:
        tags[TAG_MAX] = str(int(now + s.max_hours * 3600.0))
    return tags


def renew(ctx: "CloudContext") -> list[str]:
    """Renew the lease of every slave of the cluster the ledger says runs; the ids renewed.
    A slave that has ended meanwhile is left out (the cloud refuses tags on it)."""
    p = ctx.provider
    ids = [r.instance_id for r in ctx.ledger.instances(p.name, p.region, cluster=ctx.cluster, running=True)]
    if not ids:
        return []
    if not callable(getattr(p, "set_tags", None)):
        return []  # a provider that cannot tag (a test's stand-in) has no lease to renew
    tags = lease_tags(ctx, ctx.clock())
    provider: Taggable = p  # type: ignore[assignment]
    try:
        provider.set_tags(ids, tags)
    except GputuiError:
        ids = [i.instance_id for i in p.describe(ids) if i.live]
        if ids:
            provider.set_tags(ids, tags)
    return ids


class LeaseRenewer:
    """A thread renewing the cluster's leases every `[cloud] renew_minutes` until `stop()`.

    Failures (the network, expired credentials) are said once as a `lease_error` event, and
    renewing goes on: the lease has room for several missed renewals.
    """

    def __init__(self, ctx: "CloudContext", interval_s: float | None = None) -> None:
        self.ctx = ctx
        self.interval_s = interval_s if interval_s is not None else ctx.settings.renew_minutes * 60.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.failing = False
        self.renewals = 0  # rounds done, for tests and the dashboard

    def renew_once(self) -> list[str]:
        with self._lock:
            if self._stop.is_set():
                return []
            try:
                ids = renew(self.ctx)
            except Exception as exc:  # noqa: BLE001 - a thread's failure is said, never raised into a UI
                if not self.failing:
                    try:
                        self.ctx.record([self.ctx.event("lease_error", f"lease renewal failed: {exc or type(exc).__name__} "
                                                                 f"(still trying every {self.interval_s:g} s)")])
                    except Exception:  # noqa: BLE001 - the ledger itself may be what fails
                        pass
                self.failing = True
                return []
            self.failing = False
            self.renewals += 1
            return ids

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.renew_once()
            self._stop.wait(self.interval_s)

    def start(self) -> "LeaseRenewer":
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name=f"gputui-lease-{self.ctx.cluster}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (a renewal under way finishes first)."""
        self._stop.set()
        with self._lock:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

    def __enter__(self) -> "LeaseRenewer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@dataclass(frozen=True)
class Ending:
    """How an instance found ended came to end, for the ledger and the event."""

    kind: str  # the event: interrupted, self_stop, terminated
    ended_by: str  # the ledger's ended_by: interrupted, self:lease (budget, idle, max_hours, stalled), external
    why: str
    when: float  # when it ended, as far as is known (else the time it was noticed)


def parse_stop(console: str) -> tuple[str, float | None] | None:
    """The last watchdog stop on a console: (reason, time when it said so)."""
    found = STOP_LINE.findall(console or "")
    if found:
        return found[-1][0], float(found[-1][1])
    loose = STOP_LINE_ANY.findall(console or "")
    return (loose[-1], None) if loose else None


def _from_tags(tags: Mapping[str, str], now: float) -> tuple[str, float] | None:
    """The watchdog's reason inferred from the tags: the first limit (in its order) that had passed."""
    def number(tag: str) -> float | None:
        try:
            return float(tags[tag])
        except (KeyError, ValueError):
            return None

    for reason, tag in (("budget", TAG_BUDGET), ("lease", TAG_LEASE), ("max_hours", TAG_MAX)):
        when = number(tag)
        if when is not None and when <= now:
            return reason, when
    return None


def ended_how(provider: Any, info: InstanceInfo, now: float,
              console: Callable[[str], str] | None = None) -> Ending:
    """Why `info` (an ended instance) ended: a spot interruption, its own watchdog (the reason
    read from its console, else from its tags), or something outside gputui."""
    if info.interrupted:
        return Ending("interrupted", "interrupted", "spot interruption", now)
    if info.state_reason == SELF_STOP_CODE and (TAG_LEASE in info.tags or TAG_IDLE in info.tags):
        read = console or getattr(provider, "console_output", None)
        text = ""
        if read is not None:
            try:
                text = read(info.instance_id)
            except GputuiError:
                text = ""
        found = parse_stop(text)
        if found is None:
            inferred = _from_tags(info.tags, now)
            found = inferred if inferred is not None else ("idle", None) if TAG_IDLE in info.tags else None
        if found is not None:
            reason, when = found
            when = now if when is None else min(now, max(info.launched, when))
            return Ending("self_stop", f"self:{reason}", f"stopped itself: {WHY[reason]} (gputui-watchdog)", when)
    return Ending("terminated", "external", f"ended outside gputui ({info.state_reason or info.state})", now)
