"""Leak protection: nothing gputui launched keeps running unless the user chose so.

On start, gputui reports the instances its records say are running; before a command
that watches slaves exits with some still up, it asks (terminal) or says what is
still running and exits non-zero (headless).

Every hint printed here is a command that works as printed: it names the provider
(`--provider sim` for the simulated cloud), the profile or region, and the cluster at hand.
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, TextIO

from gputui.model import units
from gputui.cloud.ledger import Ledger
from gputui.model.errors import GputuiError
from gputui.model.cloud import InstanceRecord
from gputui.model.units import plural

if TYPE_CHECKING:  # lifecycle is imported only when something must be terminated
    from gputui.cloud.context import CloudContext


def describe(records: list[InstanceRecord]) -> str:
    rate = sum(r.hourly_price for r in records)
    ids = ", ".join(f"{r.instance_id} ({r.cluster}, {r.provider} {r.region})" for r in records[:8])
    more = f" and {len(records) - 8} more" if len(records) > 8 else ""
    return f"{plural(len(records), 'cloud instance')} running, {units.per_hour(rate, fixed=True)}: {ids}{more}"


def _default_profile() -> Path:
    from gputui.cloud.settings import default_cloud_profile

    return default_cloud_profile()


def _default_region() -> str | None:
    """The region `gputui cloud` uses without --profile (None when the default profile cannot be read)."""
    try:
        from gputui.cloud.settings import load_cloud_settings

        return load_cloud_settings(None).region
    except GputuiError:
        return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def cloud_command(action: str, provider: str, *, profile: Path | None = None, region: str | None = None,
                  cluster: str | None = None, extra: tuple[str, ...] = ()) -> str:
    """`gputui cloud ACTION ...` as it must be typed to reach these instances.

    The provider is named unless it is EC2 and nothing in the environment picks another;
    the profile is named unless it is the default one; without a profile, the region is
    named where it is not the default profile's.
    """
    words = ["gputui", "cloud", action, *extra]
    if provider != "ec2" or os.environ.get("GPUTUI_CLOUD", "ec2") not in ("", "ec2"):
        words += ["--provider", provider]
    if profile is not None and not _same_file(profile, _default_profile()):
        words += ["--profile", str(profile)]
    elif region is not None and region != _default_region():
        words += ["--region", region]
    if cluster is not None:
        words += ["--cluster", cluster]
    return shlex.join(words)


def down_command(ctx: "CloudContext", cluster: str | None = None, yes: bool = True) -> str:
    """The command that terminates `cluster`'s running slaves (every cluster's with None) in ctx's region."""
    return cloud_command("down", ctx.provider.name, profile=ctx.settings.source, region=ctx.provider.region,
                         cluster=cluster, extra=("--all", *(("--yes",) if yes else ())))


def down_ids_command(ctx: "CloudContext", ids: list[str]) -> str:
    """The command that terminates these instances (by id) of ctx's provider and region."""
    return cloud_command("down", ctx.provider.name, profile=ctx.settings.source, region=ctx.provider.region,
                         extra=(*ids, "--yes"))


def ls_command(ctx: "CloudContext") -> str:
    """The command that lists every gputui instance of ctx's provider and region."""
    return cloud_command("ls", ctx.provider.name, profile=ctx.settings.source, region=ctx.provider.region)


def down_commands(records: list[InstanceRecord]) -> str:
    """One stop command per provider and region the records are in, joined by "; "."""
    groups = sorted({(r.provider, r.region) for r in records})
    return "; ".join(cloud_command("down", provider, region=region, extra=("--all", "--yes"))
                     for provider, region in groups)


def note_running(stream: TextIO | None = None) -> int:
    """Print one note if the records say instances are running; return how many. Never raises."""
    try:
        ledger = Ledger.existing()
        if ledger is None:
            return 0
        with ledger:
            records = ledger.instances(running=True)
    except GputuiError:
        return 0
    if records:
        ls = "; ".join(cloud_command("ls", p, region=r) for p, r in sorted({(x.provider, x.region) for x in records}))
        print(f"gputui: note: {describe(records)} according to the records; "
              f"see `{ls}`, stop them with `{down_commands(records)}`", file=stream or sys.stderr)
    return len(records)


def exit_check(ctx: "CloudContext", interactive: bool, ask: Callable[[str], bool], say: Callable[[str], None]) -> int:
    """Before exiting: with the cluster's slaves still up, ask to terminate them (terminal) or
    list them and return 1 (headless). Returns the exit code to use."""
    from gputui.cloud.lifecycle import terminate

    p = ctx.provider
    records = ctx.ledger.instances(p.name, p.region, cluster=ctx.cluster, running=True)
    if not records:
        return 0
    if interactive:
        if ask(f"{describe(records)}. Terminate them now? [y/N] "):
            terminate(ctx, p.describe([r.instance_id for r in records]), ended_by="user")
            say(f"terminated {plural(len(records), 'instance')}")
        else:
            say(f"left running by your choice: {describe(records)}; stop them later with `{down_command(ctx, ctx.cluster)}`")
        return 0
    say(f"still running: {describe(records)}; stop them with `{down_command(ctx, ctx.cluster)}`")
    return 1
