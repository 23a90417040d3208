"""`gputui runs`: the list of past runs, `gputui runs show RUN_ID` for one in detail, `gputui runs
export RUN_ID --csv` for their curves, and `gputui runs rm RUN_ID...` to remove runs.

The records come from gputui.runs.history (no torch, no UI); ids, models, devices and error lines
are data from the run directories, shown as Text (never markup) in the table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    runs = subparsers.add_parser(
        "runs", help="list past runs; show one, export its curves",
        description="List the runs in the default location (or --dir): id, start, model, device and strategy, "
        "epochs, best and final test accuracy, training time, cost (from the cost ledger) and state "
        "(done, interrupted, failed, running, or stopped: ended without a last event). "
        "A run of your own program shows its program's name as the model, the last epoch it reported, "
        "and its [run] objective's best (with its name) and last value in the accuracy columns.")
    runs.add_argument("--json", action="store_true", help="print the runs as one JSON document on stdout")
    runs.add_argument("--dir", type=Path, metavar="DIR", help="list the runs under DIR (default: the user data dir's runs)")
    runs.set_defaults(handler=cmd_runs)
    actions = runs.add_subparsers(dest="runs_action", metavar="ACTION")
    export = actions.add_parser(
        "export", help="write a run's curves to CSV",
        description="Write a run's curves as CSV, one row per step, eval or epoch event: "
        "step, epoch, elapsed_s, time, loss, l1, samples_per_s, lr, train_loss, test_loss, test_acc. "
        "A run of your own program (gputui run -- PROGRAM): one row per metrics event, "
        "elapsed_s, step, epoch, then a column for every metric it reported (first seen first).")
    one_run(export)
    export.add_argument("--csv", nargs="?", const="-", metavar="FILE", help="write CSV to FILE (stdout without FILE)")
    export.set_defaults(handler=cmd_export)
    show = actions.add_parser(
        "show", help="one run in detail: its command, code, latest metrics, checkpoints, output",
        description="One run in detail: its state, time and cost as `gputui runs` lists it, then its command "
        "(or model) and where it ran, the code it ran (git), its [run] trial, its objective, the latest value of "
        "each metric it reported, its checkpoints, the last lines of its output, and the command that goes on "
        "from it. Reads only the ends of its files, however long the run.")
    one_run(show)
    show.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                      help="print it as one JSON document on stdout")
    show.set_defaults(handler=cmd_show)
    rm = actions.add_parser(
        "rm", help="remove past runs (their directories, checkpoints included)",
        description="Remove past runs: each run's directory under the runs' location (or --dir), its "
        "checkpoints and logs included. A running run is refused, and so is a --run-dir elsewhere; when "
        "one is refused nothing is removed. On a terminal it asks first (--yes does not). The runs' "
        "spend stays in the cost ledger (gputui cost).")
    rm.add_argument("run_ids", nargs="+", metavar="RUN_ID", help="run ids from `gputui runs`, or 'last'")
    rm.add_argument("--yes", "-y", action="store_true", help="remove without asking")
    rm.add_argument("--dir", type=Path, metavar="DIR", default=argparse.SUPPRESS,
                    help="the runs are under DIR (default: the user data dir's runs)")
    rm.set_defaults(handler=cmd_rm)


def one_run(action: argparse.ArgumentParser) -> None:
    """An action's RUN_ID and --dir (`gputui runs --dir D ACTION ID` works too)."""
    action.add_argument("run_id", metavar="RUN_ID", help="a run id from `gputui runs`, 'last', or a run directory")
    action.add_argument("--dir", type=Path, metavar="DIR", default=argparse.SUPPRESS,
                        help="look RUN_ID up under DIR (default: the user data dir's runs)")


def cmd_runs(args: argparse.Namespace) -> int:
    from gputui.runs import history
    from gputui.views import cloud as view
    from gputui.model.paths import runs_home

    home = args.dir.expanduser() if args.dir is not None else runs_home()
    listed = history.list_runs(home)
    if args.json:
        view.print_json({"dir": str(home), "runs": [s.to_json() for s in listed]})
        return 0
    if not listed:
        view.say(f"no runs in {home} yet; start one with `gputui run`")
        return 0
    view.print_table(f"Runs in {home}", list(history.COLUMNS), (row(s) for s in listed),
                     caption="see a run's curves: gputui runs export ID --csv [FILE]; go on: gputui run --resume ID",
                     hide_first=history.HIDE_FIRST)
    return 0


def row(s: Any) -> list[str]:
    """A summary as the table's cells (the dashboard's runs screen shows the same)."""
    from gputui.runs.history import cells

    return cells(s)


def cmd_rm(args: argparse.Namespace) -> int:
    from gputui.runs import history
    from gputui.views import cloud as view
    from gputui.model import units
    from gputui.model.paths import runs_home

    home = args.dir.expanduser() if getattr(args, "dir", None) is not None else runs_home()
    doomed = history.removals(args.run_ids, home)  # all checked before any is removed
    total = sum(r.size for r in doomed)
    what = units.plural(len(doomed), "run")
    if not args.yes and view.interactive():
        for r in doomed:
            view.say(f"  {r.run.run_id}  {r.state}  {units.size(r.size)}")
    if not view.confirm(f"remove {what} ({units.size(total)}) from {home}? [y/N] ", args.yes, f"runs rm: removing {what}"):
        view.say("nothing removed")
        return 1
    for r in doomed:
        history.delete_run(r.run)  # checked again just before: it may have been resumed since
        view.say(f"removed run {r.run.run_id} ({units.size(r.size)})")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from gputui.runs import detail
    from gputui.views import cloud as view
    from gputui.model.paths import runs_home

    home = args.dir.expanduser() if getattr(args, "dir", None) is not None else runs_home()
    shown = detail.detail(args.run_id, home)
    if args.json:
        view.print_json(shown.to_json())
        return 0
    sys.stdout.write("".join(line + "\n" for line in detail.text_lines(shown)))  # the command's output: stdout
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from gputui.runs import history
    from gputui.runs import store as runs
    from gputui.model.errors import UserError
    from gputui.model.paths import runs_home, user_opener

    if args.csv is None:
        raise UserError(f"runs export {args.run_id}: name the format: --csv [FILE] (stdout without FILE)")
    home = args.dir.expanduser() if getattr(args, "dir", None) is not None else runs_home()
    run = runs.find(args.run_id, home, flag="runs export")
    # streamed: a long run's file is never read whole
    if args.csv == "-":
        history.write_run_csv(run.events, sys.stdout)
        return 0
    target = Path(args.csv).expanduser()
    try:
        with open(target, "w", encoding="utf-8", newline="", opener=user_opener) as fh:  # the user's umask
            count = history.write_run_csv(run.events, fh)
    except OSError as exc:
        raise UserError(f"cannot write {target}: {exc.strerror or exc}") from None
    print(f"wrote {count} rows of run {run.run_id} to {target}", file=sys.stderr)
    return 0
