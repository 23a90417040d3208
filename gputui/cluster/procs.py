"""The master's handle on one node's torchrun: a local subprocess or an SSH exec channel.

Both run `python -m gputui.cluster.node -- TORCHRUN-ARGS` (torchrun: gputui.train.launch) and feed every output line, then
the exit code, into one queue read by the master. `stop()` writes `stop` to the node's
supervisor (it SIGTERMs torchrun: the workers checkpoint); `stop(now=True)` writes `kill`
(SIGKILL now during a stop, else a second after SIGTERM); `kill()` drops the node outright:
the master's own node with its whole process tree (gputui.model.supervisor), a slave's by closing
its channel (its supervisor then stops what is left there).
"""

from __future__ import annotations

import io
import os
import queue
import subprocess
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from gputui.cluster.sshnode import SlaveConnection, sh
from gputui.model.lines import OUTPUT_LINE, LineSplitter, cut_marker

# (node name, "line" | "exit", text or exit code)
Item = tuple[str, str, Any]
MAX_LINE = OUTPUT_LINE  # a node's output line past this is cut (with a marker): a log line, not a dump
READ_CHUNK = 1 << 16


@dataclass(frozen=True)
class Rendezvous:
    """Where and how the nodes of one attempt meet: gputui's static rendezvous (gputui.train.launch).

    The attempt's nodes are fixed: node `rank` of `nnodes` is given here by the master (torch's
    elastic c10d rendezvous, which unpickles what it reads from the store, is never used; the
    master itself relaunches an attempt with the nodes that are left). Every key in the store
    lives under `token`, which reaches a node through its environment or a 0600 file, never a
    command line."""

    endpoint: str  # host:port of the store the master serves
    rdzv_id: str
    nnodes: int  # the attempt's nodes, each with its rank
    min_nodes: int  # the fewest nodes the run goes on with (shown in the `cluster` event)
    nproc_per_node: int
    max_restarts: int
    join_timeout: float
    token: str = field(default="", repr=False)
    env: Mapping[str, str] = field(default_factory=dict)

    def torchrun_args(self, node_rank: int, local_addr: str, run_dir: str, node: str, endpoint: str | None = None,
                      resume: str | None = None) -> list[str]:
        """torchrun's arguments for node `node_rank`; `endpoint`: where that node reaches the store
        (its tunnel); `resume`: the checkpoint the workers resume from (without it they start at step 0)."""
        from gputui.train.rdzv import BACKEND

        conf = f"rank={node_rank},timeout={max(1, int(self.join_timeout))}"
        return [
            f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}",
            f"--rdzv-backend={BACKEND}", f"--rdzv-endpoint={endpoint or self.endpoint}", f"--rdzv-id={self.rdzv_id}",
            f"--rdzv-conf={conf}", f"--local-addr={local_addr}", f"--max-restarts={self.max_restarts}",
            "--monitor-interval=0.5",
            "-m", "gputui.cluster.worker", "--gputui-run-dir", run_dir, "--gputui-node", node,
            *(["--gputui-resume", resume] if resume is not None else []),
        ]


    def program_args(self, node_rank: int, local_addr: str, endpoint: str, command: Sequence[str]) -> list[str]:
        """The launcher's arguments for node `node_rank` of a run of the user's own program: the
        same static rendezvous, torchrun's own restarts off (the master relaunches), then
        `--no-python PROGRAM ARGS` (the program's `python` is the node's gputui venv, first on PATH)."""
        from gputui.train.rdzv import BACKEND

        conf = f"rank={node_rank},timeout={max(1, int(self.join_timeout))}"
        return [
            f"--nnodes={self.nnodes}", f"--nproc-per-node={self.nproc_per_node}",
            f"--rdzv-backend={BACKEND}", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={self.rdzv_id}",
            f"--rdzv-conf={conf}", f"--local-addr={local_addr}", "--max-restarts=0", "--monitor-interval=0.5",
            "--no-python", *command,
        ]


class NodeProc:
    """A running node; subclasses start it and feed `items`."""

    def __init__(self, name: str, items: "queue.Queue[Item]") -> None:
        self.name = name
        self.items = items
        self.tail: deque[str] = deque(maxlen=40)
        self.exit_code: int | None = None
        self.log_path: Path | None = None
        self.lines = LineSplitter(MAX_LINE, cut_marker(MAX_LINE))  # the output reader's (its counts)

    def _emit_line(self, line: str) -> None:
        self.items.put((self.name, "line", line))

    def _pump(self, recv: Callable[[int], bytes]) -> None:
        """Every line of the node's output, read with `recv` until it returns b"" (the end): split
        as each chunk comes (only the new bytes are searched), a line cut at MAX_LINE bytes. A
        progress bar's redraw is a line of its own that keeps its "\r" (see `Node.keep_output`)."""
        lines = self.lines = LineSplitter(MAX_LINE, cut_marker(MAX_LINE), redraws=True)
        while data := recv(READ_CHUNK):
            for raw in lines.feed(data):
                self._emit_line(raw.decode("utf-8", errors="replace"))
        tail = lines.finish()
        if tail:
            self._emit_line(tail.decode("utf-8", errors="replace"))

    def last_error(self) -> str:
        lines = [ln for ln in self.tail if ln.strip()]
        errors = [ln for ln in lines if "Error" in ln or "error" in ln]
        return (errors or lines or ["no output"])[-1].strip()[:200]

    def stop(self, now: bool = False) -> None:
        """SIGTERM the node's torchrun (workers checkpoint), SIGKILL after the grace or, with `now`, at once."""
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError


class LocalNode(NodeProc):
    """The master's own node: the supervisor as a child process (it dies with the master)."""

    def __init__(self, name: str, items: "queue.Queue[Item]", args: Sequence[str], env: Mapping[str, str], grace_s: float,
                 flags: Sequence[str] = (), cwd: str | None = None) -> None:
        super().__init__(name, items)
        from gputui.model.supervisor import Tree
        from gputui.train.distributed import _die_with_parent
        from gputui.train.rdzv import clean_env

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gputui.cluster.node", "--grace", repr(grace_s), *flags, "--", *args],
            cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env={**clean_env(os.environ), **env, "PYTHONUNBUFFERED": "1"}, preexec_fn=_die_with_parent,
        )
        self.tree = Tree(self.proc)
        threading.Thread(target=self._read, name=f"gputui-node-{name}", daemon=True).start()

    def _read(self) -> None:
        stdout = self.proc.stdout
        assert isinstance(stdout, io.BufferedReader)  # a buffered pipe (Popen's default bufsize)
        self._pump(stdout.read1)  # what is there now (readline would hold a line of any length whole)
        self.exit_code = self.proc.wait()
        self.items.put((self.name, "exit", self.exit_code))

    def stop(self, now: bool = False) -> None:
        stdin = self.proc.stdin
        try:
            if stdin is not None and not stdin.closed:
                stdin.write(b"kill\n" if now else b"stop\n")
                stdin.flush()
                return
        except OSError:  # the supervisor is gone already
            pass
        if now:
            self.kill()

    def kill(self) -> None:
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        except OSError:
            pass
        if self.proc.poll() is None:
            self.tree.kill()


class RemoteNode(NodeProc):
    """A slave's node over an SSH exec channel; closing the channel stops it there."""

    def __init__(self, name: str, items: "queue.Queue[Item]", conn: SlaveConnection, venv_python: str, cwd: str,
                 args: Sequence[str], env: Mapping[str, str], grace_s: float, spot_watcher: bool,
                 extra_flags: Sequence[str] = ()) -> None:
        super().__init__(name, items)
        self.conn = conn
        exports = [f"{k}={v}" for k, v in {**env, "PYTHONUNBUFFERED": "1"}.items()]
        flags = ["--grace", repr(grace_s), *extra_flags] + (["--spot-watcher"] if spot_watcher else [])
        command = f"cd {sh(cwd)} && exec " + sh("env", *exports, venv_python, "-m", "gputui.cluster.node", *flags, "--", *args)
        self.channel = conn.open(command)
        threading.Thread(target=self._read, name=f"gputui-node-{name}", daemon=True).start()

    def _read(self) -> None:
        try:
            self._pump(self.channel.recv)
            self.exit_code = self.channel.recv_exit_status() if self.channel.status_event.wait(10) else -1
        except Exception:  # noqa: BLE001 - a dead connection is an exit like any other
            self.exit_code = -1
        self.items.put((self.name, "exit", self.exit_code))

    def stop(self, now: bool = False) -> None:
        try:
            self.channel.sendall(b"kill\n" if now else b"stop\n")
        except Exception:  # noqa: BLE001 - the channel is gone: nothing to stop through it
            if now:
                self.kill()

    def kill(self) -> None:
        try:
            self.channel.close()
        except Exception:  # noqa: BLE001
            pass
