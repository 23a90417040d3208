"""The background budget guard that `gputui cloud up` leaves behind: one per cluster.

It is `gputui cloud guard --detached` in its own session, logging to `guards/` in the user
log directory; a file lock makes sure only one guards a cluster. It exits by itself once
the cluster has no running slaves. While it runs it also renews the slaves' lease
(gputui.cloud.lease): once it is gone (SIGKILL, a closed laptop), nothing renews it and
each slave powers itself off when its lease passes.
"""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from gputui.model import lockfile
from gputui.cloud.context import CloudContext
from gputui.model.paths import data_home, log_home, moved_once

_DETACHED: list["subprocess.Popen[bytes]"] = []


def _stem(ctx: CloudContext) -> Path:
    # earlier versions kept these in the data directory: moved from there on first use
    return moved_once(data_home() / "guards", log_home() / "guards") / f"{ctx.provider.name}-{ctx.provider.region}-{ctx.cluster}"


def log_path(ctx: CloudContext) -> Path:
    return _stem(ctx).with_suffix(".log")


@contextmanager
def exclusive(ctx: CloudContext) -> Iterator[bool]:
    """Hold the cluster's guard lock for the block; yields False if another process holds it."""
    with lockfile.exclusive(_stem(ctx).with_suffix(".lock")) as lock:
        yield lock.mine


def running(ctx: CloudContext) -> bool:
    with exclusive(ctx) as free:
        return not free


def spawn(ctx: CloudContext, interval_s: float) -> int | None:
    """Start a detached guard for the cluster unless one runs; its pid, or None."""
    if running(ctx):
        return None
    source = ctx.settings.source
    command = [sys.executable, "-m", "gputui", "cloud", "guard", "--detached", "--provider", ctx.provider.name,
               "--cluster", ctx.cluster, "--interval", repr(interval_s)]
    if source is not None:
        command += ["--profile", str(source.resolve())]
    log = log_path(ctx)
    with open(log, "a", encoding="utf-8") as out:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True, close_fds=True)
    _DETACHED.append(child)  # kept (not waited for) so a long-lived parent can still reap it
    return child.pid
