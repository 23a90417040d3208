"""The tags gputui puts on every cloud instance, and EC2's code for a slave that stopped itself.

The one home of these names: the provider tags what it launches (`TAG_MANAGED`, `TAG_CLUSTER`,
`TAG_OWNER`), the lease writes the watchdog's tags (gputui.cloud.lease), the user data hands
their names to the watchdog (gputui.cloud.userdata) and the simulated cloud reads them back.
"""

from __future__ import annotations

TAG_MANAGED = "gputui:managed"
TAG_CLUSTER = "gputui:cluster"
TAG_OWNER = "gputui:owner"

TAG_LEASE = "gputui:lease-until"
TAG_BUDGET = "gputui:budget-until"
TAG_MAX = "gputui:max-until"
TAG_IDLE = "gputui:idle-seconds"
TAG_STALLED = "gputui:stalled-seconds"
TAG_LAUNCHED = "gputui:launched-at"
SELF_STOP_CODE = "Client.InstanceInitiatedShutdown"  # EC2's state reason for a shutdown from inside
