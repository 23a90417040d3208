"""SSH host-key policy and the one-line reasons behind each host state.

Keys are checked against ~/.ssh/known_hosts and gputui's own known-hosts file (under the
user data directory). A changed key is always refused (paramiko raises BadHostKeyException
before any policy is asked). An unknown key is refused with the command that trusts it,
unless trust-on-first-use was asked for explicitly, in which case the key is recorded in
gputui's file. Messages carry public-key fingerprints only; never passwords, passphrases
or key material.
"""

from __future__ import annotations

import os
import shlex
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gputui.model.telemetry import HostState
from gputui.model.paths import data_home

if TYPE_CHECKING:
    from gputui.sources.target import Target

_WRITE_LOCK = threading.Lock()
# paramiko's words when a server accepts TCP but never completes the SSH handshake in time
# (which one depends on whether the banner or the negotiation timer fires first)
_NO_HANDSHAKE = ("banner", "no existing session", "negotiation")


@dataclass(frozen=True)
class SshOptions:
    """Where host keys and ssh settings come from; tests point these into a temp dir."""

    known_hosts: tuple[Path, ...] = (Path("~/.ssh/known_hosts"),)  # read, never written
    gputui_known_hosts: Path | None = None  # read and written; default: <data home>/known_hosts
    ssh_config: Path | None = Path("~/.ssh/config")
    trust_on_first_use: bool = False  # for every host (--trust-on-first-use)

    def gputui_known_hosts_path(self) -> Path:
        return (self.gputui_known_hosts or data_home() / "known_hosts").expanduser()

    def all_known_hosts(self) -> list[Path]:
        return [p.expanduser() for p in self.known_hosts] + [self.gputui_known_hosts_path()]


class HostKeyUnknown(Exception):
    """The server's host key is in no known-hosts file and trust-on-first-use is off."""

    def __init__(self, hostname: str, key: Any) -> None:
        super().__init__(f"host key of {hostname} is not known")
        self.hostname, self.key = hostname, key


class HostKeyPolicy:
    """paramiko's missing-host-key hook: refuse, or (trust on first use) record and accept."""

    def __init__(self, record_to: Path, trust_on_first_use: bool) -> None:
        self.record_to = record_to
        self.trust_on_first_use = trust_on_first_use

    def missing_host_key(self, client: Any, hostname: str, key: Any) -> None:
        if not self.trust_on_first_use:
            raise HostKeyUnknown(hostname, key)
        from paramiko.hostkeys import HostKeyEntry

        line = HostKeyEntry([hostname], key).to_line() or ""
        with _WRITE_LOCK:
            self.record_to.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.record_to, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            with os.fdopen(fd, "a", encoding="ascii") as f:
                f.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


def _known_name(target: "Target") -> str:
    return known_name(target.hostname, target.port)


@dataclass(frozen=True)
class Failure:
    """Why a connection or poll failed: the host state, a one-line reason and how to fix it."""

    state: HostState
    reason: str
    fix: str = ""

    def line(self) -> str:
        return f"{self.reason}; {self.fix}" if self.fix else self.reason


def known_name(hostname: str, port: int) -> str:
    """How known_hosts names a host: `host`, or `[host]:port` off port 22."""
    return hostname if port == 22 else f"[{hostname}]:{port}"


def _rewrite(path: Path, drop: set[str], add: list[str]) -> None:
    """Rewrite a known_hosts file atomically: lines for the names in `drop` go, `add` is appended."""
    with _WRITE_LOCK:
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            lines = []
        kept = [ln for ln in lines if not (ln.split() and set(ln.split()[0].split(",")) & drop)]
        if kept == lines and not add:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="ascii", errors="replace") as f:
            f.write("".join(ln + "\n" for ln in kept + add))
        os.replace(tmp, path)


def pin_host_keys(path: Path, name: str, keys: list[str]) -> None:
    """Make `keys` ("ssh-ed25519 AAAA...", learnt from a channel the network does not control) the
    only ones known for `name` in gputui's known_hosts."""
    _rewrite(path, {name}, [f"{name} {key}" for key in keys])


def forget_hosts(path: Path, names: list[str]) -> None:
    """Drop every key known for `names` (an instance is gone: its address may be reused)."""
    if names:
        _rewrite(path, set(names), [])


def holder(files: list[Path], name: str) -> Path | None:
    """The first of `files` that holds a key for `name`."""
    for path in files:
        try:
            text = path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if any(ln.split() and name in ln.split()[0].split(",") for ln in text.splitlines()):
            return path
    return None


def classify(exc: BaseException, target: "Target", timeout: float, known_hosts: list[Path] | None = None) -> Failure:
    """The host state an exception from connecting or polling means, with its reason and fix."""
    import paramiko

    where = f"{target.hostname}:{target.port}"
    known = _known_name(target)
    if isinstance(exc, HostKeyUnknown):
        keyscan = f"ssh-keyscan -p {target.port} {target.hostname} >> ~/.ssh/known_hosts"
        return Failure(
            HostState.HOST_KEY_UNKNOWN,
            f"host key of {known} is not known ({exc.key.get_name()} {exc.key.fingerprint})",
            f"if that is the server's key, trust it with `{keyscan}` or set trust_on_first_use = true (--trust-on-first-use)",
        )
    if isinstance(exc, paramiko.BadHostKeyException):
        holding = holder(known_hosts or [], known)  # the file the fix must edit (often gputui's own)
        remove = f"ssh-keygen -R {shlex.quote(known)}" + (f" -f {shlex.quote(str(holding))}" if holding is not None else "")
        return Failure(
            HostState.HOST_KEY_MISMATCH,
            f"host key of {known} has CHANGED (now {exc.key.get_name()} {exc.key.fingerprint}, known {exc.expected_key.fingerprint}): refused",
            f"if the server was reinstalled, remove the old key with `{remove}`",
        )
    if isinstance(exc, paramiko.PasswordRequiredException):
        return Failure(HostState.AUTH_FAILED, "the identity file is passphrase-protected", "load it into ssh-agent (ssh-add FILE)")
    if isinstance(exc, paramiko.AuthenticationException):
        tried = ", ".join(Path(k).name for k in target.key_files) or "ssh-agent and ~/.ssh/id_*"
        return Failure(
            HostState.AUTH_FAILED,
            f"authentication failed for {target.user}@{target.hostname} (tried {tried})",
            "add your public key to ~/.ssh/authorized_keys there, or set identity_file (--identity)",
        )
    if isinstance(exc, paramiko.ssh_exception.NoValidConnectionsError):
        return Failure(HostState.UNREACHABLE, f"connection refused by {where}", "check the port and that sshd runs there")
    if isinstance(exc, socket.gaierror):
        return Failure(HostState.UNREACHABLE, f"unknown host name {target.hostname!r}", "check the address")
    if isinstance(exc, (socket.timeout, TimeoutError)):
        return Failure(HostState.UNREACHABLE, f"no answer from {where} within {timeout:g} s", "check the address, the port and the firewall")
    if isinstance(exc, paramiko.SSHException) and any(w in str(exc).lower() for w in _NO_HANDSHAKE):
        return Failure(HostState.UNREACHABLE, f"no SSH handshake from {where} within {timeout:g} s", "check the port: is an SSH server listening there?")
    if isinstance(exc, (EOFError, ConnectionError)):
        return Failure(HostState.UNREACHABLE, f"connection to {where} closed")
    if isinstance(exc, OSError):
        return Failure(HostState.UNREACHABLE, f"{where}: {exc.strerror or exc}")
    if isinstance(exc, paramiko.SSHException):
        return Failure(HostState.ERROR, f"SSH error with {where}: {str(exc)[:200]}")
    return Failure(HostState.ERROR, f"{type(exc).__name__}: {str(exc)[:200]}")
