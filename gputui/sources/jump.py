"""How a remote host is reached: ~/.ssh/config, jump hosts (ProxyJump) and ProxyCommand.

`resolve` turns a `[[hosts]]` entry into a `Target`: HostName, Port, User and IdentityFile
from ~/.ssh/config under the profile's values, and the route to it: a chain of bastions
(the profile's `proxy_jump`, else the config's ProxyJump) or the config's ProxyCommand.
A config paramiko cannot read is one warning line naming the file, once per process.

`connect` opens the paramiko connection along that route. A jump is a `direct-tcpip`
channel on the bastion's transport; one transport per bastion is shared by every host
behind it in this process (counted, closed with its last user). Each bastion's host key is
checked by the same policy as any host's. A bastion that fails raises `BastionError`, which
names the bastion; the target is not blamed for it.
"""

from __future__ import annotations

import getpass
import sys
import threading
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from gputui.config.hosts import Hop, HostSpec, parse_proxy_jump
from gputui.model.telemetry import HostState
from gputui.sources.hostkeys import Failure, HostKeyPolicy, SshOptions, classify
from gputui.sources.target import Target

MAX_HOPS = 8  # a ProxyJump chain longer than this (or a loop through ~/.ssh/config) is refused


def _warn_stderr(line: str) -> None:
    print(f"gputui: {line}", file=sys.stderr, flush=True)


warn: Callable[[str], None] = _warn_stderr  # where the config warning goes (the tests may catch it)
_warned: set[str] = set()
_configs: dict[tuple[str, int, int], Any] = {}
_config_lock = threading.Lock()


class RouteError(Exception):
    """The way to a host failed before its own SSH server could be asked anything."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.reason)
        self.failure = failure


class BastionError(RouteError):
    """A bastion on the way failed (unreachable, unknown key, login refused...)."""

    def __init__(self, bastion: Target, own: Failure) -> None:
        reason = f"unreachable ({own.reason})" if own.state == HostState.UNREACHABLE else own.reason
        super().__init__(Failure(own.state, f"via bastion {bastion.label()}: {reason}", own.fix))
        self.bastion = bastion


# -- ~/.ssh/config ----------------------------------------------------------------------------


def _warn_once(path: Path, why: str) -> None:
    with _config_lock:
        if str(path) in _warned:
            return
        _warned.add(str(path))
    warn(f"warning: cannot use {path} ({why}); its Host settings (HostName, Port, User, IdentityFile, "
         "ProxyJump, ProxyCommand) are ignored")


def load_config(ssh_config: Path | None) -> Any:
    """paramiko's SSHConfig of the file, or None (no file, or one it cannot read: warned once)."""
    if ssh_config is None:
        return None
    path = ssh_config.expanduser()
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _warn_once(path, exc.strerror or str(exc))
        return None
    key = (str(path), st.st_mtime_ns, st.st_size)
    with _config_lock:
        if key in _configs:
            return _configs[key]
    import paramiko

    try:
        config = paramiko.SSHConfig.from_path(str(path))
    except IsADirectoryError:
        _warn_once(path, "a directory, not a file")
        config = None
    except OSError as exc:
        _warn_once(path, exc.strerror or str(exc))
        config = None
    except Exception as exc:  # noqa: BLE001 - paramiko's ConfigParseError and whatever else a bad file raises
        _warn_once(path, f"{type(exc).__name__}: {str(exc)[:200]}")
        config = None
    with _config_lock:
        _configs[key] = config
    return config


def _lookup(config: Any, ssh_config: Path | None, host: str) -> dict[str, Any]:
    if config is None:
        return {}
    try:
        return dict(config.lookup(host))
    except Exception as exc:  # noqa: BLE001 - a Match exec that fails, a bad token...
        _warn_once(ssh_config.expanduser() if ssh_config else Path("ssh config"), f"looking up {host!r}: {str(exc)[:200]}")
        return {}


def resolve(spec: HostSpec, ssh_config: Path | None) -> Target:
    """Apply ~/.ssh/config (HostName, Port, User, IdentityFile, ProxyJump, ProxyCommand) under the
    profile's values. A bastion logs in with its own IdentityFile from the config, else the host's key."""
    return _resolve(spec, ssh_config, load_config(ssh_config), 0)


def _resolve(spec: HostSpec, ssh_config: Path | None, config: Any, depth: int) -> Target:
    found = _lookup(config, ssh_config, spec.address)
    keys: tuple[str, ...]
    if spec.identity_file is not None:
        keys = (str(spec.identity_file),)
    else:
        keys = tuple(str(Path(p).expanduser()) for p in found.get("identityfile", ()) if Path(p).expanduser().is_file())
    try:
        config_port = int(found.get("port", 22))
    except ValueError:
        config_port = 22
    target = Target(
        hostname=str(found.get("hostname", spec.address)),
        port=spec.port or config_port,
        user=spec.user or str(found.get("user") or getpass.getuser()),
        key_files=keys,
    )
    jump = spec.proxy_jump if spec.proxy_jump is not None else found.get("proxyjump")
    if jump is not None:
        try:
            hops = parse_proxy_jump(str(jump))
        except ValueError as exc:  # only the config's can be wrong: the profile's was validated
            _warn_once(ssh_config.expanduser() if ssh_config else Path("ssh config"), f"ProxyJump of {spec.address}: {exc}")
            hops = ()
        if hops and depth + len(hops) > MAX_HOPS:
            _warn_once(ssh_config.expanduser() if ssh_config else Path("ssh config"),
                       f"more than {MAX_HOPS} jump hosts on the way to {spec.address} (a ProxyJump loop?)")
            hops = ()
        if hops:
            via = None
            for hop in hops:
                bastion = _resolve_hop(hop, keys, ssh_config, config, depth + 1)
                via = bastion if via is None else replace(bastion, via=via, proxy_command=None)
            return replace(target, via=via)
        return target  # "none": no jump, and no ProxyCommand either
    command = found.get("proxycommand")
    if command and str(command).strip().lower() != "none":
        return replace(target, proxy_command=str(command))
    return target


def _resolve_hop(hop: Hop, host_keys: tuple[str, ...], ssh_config: Path | None, config: Any, depth: int) -> Target:
    bastion = _resolve(HostSpec(name=hop.host, address=hop.host, port=hop.port, user=hop.user), ssh_config, config, depth)
    return bastion if bastion.key_files else replace(bastion, key_files=host_keys)


# -- connecting -------------------------------------------------------------------------------


def _known(options: SshOptions) -> list[Path]:
    return options.all_known_hosts()


def _ssh_connect(target: Target, options: SshOptions, tofu: bool, timeout: float, sock: Any) -> Any:
    """A paramiko SSHClient logged in to `target` over `sock` (None: a TCP connection of its own)."""
    import paramiko

    client = paramiko.SSHClient()
    try:
        for path in _known(options):
            if path.is_file():
                client.load_system_host_keys(str(path))
        policy = HostKeyPolicy(options.gputui_known_hosts_path(), tofu)  # duck-typed: paramiko is imported lazily
        client.set_missing_host_key_policy(policy)  # type: ignore[arg-type]
        client.connect(
            target.hostname,
            port=target.port,
            username=target.user,
            key_filename=list(target.key_files) or None,  # type: ignore[arg-type]  # a list is documented
            look_for_keys=not target.key_files,
            allow_agent=True,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            channel_timeout=timeout,
            sock=sock,
        )
    except BaseException:
        client.close()
        if sock is not None:
            sock.close()
        raise
    return client


def connect(target: Target, options: SshOptions, tofu: bool, timeout: float) -> tuple[Any, Callable[[], None]]:
    """An SSHClient logged in to `target` along its route, and what to call once it is closed
    (it lets go of the bastion). Raises RouteError when the route fails, else paramiko's errors."""
    if target.via is not None:
        bastion = _BASTIONS.acquire(target.via, options, tofu, timeout)
        try:
            sock = bastion.channel_to(target, timeout)
            client = _ssh_connect(target, options, tofu, timeout, sock)
        except BaseException:
            bastion.release()
            raise
        return client, bastion.release
    sock = None
    if target.proxy_command:
        import paramiko

        try:
            sock = paramiko.ProxyCommand(target.proxy_command)
        except Exception as exc:  # noqa: BLE001 - the command cannot be started
            raise RouteError(Failure(HostState.UNREACHABLE, f"ProxyCommand {target.proxy_command!r} cannot start: {exc}",
                                     "check the ProxyCommand in ~/.ssh/config")) from None
    return _ssh_connect(target, options, tofu, timeout, sock), lambda: None


class _Bastion:
    """One bastion's connection, shared by every host behind it (and bastions further on)."""

    def __init__(self, key: tuple[Any, ...], target: Target) -> None:
        self.key, self.target = key, target
        self.lock = threading.Lock()  # one connection attempt at a time
        self.users = 0
        self.client: Any = None
        self._let_go: Callable[[], None] = lambda: None

    def active(self) -> bool:
        transport = self.client.get_transport() if self.client is not None else None
        return bool(transport is not None and transport.is_active())

    def ensure(self, options: SshOptions, tofu: bool, timeout: float) -> None:
        """Connected, or BastionError naming the bastion (the first one that failed)."""
        with self.lock:
            if self.active():
                return
            self._close()
            try:
                client, let_go = connect(self.target, options, tofu, timeout)
            except BastionError:
                raise  # a bastion before this one: it is the one to name
            except RouteError as exc:  # the bastion before could not reach this one
                raise BastionError(self.target, exc.failure) from None
            except Exception as exc:  # noqa: BLE001 - its own SSH failed: the same reasons as any host's
                raise BastionError(self.target, classify(exc, self.target, timeout, _known(options))) from None
            transport = client.get_transport()
            if transport is not None:
                transport.set_keepalive(15)
            self.client, self._let_go = client, let_go

    def channel_to(self, target: Target, timeout: float) -> Any:
        """A direct-tcpip channel from the bastion to `target`'s host and port."""
        transport = self.client.get_transport() if self.client is not None else None
        where = f"{target.hostname}:{target.port}"
        try:
            if transport is None or not transport.is_active():
                raise EOFError("connection lost")
            return transport.open_channel("direct-tcpip", (target.hostname, target.port), ("127.0.0.1", 0), timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - ChannelException (the bastion's refusal), a lost connection
            if not self.active():
                raise BastionError(self.target, Failure(HostState.UNREACHABLE, f"connection to it lost: {exc or type(exc).__name__}")) from None
            why = getattr(exc, "text", None) or str(exc) or type(exc).__name__
            raise RouteError(Failure(
                HostState.UNREACHABLE,
                f"{where} cannot be reached from bastion {self.target.label()} ({why})",
                "check the address and port as the bastion sees them, and that its sshd allows TCP forwarding "
                "(AllowTcpForwarding)")) from None

    def _close(self) -> None:
        client, self.client = self.client, None
        let_go, self._let_go = self._let_go, lambda: None
        if client is not None:
            client.close()
        let_go()

    def release(self) -> None:
        _BASTIONS.release(self)


class _Bastions:
    """The process's bastion connections, by bastion, route and host-key policy."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._open: dict[tuple[Any, ...], _Bastion] = {}

    def acquire(self, target: Target, options: SshOptions, tofu: bool, timeout: float) -> _Bastion:
        key = (target, options, tofu)
        with self._lock:
            bastion = self._open.get(key)
            if bastion is None:
                bastion = self._open[key] = _Bastion(key, target)
            bastion.users += 1
        try:
            bastion.ensure(options, tofu, timeout)
        except BaseException:
            self.release(bastion)
            raise
        return bastion

    def release(self, bastion: _Bastion) -> None:
        with self._lock:
            bastion.users -= 1
            last = bastion.users <= 0
            if last and self._open.get(bastion.key) is bastion:
                del self._open[bastion.key]
        if last:
            with bastion.lock:
                bastion._close()

    def count(self) -> int:
        """Bastion connections open now (for tests)."""
        with self._lock:
            return sum(1 for b in self._open.values() if b.active())


_BASTIONS = _Bastions()


def open_bastions() -> int:
    """How many bastion connections this process holds now."""
    return _BASTIONS.count()
