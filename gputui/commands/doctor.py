"""`gputui doctor`: check this machine and every remote host; pass/warn/fail rows with fixes."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gputui.commands.monitor import add_source_flags


def register(sub: Any) -> None:
    p = sub.add_parser(
        "doctor",
        help="check Python, torch, the NVIDIA driver and every remote host",
        description="Check Python, torch (CUDA, cuDNN, NCCL), NVML and the driver here, and each remote "
        "host: reachable, host key known, nvidia-smi, GPUs, Python and torch. Exit 1 if a check failed.",
    )
    add_source_flags(p)
    p.add_argument("--json", action="store_true", help="print the checks as one JSON document")
    p.add_argument("--no-local", action="store_true", help="check the remote hosts only")
    p.set_defaults(handler=cmd_doctor)


def cmd_doctor(args: argparse.Namespace) -> int:
    from gputui.commands.monitor import request_from
    from gputui.jobs.doctor import FAIL, all_remote_checks, local_checks
    from gputui.monitor.polling import remote_specs

    request = request_from(args)
    request.check()
    specs = remote_specs(request)  # bad flags or profile: exit 2 before anything runs
    checks = local_checks() if request.local else []
    if specs:
        from gputui.sources.hostkeys import SshOptions

        checks += all_remote_checks(specs, SshOptions(trust_on_first_use=request.trust_on_first_use))
    failed = any(c.status == FAIL for c in checks)
    if args.json:
        doc = {"ok": not failed, "checks": [c.to_dict() for c in checks]}
        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
    else:
        _print_table(checks)
    return 1 if failed else 0


def _print_table(checks: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gputui.views.progress import table_width
    from gputui.model.units import plural

    from gputui.model.text import clean

    styles = {"pass": "green", "warn": "yellow", "fail": "bold red"}
    table = Table(header_style="bold")
    for title in ("Host", "Check", "Status", "Found", "Fix"):
        table.add_column(title, overflow="fold")
    for c in checks:
        # what remote hosts answered is data: plain text, never markup
        table.add_row(*(Text(clean(v)) for v in (c.host, c.name)), Text(c.status, style=styles[c.status]),
                      *(Text(clean(v)) for v in (c.detail, c.fix)))
    console = Console(highlight=False, width=table_width(160))
    console.print(table)
    counts = {s: sum(c.status == s for c in checks) for s in styles}
    console.print(f"{counts['pass']} passed, {plural(counts['warn'], 'warning')}, {counts['fail']} failed")
