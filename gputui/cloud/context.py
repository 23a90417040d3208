"""`CloudContext`: what every cloud operation works with (settings, provider, ledger, clock).

The lease, the fleet poll, the budget guard and the launch all take one; it imports none of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Sequence

from gputui.cloud.ledger import Ledger
from gputui.cloud.pricing import PriceSource
from gputui.cloud.provider import CloudProvider
from gputui.cloud.settings import CloudSettings
from gputui.cloud.waiting import wait_until
from gputui.model.cloud import CloudEvent, InstanceInfo


@dataclass
class CloudContext:
    """What every cloud operation works with. `prices` defaults to the provider itself."""

    settings: CloudSettings
    provider: CloudProvider
    ledger: Ledger
    cluster: str
    owner: str
    prices: PriceSource | None = None
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    wait_timeout_s: float = 600.0
    listener: Callable[[CloudEvent], None] | None = None  # sees every event as it is recorded (the UI, the CLI)

    def __post_init__(self) -> None:
        # Unless given one, the context keeps the cloud's time (a simulated cloud's may be driven
        # by hand): the ledger's times and the slaves' lease tags are then on one clock.
        if self.clock is time.time:
            self.clock = getattr(self.provider, "clock", time.time)

    @property
    def price_source(self) -> PriceSource:
        return self.prices if self.prices is not None else self.provider

    def wait(self, ids: Sequence[str], done: Callable[[InstanceInfo], bool], what: str) -> list[InstanceInfo]:
        """Poll `ids` with backoff until `done` holds for each one the cloud still knows."""
        return wait_until(lambda: self.provider.describe(ids), lambda infos: all(done(i) for i in infos),
                          what, self.wait_timeout_s, sleep=self.sleep)

    def record(self, events: Sequence[CloudEvent]) -> list[CloudEvent]:
        """Store events in the ledger and hand them to the listener."""
        self.ledger.add_events(events)
        if self.listener is not None:
            for event in events:
                self.listener(event)
        return list(events)

    def event(self, kind: str, message: str, instance_id: str | None = None) -> CloudEvent:
        return CloudEvent(self.clock(), kind, message, instance_id, self.cluster)
