"""The `gputui` command line. Heavy libraries (torch, ...) are imported only by the commands that use them."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from gputui import __version__
from gputui.model.errors import GputuiError, UserError

# Subcommands that live in their own modules under gputui/commands/: each module has
# `register(subparsers)`, which adds its parser and sets `handler`, and imports nothing
# heavy at module level (so `gputui --help` stays fast).
COMMAND_MODULES: tuple[str, ...] = ("gputui.commands.monitor", "gputui.commands.doctor", "gputui.commands.cloud", "gputui.commands.cost", "gputui.commands.ui", "gputui.commands.bench", "gputui.commands.cluster", "gputui.commands.runs", "gputui.commands.serve", "gputui.commands.sweep", "gputui.commands.worker")

# flag -> (settings key, parser of the flag's text)
RUN_FLAGS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--model": ("model", str),
    "--epochs": ("epochs", int),
    "--batch-size": ("batch_size", int),
    "--lr": ("lr", float),
    "--device": ("device", str),
    "--strategy": ("strategy", str),
    "--nproc": ("nproc", int),
    "--gpus": ("gpus", lambda text: [int(part) for part in text.split(",") if part.strip()]),
    "--seed": ("seed", int),
    "--threads": ("threads", int),
    "--evals-per-epoch": ("evals_per_epoch", int),
}
RUN_HELP = {
    "--model": "network to train: seed (the paper's, default) or fast",
    "--epochs": "epochs to train (default: the model's)",
    "--batch-size": "global batch size (default: the model's)",
    "--lr": "peak learning rate (default: the model's)",
    "--device": "auto (CUDA, then MPS, then CPU), cpu, mps, cuda or cuda:N",
    "--strategy": "single, dataparallel or ddp (torchrun)",
    "--nproc": "ddp: processes (default: one per GPU, or 2 on a CPU)",
    "--gpus": "dataparallel/ddp: GPU indices, e.g. 0,1 (default: all)",
    "--seed": "random seed (same seed, same run)",
    "--threads": "CPU threads for torch",
    "--evals-per-epoch": "test evaluations per epoch",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gputui",
        description="Train deep networks on local, SSH-reachable and spot GPUs from one terminal app.",
    )
    parser.add_argument("--version", action="version", version=f"gputui {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="train headless (the main job)", usage="gputui run [options] [-- PROGRAM [ARGS ...]]",
                         description="Train a run headless: a built-in net, or your own program after -- "
                         "(docs/program.md).")
    run.add_argument("--profile", type=Path, help="run profile (default: profiles/local.toml)")
    for flag, (key, _parse) in RUN_FLAGS.items():
        run.add_argument(flag, dest=key, metavar=key.upper(), help=RUN_HELP[flag])
    run.add_argument("--data", type=Path, help="directory with the four MNIST-format IDX files (default: bundled MNIST)")
    run.add_argument("--run-dir", type=Path, help="directory for this run (default: under the user data dir)")
    run.add_argument("--resume", metavar="RUN_ID|last", help="continue a run from its last checkpoint")
    run.add_argument("--json", action="store_true", help="print the events as JSON lines on stdout, nothing else")
    run.add_argument("--cuda-graph", dest="cuda_graph", action=argparse.BooleanOptionalAction, default=None,
                     help="single on CUDA: capture each training step as one CUDA graph (default: on; "
                     "--no-cuda-graph trains eagerly)")
    run.set_defaults(handler=cmd_run)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    # internal commands (`worker`) stay out of the help: argparse before 3.13 prints "==SUPPRESS=="
    sub._choices_actions = [a for a in sub._choices_actions if a.help != argparse.SUPPRESS]
    importlib.import_module("gputui.commands.ui").add_flags(parser, top_level=True)  # `gputui` opens the dashboard
    return parser


def run_overrides(args: argparse.Namespace) -> Any:
    """The run flags as RunSettings, each value checked by the profile schema."""
    from gputui.config.run import RUN_SECTION, RunSettings

    values: dict[str, Any] = {}
    for flag, (key, parse) in RUN_FLAGS.items():
        text = getattr(args, key)
        if text is None:
            continue
        field = RUN_SECTION.fields[key]
        try:
            value = parse(text)
        except ValueError:
            raise UserError(f"{flag} {text}: expected {field.expected()}") from None
        try:
            values[key] = field.coerce(value)
        except ValueError as exc:
            raise UserError(f"{flag} {text}: expected {exc}") from None
    if args.data is not None:
        values["data"] = str(args.data.expanduser().resolve())
    if getattr(args, "cuda_graph", None) is not None:
        values["cuda_graph"] = bool(args.cuda_graph)
    return RunSettings(**values)


def cmd_run(args: argparse.Namespace) -> int:
    from gputui.views.progress import JsonView
    from gputui.views.program import TerminalView
    from gputui.jobs.run import RunRequest, run

    program = getattr(args, "program", None)
    if program is not None and args.resume is not None:
        raise UserError("--resume reruns the run's own program: leave out what follows --")
    request = RunRequest(
        profile=args.profile,
        overrides=run_overrides(args),
        run_dir=args.run_dir,
        resume=args.resume,
        program=tuple(program) if program is not None else None,
    )
    view = JsonView() if args.json else TerminalView()
    try:
        return run(request, view)
    except GputuiError as exc:
        if isinstance(view, JsonView) and not view.said_error:  # bad input: scripts read the reason on stdout too
            from gputui.model import events

            view.show(events.make("error", message=str(exc), exit_code=exc.exit_code))
        raise


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The parser of the (sub)command `args` chose, the deepest one: its usage is the one to show."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return command_parser(chosen, args)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from gputui.model import paths

    # Everything gputui and its children create is this account's alone (0700/0600): one umask
    # covers every module and library that writes (torch, SQLite, loggers) and the processes it
    # starts (workers, torchrun, slaves' commands); CSV exports take the user's umask back
    # (paths.user_opener), and homes an older gputui left open are tightened here.
    before = paths.private_umask()
    try:
        paths.tighten_homes()
        return _main(argv)
    finally:
        os.umask(before)  # a caller in this process (a test, a script) gets its own umask back


def split_program(argv: Sequence[str]) -> tuple[list[str], list[str] | None]:
    """`gputui run [options] -- PROGRAM ARGS`: gputui's words, and the program's (None without --)."""
    words = list(argv)
    if "run" in words and "--" in words[words.index("run"):]:
        cut = words.index("--", words.index("run"))
        return words[:cut], words[cut + 1:]
    return words, None


def before_command(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`gputui --profile FILE COMMAND`: the profile goes to the command when it takes one (as if
    given after it), never silently to nothing; --demo and --light before a command other than
    the dashboard's are refused, not ignored."""
    if args.command in (None, "ui", "serve"):  # the dashboard's own flags, wherever they stand
        return
    chosen = command_parser(parser, args)
    for flag in ("--demo", "--light"):
        if getattr(args, flag[2:], False):
            chosen.error(f"{flag} is the dashboard's (gputui {flag}), not this command's")
    if args.ui_profile is None:
        return
    if not hasattr(args, "profile"):
        chosen.error("--profile was given before the command, and this command takes none")
    if args.profile is None:
        args.profile = args.ui_profile
    elif Path(args.profile).resolve() != Path(args.ui_profile).resolve():
        chosen.error(f"two profiles: --profile {args.ui_profile} before the command and --profile {args.profile} "
                     "after it; give one")


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv, program = split_program(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if program is not None and args.command == "run":
        args.program = program
    if unknown:  # say it with the usage of the command that was meant, not the top level's
        said = f"unrecognized arguments: {' '.join(unknown)}"
        if args.command == "run" and program is None and not unknown[0].startswith("-"):  # `gputui run python train.py`
            import shlex

            words = list(argv)
            try:
                at = words.index(unknown[0], words.index("run") + 1)  # the program, and all after it, are its own
            except ValueError:  # pragma: no cover - an unknown word is one of the command's
                at = len(words)
            said += f" (your own program goes after --: gputui {shlex.join([*words[:at], '--', *words[at:]])})"
        command_parser(parser, args).error(said)
    before_command(parser, args)
    if getattr(args, "handler", None) is None:  # no subcommand: the dashboard
        from gputui.commands.ui import cmd_ui

        args.handler = cmd_ui
    if args.command not in ("cloud", "cost", "ui", None):  # those check the cloud themselves (the dashboard shows it)
        from gputui.cloud.leaks import note_running  # sqlite3 only; silent without a ledger

        note_running()
    try:
        return int(args.handler(args))
    except GputuiError as exc:
        print(f"gputui: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("gputui: stopped at once (interrupted twice); the last checkpoint is kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
