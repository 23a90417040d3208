"""Errors that reach the user as one line and an exit code, never a traceback."""

from __future__ import annotations

from pathlib import Path


class GputuiError(Exception):
    """A failure gputui explains in one line; exit code 1."""

    exit_code = 1


class UserError(GputuiError):
    """Bad input (a flag, a profile, a data file, a checkpoint): exit code 2."""

    exit_code = 2


def read_user_file(path: Path, what: str, if_missing: str = "") -> str:
    """The text of a file the user named; a missing or unreadable one is a one-line UserError.

    The message for a missing file is "PATH: WHAT not found" followed by `if_missing`.
    """
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{path}: {what} not found{if_missing}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: cannot read {what}: {exc}") from None
