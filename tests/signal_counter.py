"""A child process that counts the SIGTERMs it gets, for tests of what was (not) signalled."""

from __future__ import annotations

import subprocess
import sys
from contextlib import contextmanager
from typing import Iterator

from tests.proc_support import Child

WAIT_S = 30.0
# It says how many SIGTERMs it got once a line comes on its stdin. A signal sent before that
# line is taken first: the blocked read is interrupted to run the handler.
COUNTER = ("import signal, sys\n"
           "got = []\n"
           "signal.signal(signal.SIGTERM, lambda *_: got.append(1))\n"
           "print('ready', flush=True)\n"
           "sys.stdin.readline()\n"
           "print(len(got), flush=True)\n")


@contextmanager
def signal_counter() -> Iterator[Child]:
    """The counter, started and ready (its handler installed); killed on leaving."""
    with Child([sys.executable, "-c", COUNTER], json_lines=False, name="the signal counter",
               stdin=subprocess.PIPE) as child:
        child.wait_for_line(lambda line: line.strip() == "ready", WAIT_S, "the counter's handler")
        yield child


def signals_got(child: Child) -> int:
    """How many SIGTERMs the counter got so far (it ends after saying)."""
    assert child.proc.stdin is not None
    child.proc.stdin.write("\n")
    child.proc.stdin.flush()
    return int(child.wait_for_line(lambda line: line.strip().isdigit(), WAIT_S, "the count of signals"))
