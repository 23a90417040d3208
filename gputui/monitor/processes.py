"""The process table: every compute process of every host's GPUs, sorted and filtered, and
signals sent to one of them (locally through a pidfd, or `os.kill`, to the process the snapshot
saw and no other: its start time is compared; remotely with `kill` over the host's
SSH connection, as that host's user).

Pure data and the two ways of signalling; no UI. A refusal (another user's process, a
process already gone, no permission) is a `KillResult` whose line says why, never an
exception.
"""

from __future__ import annotations

import getpass
import os
import shlex
import signal
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from gputui.model.telemetry import GpuProcess, HostSnapshot
from gputui.model.text import clean

SIGNALS: dict[str, int] = {"TERM": signal.SIGTERM, "INT": signal.SIGINT, "KILL": signal.SIGKILL}


@dataclass(frozen=True)
class ProcessRow:
    """One compute process on one GPU of one host."""

    host: str
    kind: str  # the host's kind: local, ssh, sim, replay
    gpu: int
    process: GpuProcess

    @property
    def pid(self) -> int:
        return self.process.pid

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "gpu": self.gpu, **self.process.to_dict()}


def _none_last(value: Any) -> tuple[bool, Any]:
    return (value is None, value if value is not None else 0)


# Sort keys: the column they sort by; numbers sort largest first, names in order.
SORT_KEYS: dict[str, Callable[[ProcessRow], Any]] = {
    "memory": lambda r: r.process.gpu_memory_mib,
    "sm": lambda r: r.process.sm_pct,
    "cpu": lambda r: r.process.cpu_pct,
    "rss": lambda r: r.process.rss_mib,
    "time": lambda r: r.process.running_s,
    "pid": lambda r: r.pid,
    "user": lambda r: (r.process.user or "").lower(),
    "host": lambda r: (r.host, r.gpu, r.pid),
    "command": lambda r: (r.process.name or "").lower(),
}
ASCENDING = ("pid", "user", "host", "command")  # the rest: largest first


def rows(hosts: Iterable[HostSnapshot]) -> list[ProcessRow]:
    """Every compute process of every host, in host and GPU order."""
    return [ProcessRow(h.name, h.kind, g.index, p) for h in hosts for g in h.gpus for p in g.processes]


def sort_rows(found: Sequence[ProcessRow], key: str = "memory", reverse: bool = False) -> list[ProcessRow]:
    """Rows by `key` (SORT_KEYS): numbers largest first, names A to Z; `reverse` flips it.
    A process without the value (n/a) comes last either way."""
    get = SORT_KEYS[key]
    descending = key not in ASCENDING
    if reverse:
        descending = not descending
    known = [r for r in found if get(r) is not None]
    unknown = [r for r in found if get(r) is None]
    return sorted(known, key=get, reverse=descending) + unknown


def filter_rows(found: Sequence[ProcessRow], user: str | None = None, command: str | None = None,
                host: str | None = None) -> list[ProcessRow]:
    """Rows whose user is `user` (exactly), whose command contains `command` (any case), on `host`."""
    out = []
    needle = command.lower() if command else None
    for row in found:
        if user is not None and row.process.user != user:
            continue
        if needle is not None and needle not in (row.process.name or "").lower():
            continue
        if host is not None and row.host != host:
            continue
        out.append(row)
    return out


@dataclass(frozen=True)
class KillResult:
    """What became of a signal: sent, or refused with the reason, as one line."""

    ok: bool
    line: str


def signal_name(name: str) -> str:
    """"TERM", "INT" or "KILL" from any spelling ("sigterm", "SIGKILL", "int")."""
    short = name.upper().removeprefix("SIG")
    if short not in SIGNALS:
        raise ValueError(f"signal {name!r}: expected TERM, INT or KILL")
    return short


def _who(process: GpuProcess | None, pid: int) -> str:
    command = clean(process.name, 60) if process is not None and process.name else None
    return f"pid {pid} ({command})" if command else f"pid {pid}"


def _pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (Linux 5.3+): a signal sent through it reaches that process or none,
    never one that took its pid later. None where there is none to be had (os.kill is used)."""
    opener = getattr(os, "pidfd_open", None)
    if opener is None or not hasattr(signal, "pidfd_send_signal"):
        return None
    try:
        return int(opener(pid))
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (an old kernel), a sandbox that forbids it
        return None


def _same_process(pid: int, process: GpuProcess | None, created: float | None) -> bool:
    """Whether the live `pid` (started at `created`) is the snapshot's process, as far as can be told."""
    if process is None or process.started is None:
        return True  # the snapshot cannot tell (no start time read): the owner check stands alone
    return created is not None and abs(created - process.started) < 0.01


def kill_local(pid: int, name: str, process: GpuProcess | None = None, host: str = "local",
               me: str | None = None) -> KillResult:
    """Send SIG`name` to a local process of this user's, and only to the process the snapshot saw:
    a pid reused since (another start time) is refused. The signal goes through a pidfd opened
    before the check where the kernel has them (os.kill otherwise)."""
    sig = signal_name(name)
    me = me or getpass.getuser()
    who = _who(process, pid)
    gone = KillResult(False, f"kill refused: {who} on {host} has already exited")
    try:
        fd = _pidfd(pid)
    except ProcessLookupError:
        return gone
    try:
        try:
            import psutil

            live = psutil.Process(pid)
            owner, created = live.username(), live.create_time()
        except Exception as exc:  # noqa: BLE001 - gone, or unreadable
            if type(exc).__name__ == "NoSuchProcess":
                return gone
            owner, created = None, None
        if not _same_process(pid, process, created):
            return KillResult(False, f"kill refused: process {pid} has ended (its PID now belongs to another "
                                     "process): nothing sent")
        if owner is not None and owner != me:
            return KillResult(False, f"kill refused: {who} on {host} belongs to {clean(owner)}, not {me}")
        try:
            if fd is not None:
                signal.pidfd_send_signal(fd, SIGNALS[sig])
            else:
                os.kill(pid, SIGNALS[sig])
        except ProcessLookupError:
            return gone
        except PermissionError:
            return KillResult(False, f"kill refused: {who} on {host}: permission denied")
        except OSError as exc:
            return KillResult(False, f"kill failed: {who} on {host}: {exc.strerror or exc}")
        return KillResult(True, f"SIG{sig} sent to {who} on {host}")
    finally:
        if fd is not None:
            os.close(fd)


def remote_kill_command(pid: int, name: str) -> str:
    """The POSIX sh script that signals `pid` on a remote host if it is the login user's.

    It prints one word: `sent`, `gone`, `owner USER` or `failed MESSAGE`."""
    sig = signal_name(name)
    script = (
        f"p={shlex.quote(str(int(pid)))}; s={shlex.quote(sig)}\n"
        'row=$(ps -o uid=,user:32= -p "$p" 2>/dev/null || ps -o uid=,user= -p "$p" 2>/dev/null)\n'
        '[ -n "$row" ] || { echo gone; exit 0; }\n'
        'set -- $row\n'
        '[ "$1" = "$(id -u)" ] || { echo "owner $2"; exit 0; }\n'
        'if out=$(kill -s "$s" "$p" 2>&1); then echo sent; else echo "failed $out"; fi\n'
    )
    return "sh -c " + shlex.quote(script)


def parse_kill_answer(answer: str, pid: int, sig: str, host: str, user: str, process: GpuProcess | None = None) -> KillResult:
    """The one line a remote kill's answer means."""
    who = _who(process, pid)
    words = clean(answer.strip().splitlines()[-1] if answer.strip() else "", 200).split(None, 1)
    verb, rest = (words[0], words[1] if len(words) > 1 else "") if words else ("", "")
    if verb == "sent":
        return KillResult(True, f"SIG{sig} sent to {who} on {host} as {user}")
    if verb == "gone":
        return KillResult(False, f"kill refused: {who} on {host} has already exited")
    if verb == "owner":
        return KillResult(False, f"kill refused: {who} on {host} belongs to {rest or 'another user'}, not {user}")
    if verb == "failed" and ("not permitted" in rest.lower() or "permission" in rest.lower()):
        return KillResult(False, f"kill refused: {who} on {host}: permission denied")
    if verb == "failed" and "no such process" in rest.lower():
        return KillResult(False, f"kill refused: {who} on {host} has already exited")
    return KillResult(False, f"kill failed: {who} on {host}: {rest or 'no answer'}")


def kill_remote(host: Any, pid: int, name: str, process: GpuProcess | None = None) -> KillResult:
    """Send SIG`name` to `pid` on an SshHost over its open connection, as its login user."""
    sig = signal_name(name)
    label = host.spec.name
    user = host.target.user
    try:
        if not host.connected:
            return KillResult(False, f"kill refused: {label} is not connected ({clean(host.snapshot.message or 'no connection', 120)})")
        _code, out, err = host.run(remote_kill_command(pid, sig), timeout=min(10.0, host.spec.command_timeout))
    except Exception as exc:  # noqa: BLE001 - a lost connection or a timeout is a line, not a traceback
        return KillResult(False, f"kill failed: {_who(process, pid)} on {label}: {clean(str(exc) or type(exc).__name__, 120)}")
    return parse_kill_answer(out or err, pid, sig, label, user, process)
