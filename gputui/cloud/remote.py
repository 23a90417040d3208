"""Reaching the slaves from the master: ask every run on them to checkpoint, over SSH.

The OpenSSH client is used the way the cluster manager's paramiko connections are: the
private half of `[cloud] public_key` as the only identity, and the host key checked
against ~/.ssh/known_hosts and gputui's own known-hosts file (where the cluster manager
records the slaves' keys), strictly: an unknown or changed key is refused, never accepted.
"""

from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from gputui.cloud.budget import Checkpointer
from gputui.errors import GputuiError
from gputui.model.cloud import InstanceRecord

if TYPE_CHECKING:
    from gputui.cloud.settings import CloudSettings

# The slave's gputui is in the cluster bootstrap's venv (default remote_dir) or, on a slave
# set up by hand, importable by its python3: use the first that has it.
REMOTE_CHECKPOINT = (
    "for py in ~/.gputui-cluster/venv/bin/python python3; do "
    "if \"$py\" -c 'import gputui' 2>/dev/null; then exec \"$py\" -m gputui.cloud.watcher --checkpoint-all; fi; "
    "done; echo 'gputui is not installed on this slave' >&2; exit 3"
)


def private_key(settings: "CloudSettings") -> Path | None:
    """The private half of `[cloud] public_key` when it exists (the key the cluster manager uses)."""
    public = settings.public_key_path()
    private = public.with_suffix("") if public.suffix == ".pub" else None
    return private if private is not None and private.is_file() else None


def known_hosts_files() -> list[Path]:
    """The files a slave's host key must be in: ~/.ssh/known_hosts and gputui's own (hostkeys.SshOptions)."""
    from gputui.sources.hostkeys import SshOptions

    return SshOptions().all_known_hosts()


def _ssh_word(path: Path) -> str:
    """A path as ssh_config reads it: '%' is a token there, whitespace separates files."""
    text = str(path).replace("%", "%%")
    return f'"{text}"' if any(c.isspace() for c in text) else text


def ssh_command(ssh_user: str, address: str, identity: Path | None = None, port: int = 22,
                known_hosts: Sequence[Path] | None = None, ssh: str | None = None) -> list[str]:
    """The ssh invocation that SIGTERMs every watched run on one slave (`GPUTUI_SSH` picks the client)."""
    files = list(known_hosts) if known_hosts is not None else known_hosts_files()
    command = [ssh or os.environ.get("GPUTUI_SSH", "ssh"), "-o", "BatchMode=yes", "-o", "ConnectTimeout=5",
               "-o", "StrictHostKeyChecking=yes", "-o", "UserKnownHostsFile=" + " ".join(_ssh_word(f) for f in files)]
    if identity is not None:  # as an option, not -i: ssh checks -i's file before expanding its '%' tokens
        command += ["-o", "IdentityFile=" + _ssh_word(identity), "-o", "IdentitiesOnly=yes"]
    if port != 22:
        command += ["-p", str(port)]
    # -l USER -- HOST: neither can be read as an ssh option, whatever the profile says
    return command + ["-l", ssh_user, "--", address, REMOTE_CHECKPOINT]


def _reason(stderr: str, ssh_user: str, address: str, port: int, identity: Path | None) -> str:
    """ssh's failure as one line, with what to do about it."""
    text = stderr.strip()
    name = address if port == 22 else f"[{address}]:{port}"
    if "Host key verification failed" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        from gputui.sources.hostkeys import SshOptions

        keyscan = f"ssh-keyscan {'' if port == 22 else f'-p {port} '}{address} >> {SshOptions().gputui_known_hosts_path()}"
        return (f"host key of {name} is unknown or has changed: refused (strict checking); if it is the slave's key, "
                f"trust it with `{keyscan}`")
    if "Permission denied" in text:
        key = identity if identity is not None else "ssh's default keys (no private key next to [cloud] public_key)"
        return f"authentication failed for {ssh_user}@{name} (key {key})"
    return text.splitlines()[-1][-200:] if text else "no message"


def ssh_checkpointer(ssh_user: str, timeout_s: float = 20.0, identity: Path | None = None, port: int = 22,
                     known_hosts: Sequence[Path] | None = None) -> Checkpointer:
    """A Checkpointer that reaches all slaves in parallel; raises once if any did not answer.

    `port`: slaves listen on 22; the tests point it at a loopback sshd.
    """

    def one(record: InstanceRecord) -> str | None:
        if not record.address:
            return f"{record.instance_id}: no address"
        command = ssh_command(ssh_user, record.address, identity, port, known_hosts)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"{record.instance_id}: {exc}"
        if done.returncode != 0:
            why = _reason(done.stderr, ssh_user, record.address, port, identity)
            return f"{record.instance_id}: ssh exit {done.returncode}: {why}"
        return None

    def checkpoint(records: Sequence[InstanceRecord]) -> None:
        with ThreadPoolExecutor(max_workers=min(16, max(1, len(records)))) as pool:
            problems = [p for p in pool.map(one, records) if p]
        if problems:
            raise GputuiError("; ".join(problems))

    return checkpoint


def cloud_checkpointer(settings: "CloudSettings", timeout_s: float = 20.0, port: int = 22) -> Checkpointer:
    """The Checkpointer for a `[cloud]` table's slaves: its ssh_user and the private half of its public_key."""
    return ssh_checkpointer(settings.ssh_user, timeout_s, private_key(settings), port)
