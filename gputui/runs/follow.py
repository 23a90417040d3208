"""Following a run's events file (events.jsonl) while the run writes it: how the dashboard
watches any run on this machine, whoever started it (`gputui run` in another terminal, a
cluster run, or a run the dashboard started and may leave running when it quits).

The file is polled (no inotify: it works the same on any file system); each poll reads at
most `max_read` bytes, keeps a line still being written for the next poll, and drops a line
longer than `max_line` (not an event of ours). `events()` blocks: call it from a worker
thread; `stop()` ends it from any thread. No Textual, no torch.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from gputui.model import outside
from gputui.model.lines import LineSplitter
from gputui.model.text import clean_tree

POLL_S = 0.4  # the screen shows a followed run 2.5 times a second: what a reader takes in, at a bounded cost
MAX_READ = 1 << 20  # bytes per poll: a long history comes in slices, the screen keeps drawing
MAX_LINE = 1 << 20  # an event line is a few hundred bytes; past this it is not one


class Follower:
    """Reads the events appended to `path` from byte `start` on.

    `alive()` says whether the run may still write: once it is False and the file has nothing
    more, `events()` ends. Events before `history_end` (the file's size when following began)
    are history: `events()` yields them with `history=True` so that a view can fold them
    without drawing or logging each one; the last of them is not history (the view shows
    the state it leads to)."""

    def __init__(self, path: Path, alive: Callable[[], bool], start: int = 0, interval_s: float = POLL_S,
                 max_read: int = MAX_READ, max_line: int = MAX_LINE) -> None:
        self.path = path
        self.alive = alive
        self.offset = start
        self.interval_s = interval_s
        self.max_read = max_read
        self.max_line = max_line
        self._origin = start  # where the splitter's byte count starts in the file
        self._lines = LineSplitter(max_line)  # bounded: a line past max_line is dropped, counted
        self._stop = threading.Event()
        try:
            self.history_end = path.stat().st_size
        except OSError:
            self.history_end = 0
        self.dropped = 0  # lines that were not JSON objects (torn by a crash, or too long)
        self.last_read = 0  # bytes the last poll read

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def read(self) -> list[tuple[dict[str, Any], bool]]:
        """One poll: the complete events added since the last one, each with whether it is history."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(self.max_read)
        except OSError:  # not written yet (a run still importing torch), or unreadable for now
            self.last_read = 0
            return []
        self.offset += len(data)
        self.last_read = len(data)
        cut = self._lines.cut
        out: list[tuple[dict[str, Any], bool]] = []
        for line, end in zip(self._lines.feed(data), self._lines.ends):  # the run store's splitter
            event = self._parse(line) if line.strip() else None
            if event is not None:
                out.append((event, self._origin + end < self.history_end))
        self.dropped += self._lines.cut - cut  # lines too long to be an event of ours
        return out

    def _parse(self, line: bytes) -> dict[str, Any] | None:
        """One line's event, or None (counted as dropped) for a line that is not one JSON object
        (gputui.model.outside: a bad byte costs a character, a hostile line is refused)."""
        try:
            event = outside.parse_object(line, self.max_line)
        except outside.Refused:
            self.dropped += 1
            return None
        return clean_tree(event)  # a cluster run relays what slaves said: data, without control characters

    def events(self) -> Iterator[tuple[dict[str, Any], bool]]:
        """(event, history) as they are written, until the run has ended and the file is read
        to its end, or `stop()`."""
        for batch in self.batches():
            yield from batch

    def batches(self) -> Iterator[list[tuple[dict[str, Any], bool]]]:
        """As `events()`, but the events of one poll together (never an empty list): a view
        folds a whole poll and draws once, however many events it held."""
        while not self.stopped:
            alive = self.alive()  # asked before reading: whatever it wrote before it ended is read below
            batch = self.read()
            if batch:
                yield batch
            if self.last_read >= self.max_read:
                continue  # more is waiting (a slice of a long history); else the file's end was reached
            if not alive:
                return
            self._stop.wait(self.interval_s)
