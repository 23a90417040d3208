"""Leak protection: nothing gputui launched keeps running unless the user chose so.

On start, gputui reports the instances its records say are running; before a command
that watches slaves exits with some still up, it asks (terminal) or says what is
still running and exits non-zero (headless).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Callable, TextIO

from gputui.cloud.ledger import Ledger
from gputui.errors import GputuiError
from gputui.model.cloud import InstanceRecord

if TYPE_CHECKING:  # lifecycle is imported only when something must be terminated
    from gputui.cloud.lifecycle import CloudContext


def describe(records: list[InstanceRecord]) -> str:
    rate = sum(r.hourly_price for r in records)
    ids = ", ".join(f"{r.instance_id} ({r.cluster}, {r.provider} {r.region})" for r in records[:8])
    more = f" and {len(records) - 8} more" if len(records) > 8 else ""
    return f"{len(records)} cloud instance(s) running, ${rate:.2f}/h: {ids}{more}"


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
        print(f"gputui: note: {describe(records)} according to the records; "
              "see `gputui cloud ls`, stop them with `gputui cloud down --all`", file=stream or sys.stderr)
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
            say(f"terminated {len(records)} instance(s)")
        else:
            say(f"left running by your choice: {describe(records)}; stop them later with `gputui cloud down --all`")
        return 0
    say(f"still running: {describe(records)}; stop them with `gputui cloud down --all --yes`")
    return 1
