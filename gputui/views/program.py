"""How `gputui run` shows a run of the user's own program on a terminal.

The program's output is shown as it comes; one status line under it (on a terminal) holds its
latest metrics, the elapsed time, steps per second and the GPUs it holds. Off a terminal (a
log, `| cat`) the output passes through unchanged and the status goes out as a line at the
start and at the end; so does a stream sent elsewhere (`> out.txt`: the program's stdout, whole).
Names and numbers from the program are data: cleaned, never markup.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

from gputui.model import units
from gputui.model.events import metric_values, typed
from gputui.model.text import clean
from gputui.views.progress import _text

STATUS_VALUES = 6  # metrics on the status line (the latest-reported first)
REFRESH_S = 0.25
PRINT_S = 0.05  # on a terminal, a burst of the program's lines is printed together at most this often
PRINT_LINES = 1000  # ... or as soon as this many wait (a program that prints fast is never held long)
CLOCK_S = 1.0  # the status line is drawn at least this often: its elapsed time moves on between reports


def _shown(value: float | int) -> str:
    if isinstance(value, int):
        return str(value)
    return f"{value:.4g}"


class ProgramView:
    """The program's output, and a status line of its metrics, time, steps/s and GPUs."""

    def __init__(self, stderr: Any = None) -> None:
        from rich.console import Console

        self.console = Console(stderr=True, file=stderr)
        # Not a terminal (CI logs, `| cat`, a file): a line is a line, never folded at 80 columns.
        self.console.soft_wrap = not self.console.is_terminal
        self.live: Any = None
        self.values: dict[str, float | int] = {}
        self.step: int | None = None
        self.epoch: int | None = None
        self.elapsed = 0.0
        self.rate: float | None = None
        self._rate_from: tuple[float, int] | None = None
        self.gpus = "CPU"
        self.program = ""
        self.progress: tuple[str, str] | None = None  # (stream, text): a progress bar as it now looks
        self._drawn = 0.0
        self._dirty = False  # something changed that the last draw did not show
        self._held: list[str] = []  # the program's lines not yet printed (a terminal: printed in batches)
        self._elapsed_at: float | None = None  # when `elapsed` was last said: the clock counts on from it
        self._printed = 0.0
        self._lock = threading.Lock()  # two pumps and the runner call in
        self.stdout: Any = None  # gputui's own stdout, once the live display has taken sys.stdout
        self._stdout_drawn = False  # gputui's stdout is the terminal the live display draws on
        self._parked = False  # the status line is put away: the program waits for a typed line
        self._on_prompt = False  # ... and the cursor is where the user types (on the prompt's line)
        self._prompt: tuple[str, str] | None = None  # (stream, text) shown as the prompt: its line's start

    # -- what the runner gives ------------------------------------------------------------
    def program_streams(self) -> list[tuple[str, Callable[[bytes], None] | None]]:
        """How the program's output comes, asked once the run has started: one stream ("output",
        stdout and stderr in one pipe, in the order written) where gputui's stdout and stderr are
        one place, else "stdout" and "stderr". Each with where its bytes are copied unchanged (a
        file, a pipe: `> out.txt` gets the program's stdout whole), or None where this terminal
        view draws it, line by line above the status line."""
        out, err = self._stdout(), self.console.file
        together = _same_place(out, err)
        if self.live is None:
            if together:
                return [("output", _Copy(out))]
            return [("stdout", _Copy(out)), ("stderr", _Copy(err))]
        if together:
            return [("output", None)]
        return [("stdout", _Copy(out)), ("stderr", None)]

    def _stdout(self) -> Any:
        """gputui's stdout (not the live display's stand-in for it, which prints on the terminal)."""
        return self.stdout if self.stdout is not None else sys.stdout

    def output(self, line: str, stream: str, end: str = "\n") -> None:
        """A line of the program's (`end` "\n"), a progress bar's redraw ("\r"), or what shows of
        a line not yet ended (""). On a terminal a bar stays one line, just above the status line,
        redrawn in place; off a terminal a redraw passes through as it came (text, then "\r"),
        and so does a stdout line when gputui's stdout is not that terminal (a cluster's rank 0
        under `> out.txt`: its node gives stdout and stderr as one stream)."""
        if self._parked:
            with self._lock:
                self._unpark()
        if self.live is not None and (stream != "stdout" or self._stdout_drawn):
            if end != "\n":
                text = clean(line.replace("\t", "    "))
                self.progress = (stream, text) if text.strip() else None
                self._draw()
                return
            with self._lock:
                if self.progress is not None and self.progress[0] == stream:
                    self.progress = None  # the line that ended it is printed now
                    self._dirty = True
                text = clean(line.replace("\t", "    "))
                prompt = self._prompt
                if prompt is not None and prompt[0] == stream:  # the line a prompt began ends
                    self._prompt = None
                    if text.startswith(prompt[1]):
                        text = text[len(prompt[1]):]  # the prompt and what was typed are on the screen
                        if not text.strip():
                            return
                self._held.append(text)
                if len(self._held) >= PRINT_LINES or time.monotonic() - self._printed >= PRINT_S:
                    self._print_held()
            if self._dirty:
                self._draw()
        elif end:
            out = self._stdout() if stream == "stdout" else sys.stderr
            try:
                out.write(line + end)
                out.flush()
            except (OSError, ValueError):
                pass

    def show(self, event: dict[str, Any]) -> None:
        event = typed(event)
        kind = event.get("event")
        if kind == "start":
            gpus = event.get("gpus") or []
            self.gpus = ("GPU " + ",".join(str(g) for g in gpus)) if gpus else "CPU"
            self.program = clean(str(event.get("program") or ""))[:80]
            elapsed = self.elapsed
            note = " (resumed)" if event.get("resumed") else ""
            commit = event.get("git_commit")
            if isinstance(commit, str) and commit:  # which code: what a result is traced back to
                note += f" · git {clean(commit)[:10]}" + (" with uncommitted changes" if event.get("git_dirty") else "")
            self.console.print(_text("run ", (event.get("run_id"), "bold"), ": ", (self.program, ""),
                                          f" on {self.gpus}{note}"))
            self.elapsed = elapsed
            if not event.get("resumed"):  # a resumed run's clock goes on from where it was: its first report says
                self._elapsed_at = time.monotonic()
            together = _same_place(sys.stdout, self.console.file)
            # Not beside a pipe (`| tee log`): what reads it may print on this terminal, where the
            # live status line would erase its lines at each redraw; the view prints as off one.
            if self.console.is_terminal and (together or not _a_pipe(sys.stdout)):
                from rich.live import Live

                self.stdout = sys.stdout  # the live display puts a stand-in of its own there
                self._stdout_drawn = together
                self.live = Live(self._status(), console=self.console, auto_refresh=False, transient=True)
                self.live.start()
        elif kind == "metrics":
            values = metric_values(event.get("values"))
            self.values.update(values)
            for name in values:  # the latest-reported first
                self.values[name] = self.values.pop(name)
            step = event.get("step")
            if isinstance(step, int):
                now = time.monotonic()
                if self._rate_from is None:
                    self._rate_from = (now, step)
                elif now > self._rate_from[0] + 1.0:
                    self.rate = (step - self._rate_from[1]) / (now - self._rate_from[0])
                    self._rate_from = (now, step)
                self.step = step
            if isinstance(event.get("epoch"), int):
                self.epoch = event["epoch"]
            if isinstance(event.get("elapsed_s"), (int, float)):
                self.elapsed, self._elapsed_at = float(event["elapsed_s"]), time.monotonic()
            self._draw()
        elif kind in ("done", "interrupted", "error"):
            if isinstance(event.get("elapsed_s"), (int, float)):
                self.elapsed = float(event["elapsed_s"])
            self._elapsed_at = None  # the run's own figure, no longer counted on
            self.close()
            if kind == "done":
                self.console.print(_text(("done", "green"), ": ", (self.status_text(), "")))
            elif kind == "interrupted":
                self.console.print(_text(("interrupted", "yellow"), " (", (event.get("reason") or "", ""), "): ",
                                              (self.status_text(), "")))
        elif kind == "warning":
            with self._lock:
                self._print_held()  # the program's lines before it, in order
                if self._parked and self._on_prompt:  # the cursor is where the user types
                    self._on_prompt = False
                    self._write("\n")
            self.console.print(_text(("warning: ", "yellow"), (event.get("message") or "", "")))

    def close(self) -> None:
        with self._lock:
            if self._parked and self._on_prompt:  # the cursor is where the user types
                self._write("\n")
            self._parked = self._on_prompt = False
        if self.live is not None:
            with self._lock:
                self._print_held()
            self.live.stop()
            self.live = None

    # -- a program that waits for a typed line (gputui.jobs.prompt) --------------------------
    def awaiting_input(self, waiting: bool) -> None:
        """The program waits for a line from the terminal (input(), a breakpoint()), or no longer
        does: the status line is put away while it waits, and the prompt shown where the user
        types, so what they type shows (each redraw of the status line erased it)."""
        with self._lock:
            if waiting:
                self._park()
            else:
                self._unpark()

    def _park(self) -> None:
        """Lock held."""
        if self.live is None or self._parked:
            return
        self._print_held()
        self.live.stop()  # transient: the status line (and the line not yet ended) erased
        self.live, self._parked, self._on_prompt = None, True, True
        self._prompt, self.progress = self.progress, None
        if self._prompt is not None:
            self._write(self._prompt[1])

    def _unpark(self) -> None:
        """Lock held. The status line again, under the line the user ended (Enter)."""
        if not self._parked:
            return
        from rich.live import Live

        self._parked = self._on_prompt = False
        self.live = Live(self._status(), console=self.console, auto_refresh=False, transient=True)
        self.live.start()
        self._drawn = time.monotonic()

    def _write(self, text: str) -> None:
        try:
            self.console.file.write(text)
            self.console.file.flush()
        except (OSError, ValueError):
            pass

    def _print_held(self) -> None:
        """The lines held, printed above the status line as one text: one redraw of the live
        status for the whole burst, not one a line (a program printing 20,000 lines was slowed
        about 30 times, its pipe full while each line was drawn). Called with the lock held."""
        if self._held and self.live is not None:
            from rich.text import Text

            text, self._held = Text("\n".join(self._held)), []
            self.live.console.print(text, soft_wrap=True, highlight=False)
        self._printed = time.monotonic()

    # -- the status line ------------------------------------------------------------------
    def status_text(self) -> str:
        parts = []
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.epoch is not None:
            parts.append(f"epoch {self.epoch}")
        shown = list(self.values.items())[-STATUS_VALUES:][::-1]
        if shown:
            parts.append(" ".join(f"{clean(name)[:24]} {_shown(value)}" for name, value in shown))
        elapsed = self.elapsed
        if self._elapsed_at is not None:  # between reports (a program that only prints): the clock still runs
            elapsed += max(0.0, time.monotonic() - self._elapsed_at)
        parts.append(units.duration(elapsed))
        if self.rate is not None:
            parts.append(f"{self.rate:.3g} steps/s")
        parts.append(self.gpus)
        return " · ".join(parts)

    def _status(self) -> Any:
        from rich.text import Text

        status = Text(self.status_text(), style="bold", no_wrap=True, overflow="ellipsis")
        if self.progress is None:
            return status
        from rich.console import Group

        return Group(Text(self.progress[1], no_wrap=True, overflow="ellipsis"), status)

    def _draw(self) -> None:
        now = time.monotonic()
        self._dirty = True
        with self._lock:  # not while the status line is put away (a prompt) or brought back
            live = self.live
            if live is not None and now - self._drawn >= REFRESH_S:
                self._drawn, self._dirty = now, False
                live.update(self._status(), refresh=True)

    def tick(self) -> None:
        """Print the lines held and draw what changed since the last draw (the runner calls it
        while it waits), so the end of a burst shows even when nothing comes after it; and the
        status line at least every CLOCK_S, its elapsed time moving on."""
        if self.live is None:
            return
        if self._held:
            with self._lock:
                self._print_held()
        if self._dirty or time.monotonic() - self._drawn >= CLOCK_S:
            self._draw()


def _same_place(one: Any, other: Any) -> bool:
    """Whether two text streams write to the same file, pipe or terminal: not when one is closed
    (None); taken to be when Python's streams were replaced by objects without a file (tests)."""
    import os

    if one is None or other is None:
        return False
    try:
        return os.path.samestat(os.fstat(one.fileno()), os.fstat(other.fileno()))
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return True


def _a_pipe(out: Any) -> bool:
    """Whether a text stream writes to a pipe or a socket (`| tee log`, `| grep`)."""
    import os
    import stat

    if out is None:
        return False
    try:
        mode = os.fstat(out.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


class _Copy:
    """A program's bytes, written unchanged to one of gputui's streams (through its binary
    buffer, after what gputui itself wrote there). Once the stream refuses (a reader gone:
    `| head`), it is given nothing more: the run goes on, its output still in output.log."""

    def __init__(self, out: Any) -> None:
        self.out = out
        self.binary = getattr(out, "buffer", None)
        self.broken = out is None  # gputui started with that stream closed

    def __call__(self, chunk: bytes) -> None:
        if self.broken:
            return
        try:
            self.out.flush()
            if self.binary is not None:
                self.binary.write(chunk)
                self.binary.flush()
            else:
                self.out.write(chunk.decode("utf-8", errors="replace"))
                self.out.flush()
        except (OSError, ValueError):
            self.broken = True


PENDING_EVENTS = 256  # events held before the run's start (a cluster's bring-up says a few)


class TerminalView:
    """`gputui run` without --json: the progress bar of a built-in net, or a program's view,
    chosen by the run's start event. A cluster says what its nodes do before the run starts:
    those events wait for the start (they were taken for a built-in net's, and a program on a
    cluster got the net's empty progress bar)."""

    program_stdin = True  # a program reads the command's stdin (gputui.jobs.program)

    def __init__(self) -> None:
        self.inner: Any = None
        self.pending: list[dict[str, Any]] = []

    def _pick(self, event: dict[str, Any]) -> Any:
        if self.inner is None:
            if event.get("event") == "start" and "program" in event:
                self.inner = ProgramView()
            else:
                from gputui.views.progress import ProgressView

                self.inner = ProgressView()
        return self.inner

    def program_streams(self) -> list[tuple[str, Callable[[bytes], None] | None]]:
        inner = self.inner
        if isinstance(inner, ProgramView):
            return inner.program_streams()
        return [("output", None)]

    def output(self, line: str, stream: str, end: str = "\n") -> None:
        inner = self.inner
        if isinstance(inner, ProgramView):
            inner.output(line, stream, end)

    def tick(self) -> None:
        inner = self.inner
        if isinstance(inner, ProgramView):
            inner.tick()

    def awaiting_input(self, waiting: bool) -> None:
        inner = self.inner
        if isinstance(inner, ProgramView):
            inner.awaiting_input(waiting)

    def show(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if self.inner is None:
            if kind == "error":  # an error before any start: the command says it
                return
            if kind not in ("start", "done", "interrupted"):
                self.pending = [*self.pending[-(PENDING_EVENTS - 1):], event]
                return
            inner = self._pick(event)  # the start (or an end that came without one)
            held, self.pending = self.pending, []
            for before in held:
                inner.show(before)
        self.inner.show(event)

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()
