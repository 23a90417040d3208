"""The last lines of a program run's output (<run dir>/output.log), read bounded.

The program writes what it likes: a gigabyte without a newline, control characters, text
that looks like Rich markup. Only the file's last TAIL_BYTES are read, a line longer than
MAX_LINE characters is cut (and says so), control characters go, and the lines are plain
text to show as data (the dashboard's gputui.ui.output_screen, `gputui runs show`), never markup.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from gputui.runs.store import OUTPUT  # the program's stdout and stderr, unchanged
from gputui.model.text import clean

TAIL_LINES = 200
TAIL_BYTES = 256 * 1024
MAX_LINE = 1000  # characters of one line shown; the rest is cut


@dataclass(frozen=True)
class OutputTail:
    """What the output view shows: the last lines, the file's size, and why there are none."""

    lines: tuple[str, ...]
    size: int  # bytes in the file when it was read
    note: str = ""  # "" or why nothing is shown (no file yet, unreadable)


def cut(line: str, most: int = MAX_LINE) -> str:
    """One line of output as text to show: control characters gone, at most `most` characters
    (a longer line ends in "…")."""
    return clean(line, most)


def read_tail(run_dir: str | Path, lines: int = TAIL_LINES, most_bytes: int = TAIL_BYTES) -> OutputTail:
    """The last `lines` lines of the run's output.log, from at most its last `most_bytes` bytes
    (blocks: call it from a worker)."""
    path = Path(run_dir) / OUTPUT
    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            start = max(0, size - most_bytes)
            fh.seek(start)
            data = fh.read(most_bytes)
    except FileNotFoundError:
        return OutputTail((), 0, "no output yet")
    except OSError as exc:
        return OutputTail((), 0, f"cannot read {path}: {exc.strerror or exc}")
    text = data.decode("utf-8", errors="replace").replace("\r\n", "\n")
    parts = text.split("\n")
    if start > 0 and len(parts) > 1:
        parts = parts[1:]  # the first line began before what was read: it is not whole
    if parts and parts[-1] == "":
        parts = parts[:-1]  # the text's last newline ends a line, it starts none
    # A progress bar's carriage returns: the line as it last looked.
    shown = tuple(cut(part.rsplit("\r", 1)[-1] if "\r" in part.rstrip("\r") else part.rstrip("\r"))
                  for part in parts[-lines:])
    return OutputTail(shown, size, "" if shown else "no output yet")
