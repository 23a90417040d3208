"""Loading the `[cloud]` profile table (declared in gputui.config.cloud) and checking it against
the profile's other tables.
"""

from __future__ import annotations

from pathlib import Path

from gputui.config.cloud import (  # noqa: F401 - re-exported: the table is declared in gputui.config.cloud
    CLOUD_SECTION, DEFAULT_IDLE_STOP_MINUTES, DEFAULT_REMOTE_DIR, DEFAULT_STALLED_MINUTES, CloudSettings)
from gputui.config.profile import load_profile
from gputui.config.schema import Source
from gputui.model.errors import UserError
from gputui.model.paths import profiles_dir


def default_cloud_profile() -> Path:
    return profiles_dir() / "aws-spot.toml"


def load_cloud_settings(path: Path | None) -> CloudSettings:
    """The `[cloud]` table of a profile (default: profiles/aws-spot.toml), checked against its `[cluster]`."""
    path = path if path is not None else default_cloud_profile()
    profile = load_profile(path)
    table = profile.tables.get("cloud")
    if table is None:
        raise UserError(f"{path}: no [cloud] table; see profiles/aws-spot.toml for one with every key explained")
    cluster = profile.tables.get("cluster", {})
    # the slaves' own idle stop and where their runs are: the same profile's [cluster] (or its defaults)
    shared = {name: cluster[name] for name in ("idle_stop_minutes", "remote_dir") if name in cluster}
    settings = CloudSettings(source=path, **shared, **table)
    stray = [z for z in settings.zones if not z.startswith(settings.region)]
    if stray:
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "zones", f"{stray[0]!r} is not a zone of region {settings.region!r}")
    if settings.renew_minutes >= settings.lease_minutes:
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "renew_minutes", "must be shorter than lease_minutes, or a lease could pass between renewals")
    stalled = settings.stalled_minutes
    join_s = cluster.get("join_timeout", 0.0)  # no [cluster]: no node waits at a rendezvous
    if stalled and stalled * 60 <= join_s:
        raise Source(path, path.read_text(encoding="utf-8")).error(
            "cloud", "stalled_minutes", f"must be longer than [cluster] join_timeout ({join_s:g} s), or a node "
            "waiting at the rendezvous counts as stalled; raise it, or set 0 to turn the stop off")
    return settings
