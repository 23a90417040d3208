"""`gputui worker`: a long-lived sweep worker. It imports torch once, loads the data set once, then
trains the trials its master sends as JSON lines on stdin (gputui.sweep.protocol), writing each
trial's run events and a result on stdout. The sweep master starts it; people rarely do."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    worker = subparsers.add_parser(
        "worker", help=argparse.SUPPRESS,  # internal: started by `gputui sweep`, hidden from help
        description="A long-lived sweep worker: reads trials as JSON lines on stdin, writes run events and "
        "results as JSON lines on stdout (see gputui/sweep/protocol.py). Started by `gputui sweep`.")
    worker.add_argument("--device", default="auto", help="auto, cpu, mps, cuda or cuda:N (default: auto)")
    worker.add_argument("--threads", type=int, metavar="N", help="CPU threads for torch (default: torch's choice)")
    worker.add_argument("--data", type=Path, metavar="DIR", help="data set to load at start (default: bundled MNIST)")
    worker.add_argument("--program", action="store_true", help="trials of the user's own program ([run] command): "
                        "no torch, no data set")
    worker.set_defaults(handler=cmd_worker)


def cmd_worker(args: argparse.Namespace) -> int:
    from gputui.model.errors import UserError
    from gputui.config.run import DEVICE_RE

    if not DEVICE_RE.match(args.device):
        raise UserError(f"--device {args.device}: expected auto, cpu, mps, cuda or cuda:N")
    if args.threads is not None and args.threads < 1:
        raise UserError(f"--threads {args.threads}: expected a whole number >= 1")
    if args.program:
        from gputui.jobs import program
        from gputui.sweep.programs import serve_programs

        return serve_programs(args.device, args.threads, program)
    from gputui.sweep.trials import serve

    data = str(args.data.expanduser().resolve()) if args.data is not None else None
    return serve(args.device, args.threads, data)
