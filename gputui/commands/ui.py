"""`gputui` (no subcommand) and `gputui ui`: the dashboard. Textual loads only here, lazily."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from typing import Any


def add_flags(parser: argparse.ArgumentParser, top_level: bool) -> None:
    """--profile, --demo and --light, on `gputui` itself and on `gputui ui`."""
    # A subcommand's defaults would overwrite the top level's values: it sets none (SUPPRESS).
    default: Any = None if top_level else argparse.SUPPRESS
    parser.add_argument("--profile", dest="ui_profile", type=Path, default=default, metavar="FILE",
                        help="dashboard: profile to open (default: profiles/local.toml)"
                        + ("; before a command that takes a profile, that command's" if top_level else ""))
    parser.add_argument("--demo", action="store_true", default=False if top_level else argparse.SUPPRESS,
                        help="dashboard: simulated hosts, GPUs, spot slaves and prices; real training on this CPU")
    parser.add_argument("--light", action="store_true", default=False if top_level else argparse.SUPPRESS,
                        help="dashboard: the light theme, for light terminals (L switches while it runs)")


def register(subparsers: Any) -> None:
    ui = subparsers.add_parser("ui", help="the dashboard (also: gputui with no command)",
                               description="Live GPUs and hosts, training curves, cost and one-key slave control.")
    add_flags(ui, top_level=False)
    ui.set_defaults(handler=cmd_ui)


def env_int(name: str, default: int) -> int:
    """A whole number from the environment (the demo's size: GPUTUI_DEMO_HOSTS, GPUTUI_DEMO_GPUS)."""
    import os

    from gputui.model.errors import UserError

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        return int(text)
    except ValueError:
        raise UserError(f"{name}={text!r}: expected a whole number") from None


def cmd_ui(args: argparse.Namespace) -> int:
    from gputui.dashboard.setup import Backend, DashboardOptions, check_options, resolve_profile

    options = DashboardOptions(profile=resolve_profile(getattr(args, "ui_profile", None)),
                               demo=bool(getattr(args, "demo", False)),
                               sim_hosts=env_int("GPUTUI_DEMO_HOSTS", 3), sim_gpus=env_int("GPUTUI_DEMO_GPUS", 4))
    check_options(options)
    from gputui.model import heap
    from gputui.ui.app import create_app

    heap.for_polling()

    app = create_app(Backend(options))
    if getattr(args, "light", False):
        from gputui.ui.base import LIGHT_THEME

        app.theme = LIGHT_THEME
    # `kill PID` quits like q with "keep": the run checkpoints, the slaves stay (they are in the ledger).
    previous = signal.signal(signal.SIGTERM, lambda *_: app.call_later(app.finish, "gputui: stopped by SIGTERM"))
    try:
        app.run()
    finally:
        signal.signal(signal.SIGTERM, previous)
        if app.child is not None:
            app.child.shutdown()  # never leave the training child behind, however the app ended
    return int(app.return_code or 0)
