"""One slave's SSH connection for the cluster: commands, a streamed command, SFTP.

Built on the telemetry's SshHost (same ~/.ssh/config handling, bastions and ProxyCommand,
verified host keys, one-line failure reasons); paramiko is imported lazily. Connection failures become one-line errors
naming the slave and the fix: a wrong key or an unknown host key is a UserError (exit 2),
an unreachable slave a GputuiError (exit 1).
"""

from __future__ import annotations

import os
import shlex
import stat
from pathlib import Path
import time
from typing import TYPE_CHECKING, Any, Callable

from gputui.model.errors import GputuiError, UserError
from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostState
from gputui.sources.hostkeys import SshOptions
from gputui.sources.ssh import CommandTimeout, SshHost

if TYPE_CHECKING:
    from gputui.cluster.tunnel import ReverseForward

GET_CHUNK = 1 << 16  # bytes per read of a fetched file (the copy is counted as it goes)
_USER_STATES = (HostState.AUTH_FAILED, HostState.HOST_KEY_UNKNOWN, HostState.HOST_KEY_MISMATCH)


def sh(*words: str) -> str:
    """Shell words for a remote command, each quoted: the one way gputui puts a value into one
    (tests/test_security.py fails on an f-string that interpolates anything else)."""
    return " ".join(shlex.quote(str(w)) for w in words)


def quote_path(path: str) -> str:
    """A shell word for a remote path; a leading '~/' stays the remote user's home."""
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)


class SlaveConnection(SshHost):
    """A connected slave: `check` runs a command that must succeed, `open` streams one, `sftp` copies."""

    def __init__(self, spec: HostSpec, options: SshOptions | None = None) -> None:
        super().__init__(spec, options or SshOptions())
        self._sftp: Any = None
        self._forwards: list[ReverseForward] = []

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def address(self) -> str:
        """The address the slave is reached on (also what its torchrun advertises)."""
        return self.target.hostname

    def local_address(self) -> str | None:
        """This machine's address on the connection to the slave (how the slave sees the master);
        None when a bastion or a ProxyCommand stands between them (set [cluster] master_addr)."""
        if self.target.via is not None or self.target.proxy_command:
            return None
        transport = self._client.get_transport() if self._client is not None else None
        try:
            return str(transport.sock.getsockname()[0]) if transport is not None else None
        except (OSError, AttributeError):
            return None

    def open_or_raise(self, wait_s: float = 0.0, sleep: Callable[[float], None] = time.sleep) -> "SlaveConnection":
        """Connect; with `wait_s`, keep trying an unreachable slave (a booting one) that long.
        A refused key or host key is not waited on; `sleep` may raise to end the wait (a stop)."""
        from gputui.cloud.waiting import backoff, wait_until

        def state() -> HostState:
            assert self.failure is not None
            return self.failure.state

        def error(_connected: bool) -> GputuiError:
            assert self.failure is not None
            kind = UserError if self.failure.state in _USER_STATES else GputuiError
            return kind(f"slave {self.name} ({self.target.label()}): {self.failure.line()}")

        wait_until(self.connect, bool, f"slave {self.name}", wait_s, sleep=sleep, delays=backoff(1.0, 1.6, 10.0),
                   hopeless=lambda _connected: state() in _USER_STATES, error=error)
        return self

    def check(self, command: str, timeout: float = 60.0, what: str = "command") -> str:
        """Run `command`; its stdout, or a GputuiError naming the slave with its last error line."""
        try:
            status, out, err = self.run(command, timeout=timeout)
        except CommandTimeout:
            raise GputuiError(f"slave {self.name}: {what} gave no answer within {timeout:g} s") from None
        except Exception as exc:  # noqa: BLE001 - a dropped connection is the slave's failure
            raise GputuiError(f"slave {self.name}: connection lost during {what} ({exc or type(exc).__name__})") from None
        if status != 0:
            lines = [ln for ln in (err + "\n" + out).splitlines() if ln.strip()]
            raise GputuiError(f"slave {self.name}: {what} failed (exit {status}): {(lines or ['no output'])[-1][:200]}")
        return out

    def open(self, command: str) -> Any:
        """Start `command` on a new channel and return it (stdin open; stderr merged into stdout)."""
        transport = self._client.get_transport() if self._client is not None else None
        if transport is None or not transport.is_active():
            raise GputuiError(f"slave {self.name}: not connected")
        channel = transport.open_session(timeout=self.spec.connect_timeout)
        channel.set_combine_stderr(True)
        channel.exec_command(command)
        return channel

    def sftp(self) -> Any:
        if self._sftp is None:
            if self._client is None:
                raise GputuiError(f"slave {self.name}: not connected")
            try:
                self._sftp = self._client.open_sftp()
            except Exception as exc:  # noqa: BLE001
                raise GputuiError(f"slave {self.name}: SFTP is not available ({exc}); enable the sftp "
                                  "Subsystem in its sshd_config") from None
        return self._sftp

    def put(self, local: "os.PathLike[str] | str", remote: str) -> None:
        """Copy a file to an absolute remote path, atomically (temporary name, then rename)."""
        sftp = self.sftp()
        tmp = f"{remote}.part{os.getpid()}"
        try:
            sftp.put(os.fspath(local), tmp)
            sftp.posix_rename(tmp, remote)
        except OSError as exc:
            raise GputuiError(f"slave {self.name}: cannot copy {local} to {remote}: {exc}") from None

    def put_text(self, text: str, remote: str) -> None:
        sftp = self.sftp()
        tmp = f"{remote}.part{os.getpid()}"
        try:
            with sftp.open(tmp, "w") as fh:
                fh.write(text.encode("utf-8"))
            sftp.posix_rename(tmp, remote)
        except OSError as exc:
            raise GputuiError(f"slave {self.name}: cannot write {remote}: {exc}") from None

    def get(self, remote: str, local: "os.PathLike[str] | str", max_bytes: int | None = None,
            check: "Callable[[str], object] | None" = None) -> bool:
        """Copy a remote regular file here atomically; False if it does not exist there.

        The slave's file is data: a link, a device or a FIFO is refused (lstat, never followed:
        a link to /dev/zero never ends), and the copy itself is bounded: at most `max_bytes`
        bytes are read, counted as they come, so a file that grows (or is swapped for another)
        after it was looked at is cut there and refused. `check(copy)` may refuse the copy (by
        raising) before it replaces `local`. A refused or failed copy leaves no partial file.
        """
        local = os.fspath(local)
        tmp = f"{local}.part"
        sftp = self.sftp()
        try:
            try:
                info = sftp.lstat(remote)
            except FileNotFoundError:
                return False
            self._regular(remote, info.st_mode)
            if max_bytes is not None and (info.st_size or 0) > max_bytes:
                raise GputuiError(f"slave {self.name}: {remote} is larger than {max_bytes} bytes; not fetched")
            with sftp.open(remote, "rb") as src:
                self._regular(remote, src.stat().st_mode)  # what was opened (a link swapped in since is refused)
                self._copy(src, tmp, remote, max_bytes, info.st_size or 0)
            if check is not None:
                check(tmp)
            os.replace(tmp, local)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise GputuiError(f"slave {self.name}: cannot fetch {remote}: {exc}") from None
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return True

    def _regular(self, remote: str, mode: int | None) -> None:
        if mode is None or not stat.S_ISREG(mode):
            raise GputuiError(f"slave {self.name}: {remote} is not a regular file (a link, a device or a pipe); "
                              "not fetched")

    def _copy(self, src: Any, tmp: str, remote: str, max_bytes: int | None, size: int) -> None:
        """`src` (an open SFTP file) into `tmp` (private), stopping past `max_bytes`."""
        if 0 < size <= (max_bytes if max_bytes is not None else size):
            src.prefetch(size)  # pipelined reads of the size seen; reads past it still come, one by one
        copied = 0
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as dst:
            while True:
                data = src.read(GET_CHUNK)
                if not data:
                    return
                copied += len(data)
                if max_bytes is not None and copied > max_bytes:
                    raise GputuiError(f"slave {self.name}: {remote} passed {max_bytes} bytes while it was copied "
                                      "(a file that keeps growing); cut there and not fetched")
                dst.write(data)

    def transport(self) -> Any:
        """paramiko's Transport of this connection, or None."""
        return self._client.get_transport() if self._client is not None else None

    def forward_to_master(self, port: int) -> "ReverseForward":
        """A port on the slave's loopback leading to `port` on the master's loopback (kept until close)."""
        from gputui.cluster.tunnel import ReverseForward

        transport = self.transport()
        if transport is None or not transport.is_active():
            raise GputuiError(f"slave {self.name}: not connected")
        try:
            forward = ReverseForward(transport, port, self.name)
        except Exception as exc:  # noqa: BLE001 - paramiko's SSHException, or a dropped connection
            raise GputuiError(f"slave {self.name}: its sshd refused to forward a port back to the master ({exc or 'refused'}); "
                              "set 'AllowTcpForwarding yes' (or 'remote') in its sshd_config, or [cluster] "
                              "rendezvous = \"direct\" on a trusted network") from None
        self._forwards.append(forward)
        return forward

    def close(self) -> None:
        for forward in self._forwards:
            forward.close()
        self._forwards = []
        sftp, self._sftp = self._sftp, None
        if sftp is not None:
            try:
                sftp.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass
        super().close()
