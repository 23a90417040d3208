"""The provider factory: the one place that picks a cloud (EC2 or the simulated one) by name.

It stands above both providers, so neither of them imports the other's module.
"""

from __future__ import annotations

import os

from gputui.cloud.provider import CloudProvider
from gputui.model.errors import UserError


def make_provider(kind: str | None, region: str) -> CloudProvider:
    """The provider named by `kind` or `GPUTUI_CLOUD` ('ec2', the default, or 'sim')."""
    kind = kind or os.environ.get("GPUTUI_CLOUD") or "ec2"
    if kind == "ec2":
        from gputui.cloud.ec2 import Ec2Provider

        return Ec2Provider(region)
    if kind == "sim":
        from gputui.cloud.sim import SimProvider
        from gputui.model.paths import data_home

        return SimProvider.from_env(region, data_home() / "cloud-sim.json")
    raise UserError(f"provider {kind!r}: expected 'ec2' or 'sim' (--provider or GPUTUI_CLOUD)")
