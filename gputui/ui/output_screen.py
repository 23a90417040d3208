"""Key o: the output of the program's run on screen, its last lines, followed as it writes.

A worker reads the tail of <run dir>/output.log (gputui.runs.output: bounded, a huge
line cut, control characters gone) and posts it; the screen draws it as plain Text, never
markup (the program's text is data). The next read is scheduled when the last one's message
has come, so reads never pile up; a file that did not change is not drawn again.
"""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Label, Static

from gputui.runs.output import TAIL_LINES, OutputTail, read_tail
from gputui.model.text import clean

READ_EVERY_S = 1.0


class OutputRead(Message):
    """A read of the output's tail (from the worker)."""

    def __init__(self, tail: OutputTail) -> None:
        super().__init__()
        self.tail = tail


class OutputScreen(ModalScreen[None]):
    """The program's last lines (at most TAIL_LINES), newest at the bottom."""

    BINDINGS = [Binding("escape,o,q", "close", "Close")]
    DEFAULT_CSS = """
    OutputScreen > #output { width: 96%; height: 90%; }
    OutputScreen #output-lines { height: 1fr; }
    """

    def __init__(self, run_dir: str, run_id: str | None, every_s: float = READ_EVERY_S) -> None:
        super().__init__()
        self.run_dir = run_dir
        self.run_id = run_id
        self.every_s = every_s
        self.tail: OutputTail | None = None  # the last read (the tests read it)
        self.reads = 0

    def compose(self) -> ComposeResult:
        with Vertical(id="output", classes="dialog"):
            yield Label(Text(clean(f"output of run {self.run_id or Path(self.run_dir).name}: the last {TAIL_LINES} "
                                   "lines of output.log   (Esc or o closes)")), classes="title")
            with VerticalScroll(id="output-lines"):
                yield Static(Text("reading ...", "dim"), id="output-text")

    def on_mount(self) -> None:
        self._read()

    def _read(self) -> None:
        if not self.is_attached:
            return
        self.run_worker(self._work, name="output-read", group="output", thread=True, exclusive=True,
                        exit_on_error=False)

    def _work(self) -> None:
        self.post_message(OutputRead(read_tail(self.run_dir)))

    def on_output_read(self, message: OutputRead) -> None:
        self.reads += 1
        tail = message.tail
        if self.tail is None or tail != self.tail:
            self.tail = tail
            scroll = self.query_one("#output-lines", VerticalScroll)
            at_end = scroll.scroll_y >= scroll.max_scroll_y  # following the end: stay there
            text = Text("\n".join(tail.lines)) if tail.lines else Text(tail.note or "no output yet", "dim")
            self.query_one("#output-text", Static).update(text)
            if at_end:
                scroll.call_after_refresh(scroll.scroll_end, animate=False)
        self.set_timer(self.every_s, self._read, name="output-next")

    def action_close(self) -> None:
        self.dismiss(None)
