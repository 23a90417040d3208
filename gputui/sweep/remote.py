"""Sweep slots on SSH hosts: `trials_per_gpu` workers on every GPU of every `[[hosts]]` host of the
profile, one on a host without a GPU. Each host is bootstrapped as the cluster's slaves are
(gputui.cluster.bootstrap: this gputui as a wheel in a venv, the data set md5-checked), then each
worker is `<venv>/bin/python -m gputui worker` on its own channel of the host's one SSH connection,
its stdin and stdout the protocol's JSON lines (gputui.sweep.protocol).

A remote worker runs in the session sshd made for its channel: the shell says its pid (the
session's process group) on stderr before it execs the worker, so `kill` ends the whole group with
one more command. When the connection drops, the worker's output ends (the scheduler gives its
trial back) and the worker sees the end of its stdin and stops.

Messages are rewritten on their way out: a trial's run directory and data set are the host's own
(its `runs/sweep-NAME/trial-N` under the bootstrap directory, its copy of the data set).

A sweep of the user's own program: before its workers start, the host gets the program's code
once (gputui.sweep.hostcode: workdir synced to `runs/sweep-NAME/code`, `[run] setup` run), each
worker is `gputui worker --program`, and each trial's workdir is that code directory. A trial
whose worker dies has its checkpoint directory (`checkpoints/`, what `checkpoint_dir()` gives the
program) pulled back as the nets' `ckpt.pt` is (gputui.cluster.checkpoints: regular files only,
capped), and pushed to wherever the retry runs.
"""

from __future__ import annotations

import collections
import socket
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from gputui.model.errors import GputuiError, UserError
from gputui.model.lines import LineSplitter, cut_marker
from gputui.runs.store import CHECKPOINT, CHECKPOINTS, MAX_CHECKPOINT
from gputui.sweep import protocol
from gputui.sweep.base import WorkerGone
from gputui.sweep.hostcode import ProgramCode, Shipped, ship

READ_TIMEOUT_S = 5.0  # how often a silent channel checks its connection is still up
KILL_TIMEOUT_S = 10.0
EOF_SETTLE_S = 2.0  # after a worker's output ends: time for its exit status, or for a dropped connection to show
PID_TAG = "@@gputui-worker-pid "
WATCH_INTERVAL_S = 2.0  # a cloud worker's spot watcher polls the metadata service this often
_GPU_COUNT = "nvidia-smi --query-gpu=index --format=csv,noheader,nounits 2>/dev/null || true"


@dataclass
class RemoteHost:
    """A bootstrapped SSH host: its connection (shared by its workers' channels), where gputui is
    installed there, and its GPUs. `connect` makes the connection (again, after a drop)."""

    name: str
    connect: Callable[[], Any]  # -> gputui.cluster.sshnode.SlaveConnection, connected
    boot: Any  # gputui.cluster.bootstrap.Bootstrapped
    conn: Any
    gpus: int
    usd_per_hour: float = 0.0  # the whole host's rate (a cloud slave's), shared by its slots
    code: Shipped | None = None  # a program sweep's code on the host (None: the built-in nets)
    lock: threading.Lock = field(default_factory=threading.Lock)
    files: threading.Lock = field(default_factory=threading.Lock)  # one SFTP copy at a time on the connection
    closed: bool = False

    def transport(self) -> Any:
        """The live connection's transport: reconnected once when it dropped; GputuiError if it cannot be."""
        with self.lock:
            if self.closed:
                raise GputuiError(f"host {self.name}: the sweep is over")
            transport = self.conn.transport() if self.conn is not None else None
            if transport is None or not transport.is_active():
                if self.conn is not None:
                    self.conn.close()
                self.conn = self.connect()
                transport = self.conn.transport()
            return transport

    def run(self, command: str, timeout: float = KILL_TIMEOUT_S) -> None:
        """Run a short command, ignoring its failure (a kill of what is gone already)."""
        try:
            transport = self.conn.transport() if self.conn is not None else None
            if transport is None or not transport.is_active():
                return  # not reconnected for this: a dropped connection ended its workers
            channel = transport.open_session(timeout=timeout)
            try:
                channel.exec_command(command)
                channel.status_event.wait(timeout)
            finally:
                channel.close()
        except Exception:  # noqa: BLE001 - a host gone has nothing left to kill
            pass

    def close(self) -> None:
        with self.lock:
            self.closed = True
            if self.conn is not None:
                self.conn.close()


class SSHHandle:
    """A worker on an SSH host (the WorkerHandle Protocol over a paramiko channel)."""

    def __init__(self, host: RemoteHost, argv: Sequence[str], env: dict[str, str], sweep: str, slot: str,
                 before: str = "") -> None:
        """`before`: shell run first in the worker's session (a spot watcher started in the background)."""
        from gputui.cluster.sshnode import sh

        self.host, self.sweep, self.slot = host, sweep, slot
        self.pid: int | None = None
        self._remote_pid: int | None = None
        self._pid_known = threading.Event()
        self._tail: "collections.deque[str]" = collections.deque(maxlen=20)
        self._dropped: str | None = None
        self._no_status = False
        self._current: tuple[str, str] | None = None  # the running trial's run directory: here, there
        self.pulled: list[str] = []  # trial directories whose checkpoint came back after a death
        self.warnings: list[str] = []  # what went wrong beside the death (a checkpoint not pulled): said once each
        self._killed = False
        self._send_lock = threading.Lock()
        exports = [f"{k}={v}" for k, v in sorted(env.items())]
        command = (f"echo {sh(PID_TAG)}$$ >&2; {before}cd {sh(host.boot.base)} && exec "
                   + sh("env", *exports, *argv))
        try:
            transport = host.transport()
            self.channel = transport.open_session(timeout=30)
            self.channel.exec_command(command)
        except GputuiError:
            raise
        except Exception as exc:  # noqa: BLE001 - paramiko's SSHException, a dropped connection
            raise GputuiError(f"host {host.name}: cannot start a worker ({exc or type(exc).__name__})") from None
        self._stderr = threading.Thread(target=self._read_stderr, name=f"gputui-sweep-{slot}-err", daemon=True)
        self._stderr.start()

    # -- the Protocol ---------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        if message.get("op") == "trial":
            local = str(message.get("run_dir"))
            message = self._localise(message)
            if message.get("resume"):
                message["resume"] = self._push_checkpoint(local, str(message["run_dir"]))
            self._current = (local, str(message["run_dir"]))
        data = (protocol.encode(message) + "\n").encode()
        try:
            with self._send_lock:
                if self.channel.closed:
                    raise OSError("channel closed")
                self.channel.sendall(data)
        except Exception as exc:  # noqa: BLE001 - socket errors, paramiko's SSHException
            raise WorkerGone(f"host {self.host.name}: {exc or type(exc).__name__}") from None

    def lines(self) -> Iterator[str]:
        lines = LineSplitter(protocol.MAX_LINE)  # a torn, over-long line is dropped: not a message
        self.channel.settimeout(READ_TIMEOUT_S)
        while True:
            try:
                data = self.channel.recv(65536)
            except socket.timeout:
                if not self.channel.get_transport().is_active():
                    self._dropped = self._dropped or f"connection to host {self.host.name} lost"
                    return
                continue
            except Exception as exc:  # noqa: BLE001 - the connection died under the read
                self._dropped = self._dropped or f"connection to host {self.host.name} lost ({exc})"
                return
            if not data:
                if not self._killed:
                    self._after_eof()
                tail = lines.finish()
                if tail is not None and tail.strip():
                    yield tail.decode("utf-8", errors="replace")
                return
            for line in lines.feed(data):
                if b'"op":"result"' in line:
                    self._current = None  # the trial ended: nothing to pull back for it
                yield line.decode("utf-8", errors="replace") + "\n"

    def kill(self) -> None:
        """Kill the worker's process group on the host (when it is reachable), then drop the channel."""
        if self._killed:
            return
        self._killed = True
        self._pid_known.wait(0 if self.channel.closed else 2.0)
        if self._remote_pid is not None and not self.channel.exit_status_ready():
            from gputui.cluster.sshnode import sh

            self.host.run(sh("kill", "-KILL", "--", f"-{self._remote_pid}") + " 2>/dev/null; true")
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001
            pass

    def alive(self) -> bool:
        transport = self.channel.get_transport()
        return (not self.channel.closed and not self.channel.exit_status_ready()
                and transport is not None and transport.is_active())

    def exit_code(self) -> int | None:
        if self.channel.exit_status_ready():
            code = self.channel.recv_exit_status()
            return code if code >= 0 else None
        return None

    def last_words(self) -> str:
        lines = [line for line in self._tail if line.strip() and not line.startswith("gputui: note:")]
        if self._dropped:
            return self._dropped
        if lines:
            return lines[-1].strip()[:300]
        return "the worker ended without an exit status (killed by a signal?)" if self._no_status else ""

    # -- inside ---------------------------------------------------------------------------
    def _after_eof(self) -> None:
        """The worker's output ended: say why when no exit status came (a signal, or the host went).
        A dropped connection shows within a moment of the end of the output."""
        self._stderr.join(EOF_SETTLE_S)  # its last words (a spot watcher's notice) come before the channel's end
        self.channel.status_event.wait(EOF_SETTLE_S)
        self._pull_checkpoint()
        if self.channel.exit_status_ready() and self.channel.recv_exit_status() >= 0:
            return
        deadline = time.monotonic() + EOF_SETTLE_S
        while True:
            transport = self.channel.get_transport()
            if transport is None or not transport.is_active():
                self._dropped = f"connection to host {self.host.name} lost"
                return
            if time.monotonic() > deadline:
                self._no_status = True
                return
            time.sleep(0.05)

    def _read_stderr(self) -> None:
        lines = LineSplitter(4000, cut_marker(4000))  # the worker's stderr: a line past 4000 bytes is cut
        try:
            while True:
                try:
                    data = self.channel.recv_stderr(65536)
                except socket.timeout:  # the channel's timeout (set for stdout) applies here too
                    continue
                if not data:
                    break
                for raw in lines.feed(data):
                    line = raw.decode("utf-8", errors="replace")
                    if line.startswith(PID_TAG) and self._remote_pid is None:
                        pid = line[len(PID_TAG):].strip()
                        self._remote_pid = int(pid) if pid.isdigit() else None
                        self._pid_known.set()
                    else:
                        self._tail.append(line[:500])
        except Exception:  # noqa: BLE001 - the connection is gone: lines() says so
            pass
        finally:
            self._pid_known.set()

    def _pull_checkpoint(self) -> None:
        if self.host.code is not None:
            self._pull_program_checkpoint()
            return
        self._pull_net_checkpoint()

    def _dying_trial(self) -> tuple[str, str] | None:
        """The trial this worker was running as it died: its (local, remote) run directories; None
        when there was none, or the host is gone (nothing to pull)."""
        current, self._current = self._current, None
        transport = self.host.conn.transport() if self.host.conn is not None else None
        if current is None or transport is None or not transport.is_active():
            return None
        return current

    def _pull_net_checkpoint(self) -> None:
        """The worker died in a trial: copy the trial's checkpoint back to the master (the retry, on
        any slot, goes on from it). Nothing when the host is gone, or the trial had none yet. The
        host's file is data: only a regular file, at most MAX_CHECKPOINT bytes, is copied (a link
        to /dev/zero is refused, a file that keeps growing is cut); one that is refused is a
        warning, and the retry goes on from the checkpoint pulled before, if any, or from the start."""
        trial = self._dying_trial()
        if trial is None:
            return
        local, remote = trial
        try:
            Path(local).mkdir(parents=True, exist_ok=True)
            with self.host.files:
                if self.host.conn.get(f"{remote}/{CHECKPOINT}", Path(local) / CHECKPOINT, max_bytes=MAX_CHECKPOINT):
                    self.pulled.append(local)
        except Exception as exc:  # noqa: BLE001 - no checkpoint back: the retry goes on from an older one, or the start
            from gputui.model.text import clean

            kept = "the one pulled before" if (Path(local) / CHECKPOINT).is_file() else "none: it starts from the beginning"
            self.warnings.append(f"checkpoint of the trial in {remote} not pulled back from host {self.host.name} "
                                 f"({clean(str(exc) or type(exc).__name__, 300)}); the retry's checkpoint: {kept}")

    def _pull_program_checkpoint(self) -> None:
        """A program's trial died here: its checkpoint directory back to the master, as a net's
        `ckpt.pt` is (gputui.cluster.checkpoints.pull: regular files only, capped, into a temporary
        directory renamed into place; a refused one is a warning and the one before is kept)."""
        from gputui.cluster import checkpoints as ckpts

        trial = self._dying_trial()
        if trial is None:
            return
        local, remote = trial
        try:
            Path(local).mkdir(parents=True, exist_ok=True)
            with self.host.files:
                source = ckpts.RemoteSource(self.host.conn, f"{remote}/{CHECKPOINTS}")
                ckpts.pull(source, Path(local) / CHECKPOINTS, ckpts.Pulled())
            if _has_files(Path(local) / CHECKPOINTS):
                self.pulled.append(local)
        except Exception as exc:  # noqa: BLE001 - no checkpoint back: the retry goes on from an older one, or the start
            from gputui.model.text import clean

            self.warnings.append(f"checkpoint of the trial in {remote} not pulled back from host {self.host.name} "
                                 f"({clean(str(exc) or type(exc).__name__, 300)}); the retry's checkpoint: "
                                 f"{'the one pulled before' if _has_files(Path(local) / CHECKPOINTS) else 'none'}")

    def _push_checkpoint(self, local: str, remote: str) -> bool:
        """A retried trial's checkpoint (pulled back earlier) to its run directory on this host."""
        from gputui.cluster.sshnode import sh

        if self.host.code is not None:
            return self._push_program_checkpoint(local, remote)
        source = Path(local) / CHECKPOINT
        if not source.is_file():
            return False
        try:
            self.host.conn.check(f"mkdir -p {sh(remote)}", what="creating a trial's directory")
            with self.host.files:
                self.host.conn.put(source, f"{remote}/{CHECKPOINT}")
        except Exception:  # noqa: BLE001 - it starts from the beginning instead
            return False
        return True

    def _push_program_checkpoint(self, local: str, remote: str) -> bool:
        """A program's retried trial: the checkpoint directory pulled back earlier replaces the one
        in its run directory here; False when there is none (or it could not be sent)."""
        from gputui.cluster import checkpoints as ckpts
        from gputui.cluster.sshnode import sh

        source = Path(local) / CHECKPOINTS
        if not _has_files(source):
            return False
        try:
            self.host.conn.check(f"mkdir -p {sh(remote)}", what="creating a trial's directory")
            with self.host.files:
                return ckpts.push(self.host.conn, source, f"{remote}/{CHECKPOINTS}") > 0
        except Exception:  # noqa: BLE001 - it starts from the beginning instead
            return False

    def _localise(self, message: dict[str, Any]) -> dict[str, Any]:
        """A trial message as the host sees it: its run directory, its copy of the data set (a
        program's trial: its workdir is the sweep's code directory there)."""
        from gputui.config.profile import parse_profile

        number = protocol.integer(message.get("trial")) or 0
        out = dict(message)
        out["run_dir"] = f"{self.host.boot.base}/runs/sweep-{self.sweep}/trial-{number:05d}"
        try:
            cfg = parse_profile(str(message.get("profile", ""))).run.resolve()
            if self.host.code is not None:
                cfg = replace(cfg, workdir=self.host.code.code_dir)
            out["profile"] = replace(cfg, data=self.host.boot.data_dir).to_toml()
        except GputuiError:
            pass  # the worker reports the bad profile as the trial's error
        return out


def _has_files(path: Path) -> bool:
    try:
        return path.is_dir() and any(path.iterdir())
    except OSError:
        return False


@dataclass
class RemoteSlot:
    """One worker's place on a remote host: a GPU (cuda:N) or the host's CPU."""

    name: str
    device: str
    host: RemoteHost
    sweep: str
    threads: int | None
    usd_per_hour: float = 0.0
    spot_watcher: bool = False  # a cloud slave's: a spot interruption notice SIGTERMs the worker
    imds_url: str | None = None  # the metadata service the watcher polls (default: the cloud's)
    on_close: Callable[["RemoteSlot"], None] | None = None

    def spawn(self) -> SSHHandle:
        from gputui.cluster.sshnode import sh

        boot = self.host.boot
        argv = [boot.venv_python, "-m", "gputui", "worker", "--device", self.device]
        # a program's worker: no torch, no data set (its trials run in the sweep's code directory)
        argv += ["--program"] if self.host.code is not None else ["--data", boot.data_dir]
        env = {"GPUTUI_HOME": boot.home}
        if self.threads:
            argv += ["--threads", str(self.threads)]
            env["OMP_NUM_THREADS"] = str(self.threads)
        before = ""
        if self.spot_watcher:  # watches the shell's pid, which the worker's exec keeps
            watcher = ["env", f"GPUTUI_HOME={boot.home}", boot.venv_python, "-m", "gputui.cloud.watcher",
                       "--interval", str(WATCH_INTERVAL_S)] + (["--imds", self.imds_url] if self.imds_url else [])
            before = f"( {sh(*watcher)} --pid $$ </dev/null >/dev/null & ) ; "
        return SSHHandle(self.host, argv, env, self.sweep, self.name, before)

    def close(self) -> None:
        try:
            self.host.close()  # every slot of the host closes it: the first one does
        finally:  # the fleet counts its slots closed (the last one releases the slaves) whatever the host said
            if self.on_close is not None:
                self.on_close(self)


def remote_gpu_count(conn: Any) -> int:
    """GPUs nvidia-smi lists on the host (0 without a driver)."""
    out = conn.check(_GPU_COUNT, what="counting GPUs")
    return sum(1 for line in out.splitlines() if line.strip().isdigit())


def host_slots(host: RemoteHost, spec: Any, sweep: str) -> list[RemoteSlot]:
    """`trials_per_gpu` slots on each of the host's GPUs, or one on its CPU."""
    per = spec.trials_per_gpu
    rate = host.usd_per_hour
    if host.gpus:
        n = host.gpus * per
        return [RemoteSlot(f"{host.name}-cuda{g}-{k}", f"cuda:{g}", host, sweep, spec.threads, rate / n)
                for g in range(host.gpus) for k in range(per)]
    return [RemoteSlot(f"{host.name}-cpu", "cpu", host, sweep, spec.threads or 1, rate)]


def cluster_defaults(profile: Any) -> tuple[str, str]:
    """Where gputui goes on the hosts and their Python: the [cluster] table's, or its defaults."""
    from gputui.cluster.settings import CLUSTER_SECTION

    table = profile.tables.get("cluster") or {}
    fields = CLUSTER_SECTION.fields
    return (table.get("remote_dir", fields["remote_dir"].default), table.get("python", fields["python"].default))


def bootstrapper(profile: Any) -> Any:
    from gputui.cluster.bootstrap import Bootstrapper, local_dataset
    from gputui.cluster.wheel import build_wheel
    from gputui.model.paths import bundled_mnist

    remote_dir, python = cluster_defaults(profile)
    data = Path(profile.run.data) if profile.run.data else bundled_mnist()
    return Bootstrapper(remote_dir, python, build_wheel(), local_dataset(data))


def prepare_host(name: str, connect: Callable[[], Any], boot: Any, usd_per_hour: float = 0.0,
                 code: ProgramCode | None = None, sweep: str = "") -> RemoteHost:
    """Connect, bootstrap and count the GPUs of one host; a program sweep's `code` is sent to it
    (once: its workers share it) and `[run] setup` run there."""
    conn = connect()
    try:
        booted = boot.bootstrap(conn)
        gpus = remote_gpu_count(conn)
        shipped = ship(conn, booted, code, sweep) if code is not None else None
    except BaseException:
        conn.close()
        raise
    return RemoteHost(name, connect, booted, conn, gpus, usd_per_hour, shipped)


def remote_slots(profile: Any, spec: Any, code: ProgramCode | None = None) -> list[RemoteSlot]:
    """The slots of every `[[hosts]]` host of the profile (hosts in parallel); [] without hosts.
    A host that cannot be reached or bootstrapped stops the sweep before it starts (one line).
    `code`: a program sweep's (gputui.sweep.hostcode.program_code), sent to each host first."""
    from gputui.cluster.bringup import in_parallel
    from gputui.cluster.sshnode import SlaveConnection
    from gputui.sources.hostspecs import hosts_from_profile

    specs = hosts_from_profile(profile)
    if not specs:
        return []
    boot = bootstrapper(profile)

    def one(host_spec: Any) -> RemoteHost:
        return prepare_host(host_spec.name, lambda: SlaveConnection(host_spec).open_or_raise(), boot,
                            code=code, sweep=spec.name)

    try:
        hosts = in_parallel(one, specs, lambda h: h.close())
    except UserError:
        raise
    except GputuiError as exc:
        raise UserError(f"sweep {spec.name}: {exc}; fix the host or take it out of [[hosts]]") from None
    return [slot for host in hosts for slot in host_slots(host, spec, spec.name)]
