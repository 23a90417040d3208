"""`gputui serve`: the dashboard in a browser, through textual-serve.

Each browser tab that connects gets its own dashboard process (`gputui ui` with the same
profile and flags), driven over a websocket. Whoever drives a dashboard starts and stops
runs and launches and terminates paid instances, so: the server binds 127.0.0.1 unless
`--public` says otherwise; every request needs a token made for this server and printed once,
in the URL (as Jupyter does; another account on the machine cannot read it); the Host header
must name this machine (DNS rebinding); the websocket refuses pages from other origins; and
at most --max-sessions dashboards live at once (gputui.ui.web has the details).
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from typing import Any

from gputui.model.units import plural

DEFAULT_HOST = "127.0.0.1"
PUBLIC_HOST = "0.0.0.0"
DEFAULT_PORT = 8000
DEFAULT_MAX_SESSIONS = 4
# A tab's dashboard that quits while a run it started is going stops the run first (a checkpoint
# within the supervisor's grace, 30 s more at most): the server waits that long for it.
QUIT_BOUND_S = 90.0
TUNNEL = "ssh -N -L {port}:127.0.0.1:{port} {destination}"
_HOST_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$|^\[?[0-9A-Fa-f:.]+\]?$")


def register(subparsers: Any) -> None:
    from gputui.commands.ui import add_flags

    p = subparsers.add_parser(
        "serve", help="the dashboard in a browser (textual-serve)",
        description="Serve the dashboard over HTTP: each browser tab runs its own dashboard on this machine. "
        "Binds 127.0.0.1 (this machine only) and prints the URL to open, with a token made for this server "
        "(every request needs it). From another machine, run an SSH tunnel there: "
        + TUNNEL.format(port=DEFAULT_PORT, destination="HOST") + ", and open the printed URL.")
    p.add_argument("--host", metavar="ADDRESS", default=None,
                   help=f"address to listen on (default {DEFAULT_HOST}; with --public {PUBLIC_HOST})")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, metavar="PORT",
                   help=f"port to listen on (default {DEFAULT_PORT}; 0 picks a free one)")
    p.add_argument("--public", action="store_true",
                   help="allow an address other than loopback: whoever reaches the port and sees the token controls the "
                   "dashboard, its runs and the cluster's paid instances (plain http: the token crosses the network "
                   "in clear)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="a host name the server answers to, besides loopback names, its address (and with --public "
                   "IP addresses and this machine's name); repeatable")
    p.add_argument("--max-sessions", type=int, default=DEFAULT_MAX_SESSIONS, metavar="N",
                   help=f"most dashboards (browser tabs) alive at once (default {DEFAULT_MAX_SESSIONS})")
    add_flags(p, top_level=False)  # --profile, --demo, ...: passed on to each tab's dashboard
    p.set_defaults(handler=cmd_serve)


def dashboard_argv(args: argparse.Namespace) -> list[str]:
    """The dashboard command each tab runs: `gputui ui` with the flags `gputui serve` was given
    (every flag of `gputui ui`, whichever there are; the profile checked and made absolute)."""
    from gputui.commands.ui import add_flags
    from gputui.dashboard.setup import resolve_profile

    argv = [sys.executable, "-m", "gputui", "ui"]
    template = argparse.ArgumentParser(add_help=False)
    add_flags(template, top_level=False)
    for action in template._actions:
        if not action.option_strings or not hasattr(args, action.dest):
            continue
        value = getattr(args, action.dest)
        flag = action.option_strings[-1] if action.option_strings[-1].startswith("--") else action.option_strings[0]
        if action.dest == "ui_profile":
            argv += [flag, str(resolve_profile(value))]  # a bad profile: exit 2 now, not in each tab
        elif isinstance(action, argparse.BooleanOptionalAction):
            if value is not None:
                argv.append(action.option_strings[0] if value else action.option_strings[1])
        elif action.nargs == 0:  # store_true / store_false / store_const: given when it holds the const
            if value == action.const:
                argv.append(flag)
        elif value is not None:
            argv += [flag, str(value)]
    if "--profile" not in argv:
        argv += ["--profile", str(resolve_profile(None))]
    return argv


def listen_address(args: argparse.Namespace) -> str:
    from gputui.model.errors import UserError
    from gputui.monitor.exporter import is_loopback

    host = args.host if args.host is not None else (PUBLIC_HOST if args.public else DEFAULT_HOST)
    if not 0 <= args.port <= 65535:
        raise UserError(f"--port {args.port}: expected a port number 0-65535")
    if not is_loopback(host) and not args.public:
        raise UserError(f"--host {host} is not a loopback address: whoever reaches it controls the dashboard; "
                        "add --public if you mean it, or use an SSH tunnel (see gputui serve --help)")
    if args.max_sessions < 1:
        raise UserError(f"--max-sessions {args.max_sessions}: expected 1 or more")
    for name in args.allow_host:
        if not _HOST_NAME.match(name):
            raise UserError(f"--allow-host {name!r}: expected a host name or address, e.g. --allow-host gpubox.lan")
    return host


def cmd_serve(args: argparse.Namespace) -> int:
    import secrets

    from gputui.commands.ui import env_int

    host = listen_address(args)
    argv = dashboard_argv(args)
    env_int("GPUTUI_DEMO_HOSTS", 3), env_int("GPUTUI_DEMO_GPUS", 4)  # a bad value: said now, not in each tab
    from gputui.monitor.exporter import is_loopback
    from gputui.ui.web import Guard, make_server

    # The token lives in this process only: not in a child's command line or environment (a
    # dashboard is `gputui ui`, which never needs it), and printed once, in the URL.
    token = secrets.token_urlsafe(32)
    command = "exec " + shlex.join(argv)
    guard = Guard(token, host, tuple(args.allow_host), args.max_sessions)
    server = make_server(command, guard, QUIT_BOUND_S)
    import asyncio

    return asyncio.run(serve(server, host, args.port, public=not is_loopback(host), token=token,
                             max_sessions=args.max_sessions))


def url_of(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def tunnel_command(port: int) -> str:
    """The SSH command, to run on another machine, that brings this server's port there."""
    import getpass
    import socket

    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "USER"
    return TUNNEL.format(port=port, destination=shlex.quote(f"{user}@{socket.gethostname()}"))


async def serve(server: Any, host: str, port: int, public: bool, token: str,
                max_sessions: int = DEFAULT_MAX_SESSIONS) -> int:
    import asyncio
    import logging
    import signal

    from aiohttp import web

    from gputui.model.errors import GputuiError

    logging.basicConfig(level=logging.WARNING, format="gputui serve: %(message)s")
    runner = web.AppRunner(await server._make_app(), handle_signals=False, access_log=None)  # URLs hold the token
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as exc:
        await runner.cleanup()
        reason = exc.strerror or str(exc)
        hint = "; pick another with --port (0: any free one)" if exc.errno == 98 else ""
        raise GputuiError(f"cannot listen on {host}:{port}: {reason}{hint}") from None
    bound = runner.addresses[0][1] if runner.addresses else port
    shown = "127.0.0.1" if host == PUBLIC_HOST else host
    tunnel = tunnel_command(bound)
    if public:  # the warning comes before the line that says the server is up (a stop right after it misses nothing)
        print(f"gputui: warning: listening on {host}:{bound}, not loopback, over plain http: the token crosses the "
              "network in clear, and whoever reaches this port controls the dashboard with it (starts and stops "
              f"runs, launches and terminates paid instances); prefer the default and, on the other machine, "
              f"`{tunnel}`", file=sys.stderr, flush=True)
    # the one place the token is written: the URL to open
    print(f"gputui: serving the dashboard on {url_of(shown, bound)}/?token={token} (one dashboard per browser tab, "
          f"{max_sessions} at most; Ctrl-C stops)", flush=True)
    if not public:
        print(f"gputui: this machine only; from another one, run `{tunnel}` there and open the URL above there",
              flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    stop.clear()
    print(f"gputui: stopping: each browser session's dashboard quits (up to {QUIT_BOUND_S:.0f} s; Ctrl-C again: "
          "at once)", file=sys.stderr, flush=True)
    await close_sessions(runner, stop)
    return 0


async def close_sessions(runner: Any, again: Any) -> None:
    """Close the server: each tab's dashboard is asked to quit. One that has not quit within
    QUIT_BOUND_S (or at a second Ctrl-C) is killed; runs it followed go on (their own session)."""
    import asyncio

    import psutil

    cleanup = asyncio.ensure_future(runner.cleanup())
    interrupt = asyncio.ensure_future(again.wait())
    done, _ = await asyncio.wait({cleanup, interrupt}, timeout=QUIT_BOUND_S, return_when=asyncio.FIRST_COMPLETED)
    interrupt.cancel()
    if cleanup in done:
        return
    left = [p for p in psutil.Process().children() if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    if left:
        print(f"gputui: {plural(len(left), 'dashboard')} had not quit: killed (SIGKILL); a run they followed goes on "
              "(`gputui runs` lists it; a dashboard's `a` attaches to it)", file=sys.stderr, flush=True)
    for proc in left:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    await cleanup
