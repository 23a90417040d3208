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
from gputui.monitor.lab import SORT_KEYS  # standard library and gputui.config only: --help stays light

DEFAULT_INTERVAL_S = 2.0
DEFAULT_LINES = 50  # off a terminal, more GPU rows than $LINES (default this) print the lab view
VIEWS = ("auto", "gpus", "hosts")
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
    p.add_argument("--count", type=int, metavar="N", help="stop after N rounds (with --free: how many GPUs are wanted)")
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
    lab = p.add_argument_group("lab view: one line per host (implied by its flags)")
    lab.add_argument("--view", choices=VIEWS, default="auto",
                     help="gpus: a row per GPU; hosts: a line per host (GPUs as a strip, free ones counted); auto "
                     f"(default): hosts when the GPU rows do not fit the terminal (off one: $LINES, default {DEFAULT_LINES})")
    lab.add_argument("--hosts-sort", choices=SORT_KEYS, metavar="KEY",
                     help=f"order of the host lines: {', '.join(SORT_KEYS)} (default name; numbers largest first; "
                     "unreachable hosts last)")
    lab.add_argument("--filter", dest="hosts_filter", metavar="TEXT",
                     help="only the hosts that match every word of TEXT: part of the name, user:NAME (a process of "
                     "that account runs there), free (a free GPU), down (does not answer)")
    p.add_argument("--users", action="store_true",
                   help="per account across the hosts: GPUs held, GPU memory, GPU-hours today (counted from this "
                   "monitor's start, or local midnight), hosts, processes; with --json a document per round")
    free = p.add_argument_group("free GPUs: one round, then exit (free = the profile's [free] table; default: no "
                                "compute process, utilisation <= 10%, memory in use <= 1024 MiB)")
    free.add_argument("--free", action="store_true",
                      help="print the free GPUs as HOST:INDEX lines, least used first (--json: a list); exit 1 when "
                      "fewer than --count N (default 1) are free")
    free.add_argument("--min-memory", type=float, metavar="GIB", help="with --free: only GPUs with this much memory free")
    free.add_argument("--local", action="store_true",
                      help="with --free: this machine's GPUs only, as an index list for CUDA_VISIBLE_DEVICES (e.g. 0,3; "
                      "NVML's order: set CUDA_DEVICE_ORDER=PCI_BUS_ID)")
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
        raise UserError(f"--count {args.count}: expected 1 or more {'GPUs' if args.free else 'rounds'}")
    if args.serve is not None and args.once:
        raise UserError("--serve keeps serving between rounds: drop --once (or add --count N)")
    _check_views(args)
    if args.free:
        return cmd_free(args)
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
    view = _View(args, procs, rule=_rule(args))
    code = 0
    rounds = 0
    if not args.once:
        from gputui.model import heap

        heap.for_polling()
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


def _check_views(args: argparse.Namespace) -> None:
    """Flags that do not go together (exit 2, one line)."""
    lab = args.view != "auto" or args.hosts_sort is not None or args.hosts_filter is not None
    if not args.free:
        given = [flag for flag, on in (("--min-memory", args.min_memory is not None), ("--local", args.local)) if on]
        if given:
            raise UserError(f"{' and '.join(given)} go{'es' if len(given) == 1 else ''} with --free: add --free")
    if args.free or args.users:
        what = "--free" if args.free else "--users"
        procs = args.procs or args.sort or args.reverse or args.user is not None or args.command_filter is not None
        clash = [flag for flag, on in (("--users", args.free and args.users), ("--serve", args.serve is not None),
                                       ("the lab view's flags (--view, --hosts-sort, --filter)", lab),
                                       ("the process table's flags", procs)) if on]
        if clash:
            raise UserError(f"{what} prints its own view: drop {', '.join(clash)}")
    if args.view == "gpus" and (args.hosts_sort is not None or args.hosts_filter is not None):
        raise UserError("--hosts-sort and --filter order and choose host lines: drop --view gpus")
    if args.json and lab:
        raise UserError("--json prints every host: drop --view, --hosts-sort and --filter")
    if args.free and args.min_memory is not None and not args.min_memory >= 0:
        raise UserError(f"--min-memory {args.min_memory:g}: expected GiB >= 0")
    if args.free and args.local and (args.no_local or args.sim is not None or args.replay is not None or args.host):
        raise UserError("--local is this machine's GPUs: drop --no-local, --sim, --replay and --host")


def _rule(args: argparse.Namespace) -> Any:
    """The profile's [free] rule (the defaults without a profile)."""
    from gputui.monitor.lab import free_rule

    if args.profile is None or args.sim is not None or args.replay is not None:
        return free_rule(None)
    from gputui.config.profile import load_profile

    return free_rule(load_profile(args.profile))


def _lab_options(args: argparse.Namespace) -> Any:
    from gputui.monitor.lab import LabFilter
    from gputui.views.lab import LabOptions

    text = getattr(args, "hosts_filter", None)
    wanted = LabFilter.parse(text) if text is not None and text.strip() else None
    return LabOptions(getattr(args, "hosts_sort", None) or "name", wanted)


def _pipe_lines() -> int:
    """How many lines the GPU table may take off a terminal before the lab view replaces it."""
    import os

    lines = os.environ.get("LINES", "").strip()
    return int(lines) if lines.isdigit() and int(lines) > 0 else DEFAULT_LINES


def cmd_free(args: argparse.Namespace) -> int:
    """`gputui monitor --free`: one round (settled), the free GPUs least used first."""
    from gputui.monitor.lab import free_gpus
    from gputui.monitor.polling import TelemetryRequest, build_source, poll_round

    want = 1 if args.count is None else args.count
    rule = _rule(args)
    request = TelemetryRequest(local=True) if args.local else request_from(args)
    source = build_source(request)
    try:
        hosts = poll_round(source, settle=True, wait=None)
    finally:
        source.close()
    if args.local:
        hosts = [h for h in hosts if h.kind == "local"]
    min_mib = None if args.min_memory is None else args.min_memory * 1024.0
    found = free_gpus(hosts, rule, min_mib)
    down = [h.name for h in hosts if not h.state.worked]
    if down and not args.local:
        from gputui.model.units import plural

        names = ", ".join(down[:5]) + (", ..." if len(down) > 5 else "")
        _say(f"{plural(len(down), 'host')} did not answer ({names}): {'its' if len(down) == 1 else 'their'} GPUs are "
             "not counted")
    if len(found) < want:
        what = "no GPU is free" if not found else f"only {len(found)} of the {want} GPUs wanted are free"
        if args.local and not any(h.gpus for h in hosts):
            why = next((h.message for h in hosts if h.message), None) or "no GPU found"
            what = f"no GPU is free on this machine: {why}"
        memory = f", {args.min_memory:g} GiB of memory free" if args.min_memory is not None else ""
        _say(f"{what} (free: {rule.describe()}{memory}; the profile's [free] table sets it)")
        return 1
    chosen = found[:want] if args.count is not None else found
    if args.json:
        doc = [{"host": f.host, "index": f.gpu.index, "uuid": f.gpu.uuid, "mem_used_mib": f.gpu.mem_used_mib,
                "mem_total_mib": f.gpu.mem_total_mib, "util_pct": f.gpu.util_pct} for f in chosen]
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    elif args.local:
        sys.stdout.write(",".join(str(i) for i in sorted(f.gpu.index for f in chosen)) + "\n")
    else:
        from gputui.model.text import clean

        sys.stdout.write("".join(f"{clean(f.host, 200)}:{f.gpu.index}\n" for f in chosen))
    sys.stdout.flush()
    return 0


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
    """What each round prints: JSON (a document, or a line per round), the per-account table
    (--users), or the hosts: the GPU table, or the lab view (a line per host) when the GPU rows do
    not fit; a live view on a terminal, plain text per round off one. Off a terminal a --serve
    monitor prints nothing unless a view is asked for (its metrics are the output)."""

    def __init__(self, args: argparse.Namespace, procs: _ProcessView | None = None, rule: Any = None) -> None:
        self.as_json, self.once, self.procs = args.json, args.once, procs
        self.interval = args.interval
        self.users = getattr(args, "users", False)
        self.mode = getattr(args, "view", "auto")
        if self.mode == "auto" and (getattr(args, "hosts_sort", None) or getattr(args, "hosts_filter", None) is not None):
            self.mode = "hosts"  # the lab view's flags ask for it
        self.quiet = (args.serve is not None and not args.json and not self.users and self.mode == "auto"
                      and procs is None and not sys.stdout.isatty())
        self.options = _lab_options(args)
        self.started = time.time()
        self._lab: Any = None
        self._rule = rule
        self._console: Any = None
        self._live: Any = None

    def _frame(self, hosts: list[Any], now: float) -> Any:
        if self._lab is None:
            from gputui.monitor.lab import Lab

            self._lab = Lab(self._rule) if self._rule is not None else Lab()
        return self._lab.update(hosts, now)

    def show(self, hosts: list[Any], now: float) -> None:
        if self.quiet:
            return
        if self.once:  # one round: nothing is retried, so no host says when it will be
            from dataclasses import replace

            from gputui.sources.ssh import without_retry

            hosts = [replace(h, message=without_retry(h.message)) for h in hosts]
        if self.users:
            self._show_users(hosts, now)
        elif self.as_json:
            from gputui.model.telemetry import round_to_dict

            doc = round_to_dict(hosts, now)
            if self.procs is not None:
                doc["processes"] = [row.to_dict() for row in self.procs.rows(hosts)]
            self._write_json(doc)
        else:
            self._show_hosts(hosts, now)

    def _write_json(self, doc: Any) -> None:
        from gputui.model.jsonline import compact  # a lab's line is 1.1 MB a second

        text = json.dumps(doc, indent=2) if self.once else compact(doc)
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def _show_users(self, hosts: list[Any], now: float) -> None:
        from gputui.views.lab import counted_since, users_plain

        frame = self._frame(hosts, now)
        since, why = counted_since(self.started, now)
        if self.as_json:
            self._write_json({"version": 1, "time": now, "since": since, "users": [u.to_dict() for u in frame.users]})
            return
        text = users_plain(frame.users, since, why)
        console = self._get_console()
        if self.once or not console.is_terminal:
            sys.stdout.write(text + "\n\n")
            sys.stdout.flush()
            return
        from rich.text import Text

        self._draw(Text.assemble(self._stamp(now), "\n", Text(text, no_wrap=True, overflow="ellipsis")))

    def _show_hosts(self, hosts: list[Any], now: float) -> None:
        from gputui.views.lab import table_rows

        console = self._get_console()
        live = not self.once and console.is_terminal
        mode = self.mode
        if mode == "auto":
            room = console.size.height - 1 if live else _pipe_lines()  # live: the header takes a line
            mode = "hosts" if table_rows(hosts) > room else "gpus"
        frame = self._frame(hosts, now)  # every round: GPU-hours and the GPU counts of hosts that go away
        if mode == "hosts":
            self._show_lab(hosts, frame, now, live)
            return
        from rich.console import Group

        from gputui.views.telemetry import HostsTable, ProcessesTable

        table: Any = HostsTable(hosts)  # laid out at the console's width, each time it is drawn
        if self.procs is not None:
            table = Group(table, ProcessesTable(self.procs.rows(hosts)))
        if not live:
            console.print(table)
            return
        self._draw(Group(self._stamp(now), table))

    def _show_lab(self, hosts: list[Any], frame: Any, now: float, live: bool) -> None:
        from gputui.views.lab import lab_live, lab_plain

        console = self._get_console()
        if not live:
            sys.stdout.write(lab_plain(frame, self.options) + "\n\n")
            sys.stdout.flush()
            if self.procs is not None:
                from gputui.views.telemetry import ProcessesTable

                console.print(ProcessesTable(self.procs.rows(hosts)))
            return
        height = console.size.height
        if self.procs is None:
            self._draw(lab_live(frame, self.options, height, self._stamp(now)))
            return
        from rich.console import Group

        from gputui.views.telemetry import ProcessesTable

        self._draw(Group(lab_live(frame, self.options, max(6, height // 2), self._stamp(now)),
                         ProcessesTable(self.procs.rows(hosts))))

    def _stamp(self, now: float) -> Any:
        from rich.text import Text

        stamp = time.strftime("%H:%M:%S", time.localtime(now))
        return Text(f"gputui monitor  {stamp}  every {self.interval:g} s  Ctrl-C quits", style="dim")

    def _draw(self, renderable: Any) -> None:
        if self._live is None:
            from rich.live import Live

            self._live = Live(renderable, console=self._get_console(), auto_refresh=False)
            self._live.start()
        self._live.update(renderable, refresh=True)

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
