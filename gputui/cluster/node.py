"""Runs on every node of a cluster run: torchrun under a supervisor that dies with its channel.

    python -m gputui.cluster.node [--spot-watcher] -- TORCHRUN-ARGS...

The master starts this over an SSH exec channel (or as a local subprocess for its own
node) and keeps the channel's stdin open. torchrun runs in its own process group; its
output (stderr merged) is relayed line by line to stdout, where the master reads rank 0's
events. When the master writes `stop`, when stdin reaches EOF (the master closed the channel
or died) or this process gets SIGTERM/SIGHUP, the whole tree (torchrun and its workers,
which torchrun puts in sessions of their own: gputui.model.supervisor) gets SIGTERM (workers
checkpoint), then SIGKILL after a grace period longer than torchrun's own (at once when the
master writes `kill` during a stop): nothing is left running on the node. With
`--spot-watcher`, gputui's spot-interruption watcher watches torchrun too.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

from gputui.model.supervisor import GRACE_S, Tree, become_subreaper
from gputui.train.distributed import _die_with_parent
from gputui.train.rdzv import LAUNCHER

NODE_TAG = "@@gputui-node "


def _watch_stdin(group: Tree, grace_s: float, stop: "Callable[[], None] | None" = None) -> None:
    """The master's words on stdin, one a line: `stop` stops the tree (SIGTERM, the grace, SIGKILL);
    `kill` drops the grace: SIGKILL now when a stop is under way (a further Ctrl-C), else SIGTERM
    and SIGKILL a second later (the group has checkpointed and only waits for peers that are
    gone). EOF (the master is gone or done with us) stops the tree. `stop`: how a stop is done
    (a program's: the stop file, a moment, then the tree's stop)."""
    from gputui.model.lines import LineSplitter

    stop = stop or (lambda: group.stop(grace_s))
    commands = LineSplitter(64)  # "stop" or "kill": a longer line is no command of the master's
    try:
        while True:
            data = os.read(0, 4096)
            if not data:
                break
            for line in commands.feed(data):
                if line.strip() == b"kill":
                    _in_thread(group.kill if group.stopping else lambda: group.stop(1.0))
                elif line.strip() == b"stop":
                    _in_thread(stop)
    except OSError:
        pass
    _in_thread(stop)


def _in_thread(work: "Callable[[], None]") -> None:
    threading.Thread(target=work, name="gputui-node-stop", daemon=True).start()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gputui.cluster.node")
    parser.add_argument("--spot-watcher", action="store_true", help="also run gputui's spot-interruption watcher")
    parser.add_argument("--grace", type=float, default=GRACE_S, help="seconds between SIGTERM and SIGKILL")
    parser.add_argument("--program-dir", default=None,
                        help="a run of the user's own program: the node's run directory (gputui.cluster.nodeprog)")
    parser.add_argument("torchrun", nargs=argparse.REMAINDER, help="-- then torchrun's arguments")
    args = parser.parse_args(argv)
    torchrun_args = args.torchrun[1:] if args.torchrun[:1] == ["--"] else args.torchrun
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    program_dir = args.program_dir
    if program_dir is not None:
        from gputui.cluster import nodeprog

        nodeprog.prepare_dir(program_dir)
        env = nodeprog.program_env(env, program_dir)
    become_subreaper()  # workers whose torchrun dies come back to this supervisor
    proc = subprocess.Popen(
        [sys.executable, "-m", LAUNCHER, *torchrun_args],  # torchrun with gputui's rendezvous
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
        preexec_fn=_die_with_parent,  # its own session; SIGTERM if this supervisor is killed
    )
    marker = torchrun_args[torchrun_args.index("--gputui-run-dir") + 1] if "--gputui-run-dir" in torchrun_args else None
    group = Tree(proc, marker, launcher=True)  # torchrun and its workers, each in a session of its own
    out: Any = sys.stdout.buffer
    if program_dir is None:
        stop = lambda: group.stop(args.grace)  # noqa: E731
        signalled = stop
    else:
        from gputui.cluster.nodeprog import LockedOut, ReportsRelay

        out = LockedOut(out)
        stop = _program_stop(group, args.grace, program_dir)
        signalled = _announced(out, stop)  # a spot notice or the budget guard: the master stops the others
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda _s, _f: _in_thread(signalled))
    threading.Thread(target=_watch_stdin, args=(group, args.grace, stop), name="gputui-node-stdin", daemon=True).start()
    watcher = None
    if args.spot_watcher:  # a program's notice goes through this supervisor (the stop file first)
        watched = os.getpid() if program_dir is not None else proc.pid
        watcher = subprocess.Popen([sys.executable, "-m", "gputui.cloud.watcher", "--pid", str(watched)],
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    reports = None
    if program_dir is not None:  # the program's reports, relayed as metrics lines beside its output
        reports = ReportsRelay(program_dir, out)
        reports.start()
        threading.Thread(target=_remember, args=(group,), name="gputui-node-tree", daemon=True).start()
    try:
        out.write((NODE_TAG + json.dumps({"pid": os.getpid(), "pgid": proc.pid, "host": os.uname().nodename,
                                          "watcher": watcher.pid if watcher else None}) + "\n").encode())
        out.flush()
        assert proc.stdout is not None
        relay(proc.stdout, out)
    except (BrokenPipeError, OSError):  # the channel is gone: stop the trainers
        group.stop(args.grace)
    code = proc.wait()
    if reports is not None:
        reports.finish()
    if watcher is not None and watcher.poll() is None:
        watcher.terminate()
        watcher.wait()
    group.kill()  # stragglers of the tree (none when torchrun cleaned up)
    return code if code >= 0 else 128 - code



def _program_stop(group: Tree, grace_s: float, run_dir: str) -> "Callable[[], None]":
    """A program's stop: the stop file (should_stop() turns True), a moment for the program to see
    it, then SIGTERM to the whole tree and SIGKILL after the grace ([run] stop_grace_s)."""
    from gputui.cluster.nodeprog import STOP_NOTICE_S, ask_to_stop

    def stop() -> None:
        ask_to_stop(run_dir)
        deadline = time.monotonic() + STOP_NOTICE_S
        while time.monotonic() < deadline and group.proc.poll() is None:
            time.sleep(0.05)
        group.stop(grace_s)

    return stop


def _announced(out: Any, stop: "Callable[[], None]") -> "Callable[[], None]":
    """`stop`, after a line telling the master that this node was asked to stop from here (a signal:
    the spot watcher, the budget guard), so that it stops the other nodes too."""
    def announced() -> None:
        try:
            out.write((NODE_TAG + json.dumps({"stopping": "signal"}) + "\n").encode())
        except (OSError, ValueError):
            pass
        stop()

    return announced


def _remember(group: Tree) -> None:
    """Look at the tree each second: a program's workers are remembered even when torchrun dies
    first (their command lines do not name the run directory)."""
    while group.proc.poll() is None:
        group.refresh()
        time.sleep(1.0)


def relay(source: Any, out: Any) -> None:
    """Copy `source`'s output to `out` line by line, as it comes, each line at most
    OUTPUT_LINE bytes (a longer one is cut with a marker): a rank that prints a huge line
    without a newline costs the node a bounded buffer, not its memory. A progress bar's redraw
    goes as its own segment, ended by its b"\r" (the master splits the same way): a bar that
    redraws itself for an hour is not one line cut at OUTPUT_LINE."""
    from gputui.model.lines import OUTPUT_LINE, LineSplitter, cut_marker

    lines = LineSplitter(OUTPUT_LINE, cut_marker(OUTPUT_LINE), redraws=True)
    while chunk := source.read1(1 << 16):
        done = lines.feed(chunk)
        if done:
            out.write(b"".join(_ended(line) for line in done))
            out.flush()
    tail = lines.finish()
    if tail:
        out.write(_ended(tail))
        out.flush()


def _ended(segment: bytes) -> bytes:
    return segment if segment.endswith(b"\r") else segment + b"\n"


if __name__ == "__main__":
    raise SystemExit(main())
