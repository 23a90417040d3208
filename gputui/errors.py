"""Errors that reach the user as one line and an exit code, never a traceback."""

from __future__ import annotations


class GputuiError(Exception):
    """A failure gputui explains in one line; exit code 1."""

    exit_code = 1


class UserError(GputuiError):
    """Bad input (a flag, a profile, a data file, a checkpoint): exit code 2."""

    exit_code = 2
