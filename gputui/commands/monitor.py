"""`gputui monitor`: a table (or JSON) of every host's GPUs: local, remote, simulated or replayed."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gputui.errors import UserError

DEFAULT_INTERVAL_S = 2.0


def add_source_flags(parser: argparse.ArgumentParser) -> None:
    """Flags choosing the hosts (shared with `gputui doctor`)."""
    parser.add_argument("--profile", type=Path, help="profile whose [[hosts]] tables name remote hosts")
    parser.add_argument("--host", action="append", default=[], metavar="[USER@]ADDR[:PORT]", help="a remote host over SSH (repeatable)")
    parser.add_argument("-i", "--identity", type=Path, metavar="FILE", help="private key for the --host hosts (default: ssh-agent, ~/.ssh/config, ~/.ssh/id_*)")
    parser.add_argument("--trust-on-first-use", action="store_true", help="accept and record unknown host keys (default: refuse them)")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "monitor",
        help="watch GPUs: local (NVML), remote (SSH), simulated or replayed",
        description="Poll the local GPUs and remote hosts; print a table (or JSON) each round.",
    )
    add_source_flags(p)
    p.add_argument("--once", action="store_true", help="print one round and exit")
    p.add_argument("--json", action="store_true", help="JSON: one document with --once, else one line per round")
    p.add_argument("--interval", type=float, default=DEFAULT_INTERVAL_S, metavar="S", help=f"seconds between rounds (default {DEFAULT_INTERVAL_S:g})")
    p.add_argument("--count", type=int, metavar="N", help="stop after N rounds")
    p.add_argument("--no-local", action="store_true", help="leave out this machine's GPUs")
    p.add_argument("--sim", type=int, metavar="N", help="simulated source: N hosts instead of the real ones")
    p.add_argument("--sim-gpus", type=int, default=4, metavar="M", help="GPUs per simulated host (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the simulation")
    p.add_argument("--replay", type=Path, metavar="FILE", help="play back a recording (JSON lines) instead of polling")
    p.add_argument("--record", type=Path, metavar="FILE", help="also write every round to FILE as JSON lines")
    p.set_defaults(handler=cmd_monitor)


def request_from(args: argparse.Namespace) -> Any:
    from gputui.monitoring import TelemetryRequest

    return TelemetryRequest(
        profile=args.profile,
        hosts=tuple(args.host),
        identity=args.identity,
        trust_on_first_use=args.trust_on_first_use,
        local=not getattr(args, "no_local", False),
        sim=getattr(args, "sim", None),
        sim_gpus=getattr(args, "sim_gpus", 4),
        seed=getattr(args, "seed", 0),
        replay=getattr(args, "replay", None),
    )


def cmd_monitor(args: argparse.Namespace) -> int:
    from gputui.monitoring import build_source, poll_round, round_exit_code

    if not args.interval > 0:
        raise UserError(f"--interval {args.interval:g}: expected a number of seconds > 0")
    if args.count is not None and args.count < 1:
        raise UserError(f"--count {args.count}: expected 1 or more rounds")
    source = build_source(request_from(args))
    recorder = None
    if args.record is not None:
        from gputui.sources.replay import Recorder

        recorder = Recorder(args.record)
    view = _View(args.json, args.once)
    code = 0
    rounds = 0
    try:
        while True:
            started = time.monotonic()
            now = time.time()
            hosts = poll_round(source, settle=args.once or rounds == 0, wait=None if args.once else args.interval)
            rounds += 1
            if recorder is not None:
                recorder.write(hosts, now)
            view.show(hosts, now)
            code = round_exit_code(hosts)
            if args.once or (args.count is not None and rounds >= args.count) or getattr(source, "finished", False):
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))  # the next poll starts after this one
    except KeyboardInterrupt:
        pass
    finally:
        view.close()
        source.close()
        if recorder is not None:
            recorder.close()
    return code


class _View:
    """JSON (a document, or a line per round), a live table on a terminal, or a table per round."""

    def __init__(self, as_json: bool, once: bool) -> None:
        self.as_json, self.once = as_json, once
        self._console: Any = None
        self._live: Any = None

    def show(self, hosts: list[Any], now: float) -> None:
        from gputui.model.telemetry import round_to_dict

        if self.as_json:
            doc = round_to_dict(hosts, now)
            text = json.dumps(doc, indent=2) if self.once else json.dumps(doc, separators=(",", ":"))
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            return
        from rich.console import Console

        from gputui.telemetry_view import hosts_table

        if self._console is None:
            tty = sys.stdout.isatty()
            self._console = Console(highlight=False, width=None if tty else 200)
        table = hosts_table(hosts)
        if self.once or not self._console.is_terminal:
            self._console.print(table)
            return
        if self._live is None:
            from rich.live import Live

            self._live = Live(table, console=self._console, auto_refresh=False)
            self._live.start()
        self._live.update(table, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
