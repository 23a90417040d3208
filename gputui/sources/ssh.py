"""Remote GPU hosts over SSH (paramiko, imported lazily): one persistent connection per host.

Each poll runs one command (see gputui.sources.nvsmi) on the host's open connection. Hosts
are polled concurrently, each in its own named daemon thread, and a round waits only for
hosts that were connected, each bounded by its command timeout: a host that is connecting,
backing off, slow or dead reports its current state and never delays the others. Polls of
one host never overlap. Host keys are verified (see gputui.sources.hostkeys). Hosts behind a
bastion (ProxyJump, `[[hosts]] proxy_jump`) or a ProxyCommand are reached through it (see
gputui.sources.jump); a failed bastion is named in the host's state.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from dataclasses import replace
from typing import Any, Callable, Sequence

from gputui.config.hosts import HostSpec
from gputui.model.telemetry import HostSnapshot, HostState
from gputui.sources.host import cpu_percent
from gputui.sources import jump
from gputui.sources.hostkeys import Failure, SshOptions, classify
from gputui.sources.jump import BastionError, RouteError, resolve
from gputui.sources.target import Target
from gputui.sources.nvsmi import GPU_FIELDS, OLDER_FIELD_NAMES, parse_report, remote_command, retry_fields

__all__ = ["CommandTimeout", "OutputTooLarge", "SshHost", "SshSource", "Target", "resolve"]

# paramiko logs failed handshakes at ERROR; without a handler Python would print them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

MIN_CPU_JIFFIES = 5.0  # below this, a CPU % between two /proc/stat readings is noise
# What one poll may read (stdout and stderr together): nvidia-smi's answer for 16 GPUs and their
# processes is tens of KiB. A host that says more (a broken or hostile nvidia-smi) is an error
# for that poll, and its channel is closed rather than read on.
MAX_POLL_BYTES = 1 << 20
MAX_LINE_BYTES = 64 << 10  # a line of that answer is a few hundred bytes

RETRY_NOTE = " (retry in {delay:g} s)"  # what a failed host's message ends with while the source keeps polling
_RETRY_RE = re.compile(r" \(retry in [0-9.e+-]+ s\)$")


def without_retry(message: str | None) -> str | None:
    """A failed host's message without the retry note (a one-round view retries nothing)."""
    return None if message is None else _RETRY_RE.sub("", message)


class CommandTimeout(Exception):
    """The remote command gave no complete answer in time."""


class OutputTooLarge(Exception):
    """The remote command said more than a poll reads (in all, or in one line)."""

    def __init__(self, limit: int, what: str = "output") -> None:
        super().__init__(f"{what} over {limit // 1024} KiB")


class _Budget:
    """The bytes one command's output may still take, and the length of the line it is in."""

    def __init__(self, max_bytes: int, max_line: int) -> None:
        self.max_bytes, self.max_line = max_bytes, max_line
        self.taken = 0
        self.line = 0

    def take(self, data: bytes) -> None:
        self.taken += len(data)
        if self.taken > self.max_bytes:
            raise OutputTooLarge(self.max_bytes)
        start = 0
        while (nl := data.find(b"\n", start)) >= 0:
            if self.line + nl - start > self.max_line:
                raise OutputTooLarge(self.max_line, "a line of output")
            self.line, start = 0, nl + 1
        self.line += len(data) - start
        if self.line > self.max_line:
            raise OutputTooLarge(self.max_line, "a line of output")

    def start_stream(self) -> None:
        self.line = 0  # stderr's lines are not stdout's


def _nothing() -> None:
    pass


class Backoff:
    """Delays between reconnection attempts: 1, 2, 4 ... seconds, at most `cap`."""

    def __init__(self, base: float = 1.0, cap: float = 60.0) -> None:
        self.base, self.cap, self.failures = base, cap, 0

    def next_delay(self) -> float:
        delay = float(min(self.cap, self.base * 2.0**self.failures))
        self.failures += 1
        return delay

    def reset(self) -> None:
        self.failures = 0


class SshHost:
    """One remote host: its connection, its latest snapshot, its backoff."""

    def __init__(self, spec: HostSpec, options: SshOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self.spec = spec
        self.options = options
        self.target = resolve(spec, options.ssh_config)
        self._clock = clock
        self._client: Any = None
        self._let_go: Callable[[], None] = _nothing
        self._closed = False
        self._fields: tuple[str, ...] = tuple(GPU_FIELDS)
        self._backoff = Backoff()
        self._retry_at = 0.0
        self._last_cpu: Any = None
        self._done = threading.Event()
        self._done.set()
        self.max_bytes = MAX_POLL_BYTES  # what one poll command may print (stdout and stderr together)
        self.max_line = MAX_LINE_BYTES  # and in one line
        self.attempts = 0  # connection attempts so far
        self.failure: Failure | None = None  # why the last attempt failed
        self.bastion_failed = False  # whether that was a bastion's failure (named in `failure`)
        self.snapshot = self._snap(HostState.CONNECTING, "not polled yet", time.time(), None)

    # -- state ----------------------------------------------------------------------------

    def _snap(self, state: HostState, message: str | None, start: float, duration: float | None, **more: Any) -> HostSnapshot:
        return HostSnapshot(
            name=self.spec.name,
            state=state,
            time=start,
            duration_s=duration,
            kind="ssh",
            address=self.target.label(),
            message=message,
            **more,
        )

    @property
    def connected(self) -> bool:
        transport = self._client.get_transport() if self._client is not None else None
        return bool(transport is not None and transport.is_active())

    @property
    def busy(self) -> bool:
        return not self._done.is_set()

    @property
    def done(self) -> threading.Event:
        """Set while no poll of this host runs."""
        return self._done

    def due(self) -> bool:
        """Whether a poll may start now: not running, and not waiting out a backoff."""
        return not self.busy and (self.connected or self._clock() >= self._retry_at)

    def start(self) -> threading.Event:
        """Start one poll in a daemon thread; the event is set when it is done."""
        self._done.clear()
        self._closed = False
        thread = threading.Thread(target=self._job, name=f"gputui-ssh-{self.spec.name}", daemon=True)
        thread.start()
        return self._done

    def _job(self) -> None:
        try:
            self._poll()
        finally:
            self._done.set()

    # -- connecting -----------------------------------------------------------------------

    def connect(self) -> bool:
        """Open the connection; on failure set the state and schedule the next attempt."""
        start, t0 = time.time(), time.perf_counter()
        self.snapshot = self._snap(HostState.CONNECTING, f"connecting to {self.target.label()}{self.target.route()}", start, None)
        self.attempts += 1
        self.bastion_failed = False
        timeout = self.spec.connect_timeout
        tofu = self.spec.trust_on_first_use or self.options.trust_on_first_use
        try:
            client, let_go = jump.connect(self.target, self.options, tofu, timeout)
        except RouteError as exc:  # a bastion, or the way from it, failed: say so, do not blame the host
            self.bastion_failed = isinstance(exc, BastionError)
            self._fail(exc.failure, start, time.perf_counter() - t0)
            return False
        except Exception as exc:  # noqa: BLE001 - every failure is a state of the host
            failure = classify(exc, self.target, timeout, self.options.all_known_hosts())
            if self.target.proxy_command and failure.state in (HostState.UNREACHABLE, HostState.ERROR):
                failure = replace(failure, reason=f"via ProxyCommand {self.target.proxy_command!r}: {failure.reason}",
                                  fix=failure.fix or "check the ProxyCommand in ~/.ssh/config")
            self._fail(failure, start, time.perf_counter() - t0)
            return False
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        if self._closed:  # closed while connecting: do not keep a connection nobody will close
            client.close()
            let_go()
            return False
        self._client, self._let_go = client, let_go
        return True

    def _fail(self, failure: Failure, start: float, duration: float) -> None:
        self.failure = failure
        delay = self._backoff.next_delay()
        self._retry_at = self._clock() + delay
        self.snapshot = self._snap(failure.state, f"{failure.line()}{RETRY_NOTE.format(delay=delay)}", start, duration)

    def close(self) -> None:
        """Close the connection (also one being opened right now); a later poll opens a new one."""
        self._closed = True
        self._drop()

    def _drop(self) -> None:
        client, self._client = self._client, None
        let_go, self._let_go = self._let_go, _nothing
        if client is not None:
            client.close()
        let_go()  # the bastion's connection closes with its last host

    # -- polling --------------------------------------------------------------------------

    def run(self, command: str, timeout: float | None = None) -> tuple[int, str, str]:
        """Run a command on the open connection: (exit status, stdout, stderr), bounded by
        `timeout` (default: the host's command timeout)."""
        timeout = self.spec.command_timeout if timeout is None else timeout
        transport = self._client.get_transport() if self._client is not None else None
        if transport is None or not transport.is_active():
            raise EOFError("not connected")
        deadline = time.monotonic() + timeout
        channel = transport.open_session(timeout=timeout)
        try:
            channel.exec_command(command)
            budget = _Budget(self.max_bytes, self.max_line)
            out = self._read(channel, deadline, channel.recv, budget)
            budget.start_stream()
            err = self._read(channel, deadline, channel.recv_stderr, budget)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise CommandTimeout()
            return channel.recv_exit_status(), out, err
        finally:
            channel.close()

    @staticmethod
    def _read(channel: Any, deadline: float, recv: Callable[[int], bytes], budget: _Budget) -> str:
        """One of the command's streams to its end, within `budget` (OutputTooLarge past it: the
        caller closes the channel, nothing more of it is read)."""
        chunks: list[bytes] = []
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CommandTimeout()
            channel.settimeout(remaining)
            try:
                data = recv(65536)
            except socket.timeout:
                raise CommandTimeout() from None
            if not data:
                return b"".join(chunks).decode("utf-8", errors="replace")
            budget.take(data)
            chunks.append(data)

    def poll_now(self) -> HostSnapshot:
        """Connect if needed and poll once, in this thread. Never raises."""
        self._closed = False
        return self._poll()

    def _poll(self) -> HostSnapshot:
        if not self.connected:
            self._drop()
            if not self.connect():
                return self.snapshot
        start, t0 = time.time(), time.perf_counter()
        try:
            reading = self._read_host()
        except CommandTimeout:
            self.snapshot = self._snap(HostState.ERROR, f"no answer within {self.spec.command_timeout:g} s", start, time.perf_counter() - t0)
            return self.snapshot
        except OutputTooLarge as exc:  # the channel is closed; the connection stays for the next poll
            self.snapshot = self._snap(HostState.ERROR, f"{exc} (not nvidia-smi's answer?)", start, time.perf_counter() - t0)
            return self.snapshot
        except Exception as exc:  # noqa: BLE001 - a lost connection: reconnect with backoff
            self._drop()
            failure = classify(exc, self.target, self.spec.connect_timeout, self.options.all_known_hosts())
            self._fail(replace(failure, reason=f"connection lost: {failure.reason}"), start, time.perf_counter() - t0)
            return self.snapshot
        self._backoff.reset()
        self.failure = None
        before = self._last_cpu if self._last_cpu is not None else reading.cpu_before
        self._last_cpu = reading.cpu_after or self._last_cpu
        self.snapshot = self._snap(
            reading.state,
            reading.message,
            start,
            time.perf_counter() - t0,
            cpu_pct=cpu_percent(before, reading.cpu_after, MIN_CPU_JIFFIES),
            mem_used_mib=reading.mem_used_mib,
            mem_total_mib=reading.mem_total_mib,
            gpus=reading.gpus,
            driver=reading.driver,
        )
        return self.snapshot

    def _read_host(self) -> Any:
        """Run the poll command; drop --query-gpu fields this driver rejects (nvidia-smi names
        one at a time; each is dropped once for good, or asked again under its older name,
        e.g. clocks_throttle_reasons.active before R535) and retry."""
        for _ in range(len(GPU_FIELDS) + len(OLDER_FIELD_NAMES)):
            _, out, err = self.run(remote_command(self._fields))
            reading = parse_report(out + ("\n" + err if "@@gputui" not in out else ""), self._fields)
            fields = retry_fields(self._fields, reading.invalid_fields)
            if fields == self._fields:
                return reading
            self._fields = fields
        return reading


class SshSource:
    """Every remote host of a profile or of --host, polled concurrently."""

    def __init__(self, specs: Sequence[HostSpec], options: SshOptions | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.options = options or SshOptions()
        self.hosts = [SshHost(spec, self.options, clock) for spec in specs]

    def poll(self, settle: bool = False, wait: float | None = None) -> list[HostSnapshot]:
        """One round. Waits for the hosts that were connected (or, with `settle`, for every
        host, connecting included), at most `wait` seconds if given; each host's own
        timeouts bound the rest. A host still busy reports its latest snapshot."""
        waits = []
        for host in self.hosts:
            if host.busy:  # still at it since an earlier round: not waited for again
                if settle:
                    waits.append(host.done)
                continue
            if not host.due():  # backing off
                continue
            was_connected = host.connected
            event = host.start()
            if settle or was_connected:
                waits.append(event)
        deadline = None if wait is None else time.monotonic() + wait
        for event in waits:
            event.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return [host.snapshot for host in self.hosts]

    def close(self) -> None:
        for host in self.hosts:
            host.close()
