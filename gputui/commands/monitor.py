"""`gputui monitor`: a table (or JSON) of every host's GPUs: local, remote, simulated or replayed;
its process table (sorted, filtered), the profile's `[alerts]`, and a Prometheus endpoint."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from gputui.model.errors import UserError

DEFAULT_INTERVAL_S = 2.0
PIPE_WIDTH = 200  # the table's width off a terminal (a file, `| less`, CI) unless $COLUMNS says otherwise


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
    procs = p.add_argument_group("process table (implied by any of its flags)")
    procs.add_argument("--procs", action="store_true", help="list every compute process (with its SM %% on local GPUs)")
    procs.add_argument("--sort", choices=sorted(SORT_CHOICES), metavar="KEY",
                       help=f"sort processes by {', '.join(SORT_CHOICES)} (default memory; numbers largest first)")
    procs.add_argument("--reverse", action="store_true", help="reverse the sort order")
    procs.add_argument("--user", metavar="NAME", help="only the processes of this user")
    procs.add_argument("--command", dest="command_filter", metavar="TEXT", help="only processes whose command line contains TEXT")
    p.add_argument("--run", metavar="REF", help="watch this training run (run directory, run id, or last) for the alerts and --serve "
                   "(a run of your own program: its latest metrics too, as gputui_run_metric)")
    p.add_argument("--serve", metavar="[HOST:]PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics while polling (HOST default 127.0.0.1)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name --serve answers to (the name Prometheus scrapes it by), besides loopback names, "
                   "its address and, bound beyond loopback, IP addresses and this machine's name; repeatable")
    p.set_defaults(handler=cmd_monitor)


SORT_CHOICES = ("memory", "sm", "cpu", "rss", "time", "pid", "user", "host", "command")


def request_from(args: argparse.Namespace) -> Any:
    from gputui.monitor.polling import TelemetryRequest

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
    from gputui.monitor.polling import build_source, poll_round, round_exit_code

    if not args.interval > 0:
        raise UserError(f"--interval {args.interval:g}: expected a number of seconds > 0")
    if args.count is not None and args.count < 1:
        raise UserError(f"--count {args.count}: expected 1 or more rounds")
    if args.serve is not None and args.once:
        raise UserError("--serve keeps serving between rounds: drop --once (or add --count N)")
    procs = _process_view(args)
    listen = None
    if args.serve is not None:
        from gputui.monitor.exporter import parse_listen

        listen = parse_listen(args.serve)
    elif args.allow_host:
        raise UserError("--allow-host names a host the --serve endpoint answers to: add --serve [HOST:]PORT")
    watchers = _Watchers(args)
    source = build_source(request_from(args))
    if procs is not None:
        want = getattr(source, "want_process_sm", None)
        if want is not None:
            want(True)
    recorder = server = None
    if args.record is not None:
        from gputui.sources.replay import Recorder

        recorder = Recorder(args.record)
    view = _View(args.json, args.once, procs, interval=args.interval)
    code = 0
    rounds = 0
    previous = _stop_on_sigterm()
    try:
        if listen is not None:
            from gputui.monitor.exporter import ExportState, Server

            watchers.export = ExportState()
            server = Server(watchers.export, *listen, allow_hosts=tuple(args.allow_host))
            sys.stderr.write(f"gputui: {server.notice()}\n")
            sys.stderr.flush()
        while True:
            started = time.monotonic()
            now = time.time()
            hosts = poll_round(source, settle=args.once or rounds == 0, wait=None if args.once else args.interval)
            rounds += 1
            if recorder is not None:
                recorder.write(hosts, now)
            view.show(hosts, now)
            if not args.once:
                view.alerts(watchers.round(hosts, now))
            code = round_exit_code(hosts)
            if args.once or (args.count is not None and rounds >= args.count) or getattr(source, "finished", False):
                break
            time.sleep(max(0.0, args.interval - (time.monotonic() - started)))  # the next poll starts after this one
    except KeyboardInterrupt:
        pass
    finally:
        _restore_sigterm(previous)
        view.close()
        if server is not None:
            server.close()
        watchers.close()
        source.close()
        if recorder is not None:
            recorder.close()
    return code


def _stop_on_sigterm() -> Any:
    """SIGTERM ends the monitor as Ctrl-C does: the endpoint closes, queued alerts are delivered.
    Returns the handler it replaced (None off the main thread, where none is set)."""
    import signal
    import threading

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, stop)


def _restore_sigterm(previous: Any) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


class _ProcessView:
    """What --procs/--sort/--user/--command ask for."""

    def __init__(self, key: str, reverse: bool, user: str | None, command: str | None) -> None:
        self.key, self.reverse, self.user, self.command = key, reverse, user, command

    def rows(self, hosts: list[Any]) -> list[Any]:
        from gputui.monitor.processes import filter_rows, rows, sort_rows

        return sort_rows(filter_rows(rows(hosts), self.user, self.command), self.key, self.reverse)


def _process_view(args: argparse.Namespace) -> _ProcessView | None:
    asked = args.procs or args.sort or args.reverse or args.user is not None or args.command_filter is not None
    if not asked:
        return None
    return _ProcessView(args.sort or "memory", args.reverse, args.user, args.command_filter)


class _Watchers:
    """The profile's [alerts] and [cloud], the watched run (--run), and the exporter's state."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.export: Any = None
        self.engine: Any = None
        self.notifier: Any = None
        self.run: Any = None
        self.cloud: Any = None
        if args.run is not None:
            from gputui.monitor.watches import RunWatch, find_run

            self.run = RunWatch(find_run(args.run))
        if args.profile is not None and not (getattr(args, "sim", None) or getattr(args, "replay", None)):
            from gputui.monitor.alerts import AlertEngine, Notifier, alert_settings
            from gputui.config.profile import load_profile
            from gputui.monitor.watches import cloud_watch

            profile = load_profile(args.profile)
            settings = alert_settings(profile)
            if settings is not None:
                self.engine = AlertEngine(settings)
                self.notifier = Notifier(settings, report=_say)
            self.cloud = cloud_watch(args.profile, profile)

    def round(self, hosts: list[Any], now: float) -> list[Any]:
        """This round's alerts; the exporter gets the round."""
        run = self.run.poll() if self.run is not None else None
        cloud = None
        if self.cloud is not None:
            try:
                cloud = self.cloud.poll()
            except Exception as exc:  # noqa: BLE001 - the ledger is an extra: a line, not the end of the monitor
                _say(f"cost ledger: {exc}")
        alerts = self.engine.evaluate(hosts, now, run, cloud) if self.engine is not None else []
        if alerts and self.notifier is not None:
            self.notifier.send(alerts)
        if self.export is not None:
            self.export.update(hosts, now, run, cloud, self.engine.active if self.engine is not None else ())
        return alerts

    def close(self) -> None:
        if self.notifier is not None:
            self.notifier.close()


def _say(line: str) -> None:
    from gputui.model.text import clean

    sys.stderr.write(f"gputui: {clean(line, 300)}\n")
    sys.stderr.flush()


class _View:
    """JSON (a document, or a line per round), a live table on a terminal, or a table per round."""

    def __init__(self, as_json: bool, once: bool, procs: _ProcessView | None = None, interval: float = 1.0) -> None:
        self.as_json, self.once, self.procs, self.interval = as_json, once, procs, interval
        self._console: Any = None
        self._live: Any = None

    def show(self, hosts: list[Any], now: float) -> None:
        from dataclasses import replace

        from gputui.model.telemetry import round_to_dict
        from gputui.sources.ssh import without_retry

        if self.once:  # one round: nothing is retried, so no host says when it will be
            hosts = [replace(h, message=without_retry(h.message)) for h in hosts]

        if self.as_json:
            doc = round_to_dict(hosts, now)
            if self.procs is not None:
                doc["processes"] = [row.to_dict() for row in self.procs.rows(hosts)]
            text = json.dumps(doc, indent=2) if self.once else json.dumps(doc, separators=(",", ":"))
            sys.stdout.write(text + "\n")
            sys.stdout.flush()
            return
        from rich.console import Group

        from gputui.views.telemetry import HostsTable, ProcessesTable

        console = self._get_console()
        table: Any = HostsTable(hosts)  # laid out at the console's width, each time it is drawn
        if self.procs is not None:
            table = Group(table, ProcessesTable(self.procs.rows(hosts)))
        if self.once or not console.is_terminal:
            console.print(table)
            return
        from rich.text import Text

        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        header = Text(f"gputui monitor  {stamp}  every {self.interval:g} s  Ctrl-C quits", style="dim")
        table = Group(header, table)
        if self._live is None:
            from rich.live import Live

            self._live = Live(table, console=console, auto_refresh=False)
            self._live.start()
        self._live.update(table, refresh=True)

    def alerts(self, alerts: list[Any]) -> None:
        """One line per alert: `{"alert": ...}` in JSON, a line above the table otherwise."""
        if not alerts:
            return
        if self.as_json:
            from gputui.monitor.alerts import alert_document

            for alert in alerts:
                sys.stdout.write(json.dumps(alert_document(alert), separators=(",", ":"), default=str) + "\n")
            sys.stdout.flush()
            return
        from rich.text import Text

        console = self._get_console()
        for alert in alerts:
            style = "green" if alert.state == "cleared" else "bold red"
            console.print(Text.assemble((f"ALERT {alert.state}", style), " ", (alert.message, "")))

    def _get_console(self) -> Any:
        if self._console is None:
            from rich.console import Console

            from gputui.views.progress import table_width

            tty = sys.stdout.isatty()  # off a terminal an alert line is one line, however long
            self._console = Console(highlight=False, width=table_width(PIPE_WIDTH), soft_wrap=not tty)
        return self._console

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
