"""Remote GPU hosts over SSH (paramiko, imported lazily): one persistent connection per host.

Each host keeps one long-lived poll channel open on its connection (gputui.sources.pollchannel):
a small `sh` loop (gputui.sources.nvsmi) that answers each request line with one report, so a
poll is one write and one read, with no new channel, login shell or `sh` on the host. Rounds are bounded: the
blocking steps (connecting, opening the channel, sending) run in two small pools of named
workers (see gputui.sources.sshloop: connects apart, so a dead host's connect never holds up
a connected host's poll), and one reader thread reads every host's answer as it comes, each
bounded in bytes, line length and time. A round waits only for hosts that were connected: a
host that is connecting, backing off, slow or dead reports its current state and holds no
thread the others need. Polls of one host never overlap. A poll channel that dies is opened
again (the poll is then answered by one command on a channel of its own, as before); a host
whose poll channel keeps dying is polled that way from then on. Host keys are verified (see
gputui.sources.hostkeys). Hosts behind a bastion (ProxyJump, `[[hosts]] proxy_jump`) or a
ProxyCommand are reached through it (see gputui.sources.jump); a failed bastion is named in
the host's state.
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
from gputui.sources.nvsmi import GPU_FIELDS, OLDER_FIELD_NAMES, PsRow, parse_report, remote_command, retry_fields
from gputui.sources.pollchannel import Budget, CommandTimeout, OutputTooLarge, PollChannel
from gputui.sources.sshloop import Pool, pool_sizes, spawn

__all__ = ["CommandTimeout", "OutputTooLarge", "SshHost", "SshSource", "Target", "resolve"]

# paramiko logs failed handshakes at ERROR; without a handler Python would print them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

MIN_CPU_JIFFIES = 5.0  # below this, a CPU % between two /proc/stat readings is noise
FIRST_SPAN_S = 0.2  # until a host's CPU % is known, a poll waits this long between its /proc/stat readings
MAX_SPAN_WAITS = 3  # (at most this many polls: a host without /proc/stat never has one)
PS_REFRESH_S = 10.0  # a compute process's `ps` row (user, command, CPU %, RSS) is read again after this long
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


def _nothing() -> None:
    pass


# A host whose poll channel dies this many times in a row without answering is polled by one
# command per poll (a channel of its own each time) from then on.
LOOP_FAILURES_BEFORE_ONESHOT = 3


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
        self._last_pct: float | None = None  # the CPU % of the last span long enough to tell
        self._span_waits = 0  # polls that waited FIRST_SPAN_S
        self._done = threading.Event()
        self._done.set()
        self._channel = PollChannel(self._answered, self._failed, self._broken)
        self._round = (time.time(), time.perf_counter())  # when this host's poll started
        self._asks = 0  # requests in this poll (fields rejected by the driver are asked again)
        self._loop_failures = 0  # poll channels in a row that died before answering
        self._ps: dict[int, tuple[PsRow, float]] = {}  # pid -> its last `ps` row, and when it was read
        self._asked_ps: dict[int, PsRow] = {}  # the rows the request in flight said it knew
        self.fresh_ps = False  # every poll reads every process's `ps` row (a process table is shown)
        name = f"gputui-ssh-{spec.name}"
        self._submit: Callable[[Callable[[], None]], None] = lambda job: spawn(job, name)
        self._submit_connect: Callable[[Callable[[], None]], None] = self._submit
        self.oneshot = False  # poll by one command on a channel of its own each time (no poll channel)
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

    @property
    def loops_opened(self) -> int:
        """Poll channels opened so far."""
        return self._channel.opened

    def use_pools(self, poll: Callable[[Callable[[], None]], None], connect: Callable[[Callable[[], None]], None]) -> None:
        """Run this host's blocking steps in these pools (default: a daemon thread each)."""
        self._submit, self._submit_connect = poll, connect

    def start(self) -> threading.Event:
        """Start one poll (its blocking steps in the pools, its answer read by the reader
        thread); the event is set when it is done."""
        self._done.clear()
        self._closed = False
        self._round = (time.time(), time.perf_counter())
        self._asks = 0
        (self._submit if self.connected else self._submit_connect)(self._step)
        return self._done

    def _end_round(self) -> None:
        self._done.set()

    # -- connecting -----------------------------------------------------------------------

    def connect(self) -> bool:
        """Open the connection; on failure set the state and schedule the next attempt."""
        start, t0 = time.time(), time.perf_counter()
        if self.failure is None:  # after a failure, the host says why until this attempt's own verdict
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
        in_flight = self._channel.close()
        self._ps = {}  # a new connection may reach a rebooted host
        client, self._client = self._client, None
        let_go, self._let_go = self._let_go, _nothing
        if client is not None:
            client.close()
        let_go()  # the bastion's connection closes with its last host
        if in_flight:  # the poll in flight ends with its connection
            self._end_round()

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
            budget = Budget(self.max_bytes, self.max_line)
            out = self._read(channel, deadline, channel.recv, budget)
            budget.start_stream()
            err = self._read(channel, deadline, channel.recv_stderr, budget)
            if not channel.status_event.wait(max(0.0, deadline - time.monotonic())):
                raise CommandTimeout()
            return channel.recv_exit_status(), out, err
        finally:
            channel.close()

    @staticmethod
    def _read(channel: Any, deadline: float, recv: Callable[[int], bytes], budget: Budget) -> str:
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
        """Connect if needed and poll once; return when it is done. Never raises."""
        self._closed = False
        if self.oneshot:
            return self._poll()
        self.start().wait()
        return self.snapshot

    # -- the poll channel -----------------------------------------------------------------

    def _step(self) -> None:
        """A poll's blocking part, in a pool worker: connect if needed, then ask."""
        try:
            if self.oneshot or self._loop_failures >= LOOP_FAILURES_BEFORE_ONESHOT:
                self._poll()
            elif not self.connected:
                self._drop()
                if self.connect():
                    self._round = (time.time(), time.perf_counter())
                    self._ask()
                    return
            elif not self._closed:
                self._ask()
                return
        except BaseException:
            self._end_round()
            raise
        self._end_round()

    def _ask(self) -> None:
        """Send one request on the poll channel (opened first if needed); the reader takes the
        answer. In a pool worker."""
        wait = FIRST_SPAN_S if self._last_pct is None and self._span_waits < MAX_SPAN_WAITS else 0.0
        self._span_waits += wait > 0
        transport = self._client.get_transport() if self._client is not None else None
        try:
            if self._closed:
                raise EOFError("closed")
            self._asked_ps = self._known_ps()
            self._channel.ask(transport, self._fields, wait, self.spec.command_timeout, self.max_bytes, self.max_line,
                              tuple(self._asked_ps))
        except Exception as exc:  # noqa: BLE001 - the channel, or the connection, failed
            self._broken(exc)

    def _answered(self, asked: tuple[str, ...], text: str) -> None:
        """The reader thread: the poll channel's answer."""
        self._loop_failures = 0
        reading = parse_report(text, asked, self._asked_ps)
        fields = retry_fields(asked, reading.invalid_fields)
        self._asks += 1
        if fields != asked:
            self._fields = fields
            if self._asks < len(GPU_FIELDS) + len(OLDER_FIELD_NAMES):
                self._submit(self._ask)  # the same poll, asked again without the rejected field
                return
        self._keep_ps(reading)
        self._use(reading)
        self._end_round()

    def _known_ps(self) -> dict[int, PsRow]:
        """The `ps` rows a request may say it knows: those read less than PS_REFRESH_S ago (none
        while `fresh_ps`), each process's running time moved on by the rows' age."""
        if self.fresh_ps:
            return {}
        now = self._clock()
        return {pid: row if row.running_s is None else replace(row, running_s=row.running_s + max(0.0, now - at))
                for pid, (row, at) in self._ps.items() if now - at < PS_REFRESH_S}

    def _keep_ps(self, reading: Any) -> None:
        """Keep the `ps` rows of the processes this poll found: the known rows of those the
        request named, and (stamped now) what it read of the others; a pid `ps` did not find (a
        process in another container, or one that just ended) is kept as unknown, so it is not
        looked up at every poll. A pid gone from the GPUs is forgotten."""
        there = {proc.pid for gpu in reading.gpus for proc in gpu.processes}
        now = self._clock()
        kept = {}
        for pid in there:
            if pid in reading.ps:
                kept[pid] = (reading.ps[pid], now)
            elif pid in self._asked_ps and pid in self._ps:
                kept[pid] = self._ps[pid]
            else:
                kept[pid] = (PsRow(None, None), now)
        self._ps = kept

    def _failed(self, exc: Exception) -> None:
        """No usable answer (too long, or too late): the poll channel is closed, the connection kept."""
        start, t0 = self._round
        if isinstance(exc, CommandTimeout):
            message = f"no answer within {self.spec.command_timeout:g} s"
        else:
            message = f"{exc} (not nvidia-smi's answer?)"
        self.snapshot = self._snap(HostState.ERROR, message, start, time.perf_counter() - t0)
        self._end_round()

    def _broken(self, exc: Exception) -> None:
        """The poll channel failed before answering: this poll is made again by one command
        of its own, or the connection is found lost (in a pool worker, never the reader)."""
        self._loop_failures += 1
        self._submit(lambda: self._after_broken(exc))

    def _after_broken(self, exc: Exception) -> None:
        try:
            if self.connected and not self._closed:
                self._poll()
            elif not self._closed:
                start, t0 = self._round
                self._drop()
                failure = classify(exc, self.target, self.spec.connect_timeout, self.options.all_known_hosts())
                self._fail(replace(failure, reason=f"connection lost: {failure.reason}"), start, time.perf_counter() - t0)
        finally:
            self._end_round()

    # -- one command per poll -------------------------------------------------------------

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
        self._round = (start, t0)
        return self._use(reading)

    def _use(self, reading: Any) -> HostSnapshot:
        start, t0 = self._round
        self._backoff.reset()
        self.failure = None
        before = self._last_cpu if self._last_cpu is not None else reading.cpu_before
        cpu_pct = cpu_percent(before, reading.cpu_after, MIN_CPU_JIFFIES)
        if cpu_pct is None and before is not None and reading.cpu_after is not None and reading.cpu_after.total >= before.total:
            self._last_cpu, cpu_pct = before, self._last_pct  # too short to tell: the last value, the same start next time
        else:
            self._last_cpu, self._last_pct = reading.cpu_after or self._last_cpu, cpu_pct
        self.snapshot = self._snap(
            reading.state,
            reading.message,
            start,
            time.perf_counter() - t0,
            cpu_pct=cpu_pct,
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
    """Every remote host of a profile or of --host, polled concurrently: the blocking steps in
    two pools sized from this machine (see gputui.sources.sshloop.pool_sizes; `workers`
    overrides the poll pool's size), the answers read by one reader thread. `oneshot` polls
    by one command per poll, as before the poll channel (for comparisons)."""

    def __init__(self, specs: Sequence[HostSpec], options: SshOptions | None = None, clock: Callable[[], float] = time.monotonic,
                 workers: int | None = None, oneshot: bool = False) -> None:
        self.options = options or SshOptions()
        self.hosts = [SshHost(spec, self.options, clock) for spec in specs]
        poll_workers, connect_workers = pool_sizes(len(self.hosts))
        self.pool = Pool("gputui-ssh-poll", workers or poll_workers)
        self.connect_pool = Pool("gputui-ssh-connect", connect_workers)
        for host in self.hosts:
            host.oneshot = oneshot
            host.use_pools(self.pool.submit, self.connect_pool.submit)
        self.last_round_cpu_s: float | None = None  # this process's CPU time during the last round
        self.last_round_hosts = 0  # the hosts that round started a poll on

    def poll(self, settle: bool = False, wait: float | None = None) -> list[HostSnapshot]:
        """One round. Waits for the hosts that were connected (or, with `settle`, for every
        host, connecting included), at most `wait` seconds if given; each host's own
        timeouts bound the rest. A host still busy reports its latest snapshot."""
        cpu0 = time.process_time()
        waits = []
        started = 0
        for host in self.hosts:
            if host.busy:  # still at it since an earlier round: not waited for again
                if settle:
                    waits.append(host.done)
                continue
            if not host.due():  # backing off
                continue
            was_connected = host.connected
            event = host.start()
            started += 1
            if settle or was_connected:
                waits.append(event)
        deadline = None if wait is None else time.monotonic() + wait
        for event in waits:
            event.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        self.last_round_cpu_s = time.process_time() - cpu0
        self.last_round_hosts = started
        return [host.snapshot for host in self.hosts]

    def want_process_sm(self, on: bool) -> None:
        """A process table is shown: every poll reads each process's `ps` row (CPU %, RSS)
        instead of every PS_REFRESH_S."""
        for host in self.hosts:
            host.fresh_ps = on

    def close(self) -> None:
        for host in self.hosts:
            host.close()
        self.pool.close()
        self.connect_pool.close()
