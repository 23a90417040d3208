"""Reaching the slaves from the master: ask every run on them to checkpoint, over SSH."""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Sequence

from gputui.cloud.budget import Checkpointer
from gputui.errors import GputuiError
from gputui.model.cloud import InstanceRecord

# The slave's gputui is in the cluster bootstrap's venv (default remote_dir) or, on a slave
# set up by hand, importable by its python3: use the first that has it.
REMOTE_CHECKPOINT = (
    "for py in ~/.gputui-cluster/venv/bin/python python3; do "
    "if \"$py\" -c 'import gputui' 2>/dev/null; then exec \"$py\" -m gputui.cloud.watcher --checkpoint-all; fi; "
    "done; echo 'gputui is not installed on this slave' >&2; exit 3"
)


def ssh_command(ssh_user: str, address: str, ssh: str | None = None) -> list[str]:
    """The ssh invocation that SIGTERMs every watched run on one slave (`GPUTUI_SSH` picks the client)."""
    return [ssh or os.environ.get("GPUTUI_SSH", "ssh"), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
            "-o", "StrictHostKeyChecking=accept-new", f"{ssh_user}@{address}", REMOTE_CHECKPOINT]


def ssh_checkpointer(ssh_user: str, timeout_s: float = 20.0) -> Checkpointer:
    """A Checkpointer that reaches all slaves in parallel; raises once if any did not answer."""

    def one(record: InstanceRecord) -> str | None:
        if not record.address:
            return f"{record.instance_id}: no address"
        try:
            done = subprocess.run(ssh_command(ssh_user, record.address), capture_output=True, text=True,
                                  timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{record.instance_id}: {exc}"
        if done.returncode != 0:
            return f"{record.instance_id}: ssh exit {done.returncode}: {done.stderr.strip()[-200:]}"
        return None

    def checkpoint(records: Sequence[InstanceRecord]) -> None:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(records)))) as pool:
            problems = [p for p in pool.map(one, records) if p]
        if problems:
            raise GputuiError("; ".join(problems))

    return checkpoint
