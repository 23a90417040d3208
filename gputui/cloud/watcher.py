"""The spot interruption watcher that runs on each slave, next to the training process.

It polls the instance metadata service (IMDSv2: a session token, then
`spot/instance-action`) every 5 s; when a notice appears, it sends SIGTERM to the
training process, which checkpoints and stops inside the two-minute warning.

    python -m gputui.cloud.watcher --pid N      (or: gputui cloud watch --pid N)
    python -m gputui.cloud.watcher --checkpoint-all

Watched processes are registered under the user data directory, so `--checkpoint-all`
(what the master's budget guard runs over SSH) can ask every run on the slave to
checkpoint. Only the standard library is used: the slave needs nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from gputui.model import outside
from gputui.model.paths import data_home, private_dir
from gputui.model.pids import process_alive, process_start

IMDS_URL = "http://169.254.169.254"
TOKEN_TTL_S = 21600


class Imds:
    """A minimal IMDSv2 client (never through a proxy: the service is link-local)."""

    def __init__(self, base_url: str = IMDS_URL, timeout_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.clock = clock
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        self._token: str | None = None
        self._token_expires = 0.0

    def token(self, fresh: bool = False) -> str:
        """A session token, renewed a minute before it expires."""
        if fresh or self._token is None or self.clock() >= self._token_expires:
            request = urllib.request.Request(f"{self.base_url}/latest/api/token", method="PUT",
                                             headers={"X-aws-ec2-metadata-token-ttl-seconds": str(TOKEN_TTL_S)})
            with self._opener.open(request, timeout=self.timeout_s) as reply:
                self._token = reply.read().decode().strip()
            self._token_expires = self.clock() + TOKEN_TTL_S - 60
        return self._token

    def get(self, path: str) -> str | None:
        """The text at `path` under /latest/meta-data/, or None on 404."""
        for attempt in (0, 1):
            request = urllib.request.Request(f"{self.base_url}/latest/meta-data/{path}",
                                             headers={"X-aws-ec2-metadata-token": self.token(fresh=attempt > 0)})
            try:
                with self._opener.open(request, timeout=self.timeout_s) as reply:
                    return str(reply.read().decode())
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                if exc.code != 401 or attempt:
                    raise
        return None  # pragma: no cover

    def instance_action(self) -> dict[str, Any] | None:
        """The spot interruption notice ({"action": "terminate", "time": ...}) or None."""
        text = self.get("spot/instance-action")
        if text is None:
            return None
        try:
            notice = outside.parse(text)  # the metadata service's answer is data
        except outside.Refused:
            return {"action": "unknown", "raw": text[:200]}
        return notice if isinstance(notice, dict) else {"action": str(notice)}


def registry() -> Path:
    return data_home() / "watched"


def register(pid: int) -> Path:
    path = private_dir(registry()) / str(pid)  # 0700: which processes this account watches is its own
    path.write_text(process_start(pid) or "", encoding="ascii")
    return path


def _signal(pid: int) -> bool:
    """SIGTERM `pid`; False when it ended meanwhile (or its number went to another account's)."""
    try:
        os.kill(pid, signal.SIGTERM)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def checkpoint_all(say: Callable[[str], None] = lambda m: None) -> list[int]:
    """SIGTERM every registered run that is still the process it was; returns their pids. An
    entry that is no pid, cannot be read, or names a process that is gone or another is dropped."""
    sent = []
    for entry in sorted(registry().glob("*")) if registry().is_dir() else []:
        try:
            pid = int(entry.name)
        except ValueError:
            continue
        try:
            recorded: str | None = entry.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):  # a directory, a garbled file: not one we wrote
            recorded = None
        if recorded is None or not process_alive(pid) or (recorded and recorded != process_start(pid)) \
                or not _signal(pid):
            try:
                entry.unlink(missing_ok=True)
            except OSError:
                pass  # a directory planted there: not ours to remove, and never signalled
            continue
        say(f"gputui watcher: sent SIGTERM to {pid} (checkpoint requested)")
        sent.append(pid)
    return sent


def watch(pid: int, imds: Imds, interval_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
          say: Callable[[str], None] = lambda m: None) -> dict[str, Any] | None:
    """Poll for a notice while `pid` lives; on one, SIGTERM `pid` and return the notice."""
    entry = register(pid)
    unreachable = False
    try:
        while process_alive(pid):
            try:
                notice = imds.instance_action()
            except (OSError, ValueError) as exc:
                if not unreachable:
                    say(f"gputui watcher: instance metadata not reachable ({exc}); still trying every {interval_s:g} s")
                unreachable, notice = True, None
            if notice is not None:
                sent = "sent SIGTERM to" if _signal(pid) else "no SIGTERM: it had already ended,"
                say(f"gputui watcher: spot interruption notice {json.dumps(notice)}; {sent} {pid}")
                return notice
            sleep(interval_s)
        return None
    finally:
        entry.unlink(missing_ok=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gputui.cloud.watcher",
                                     description="Watch for a spot interruption notice and SIGTERM the training process.")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--pid", type=int, help="the training process to signal")
    what.add_argument("--checkpoint-all", action="store_true", help="SIGTERM every watched process now")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between polls (default 5)")
    parser.add_argument("--imds", default=os.environ.get("GPUTUI_IMDS_URL", IMDS_URL), help="metadata service URL")
    args = parser.parse_args(argv)
    return run(args)


def run(args: argparse.Namespace) -> int:
    """Shared by `python -m gputui.cloud.watcher` and `gputui cloud watch`."""
    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.checkpoint_all:
        checkpoint_all(say)
        return 0
    if args.pid <= 0 or not process_alive(args.pid):
        say(f"gputui watcher: no process {args.pid}")
        return 2
    if not args.interval > 0:
        say("gputui watcher: --interval must be > 0")
        return 2
    watch(args.pid, Imds(args.imds), args.interval, say=say)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
