"""Bytes from a stream (a node's output, an events file) split into lines, at a bounded cost.

`LineSplitter.feed` takes each chunk as it comes and searches only that chunk for newlines
(never the whole buffer again: a line that arrives in a thousand chunks costs what its bytes
cost, not a thousand re-splits), and holds at most `max_line` bytes of a line not yet ended.
A line longer than that is cut (`marker` appended: the line is shown, the rest of it until
its newline is dropped) or, with no marker, dropped whole and counted: an events file's
line that long is not an event of ours.
"""

from __future__ import annotations

KIB = 1024
OUTPUT_LINE = 64 * KIB  # a process's output line past this is cut (with a marker): a log line, not a dump


class LineSplitter:
    """Splits a stream of byte chunks into lines without their b"\\n", each at most `max_line`
    bytes (a cut line: `max_line` bytes, then `marker`)."""

    def __init__(self, max_line: int, marker: bytes | None = None) -> None:
        self.max_line = max_line
        self.marker = marker
        self._parts: list[bytes] = []  # the line not yet ended, in pieces (joined once, when it ends)
        self._held = 0  # their bytes: never more than max_line
        self._skipping = False  # inside an over-long line already cut or dropped: skip to its newline
        self.fed = 0  # bytes fed in all
        self.scanned = 0  # bytes searched for a newline: each byte once (`fed`), never the buffer again
        self.cut = 0  # lines cut (with a marker) or dropped (without)
        self.line_start = 0  # where the line not yet ended starts, in bytes fed (all before it is split)
        self.ends: list[int] = []  # where each line the last feed() returned ended, in bytes fed (after its newline)

    @property
    def held(self) -> int:
        """Bytes of a line not yet ended that are kept for the next chunk."""
        return self._held

    def feed(self, data: bytes) -> list[bytes]:
        """The lines that `data` completes (and, with a marker, an over-long line cut as soon as
        it passes `max_line`, before its newline comes)."""
        out: list[bytes] = []
        self.ends = []
        self.fed += len(data)
        start, n = 0, len(data)
        while start < n:
            nl = data.find(b"\n", start)
            self.scanned += (nl if nl >= 0 else n) - start + (nl >= 0)
            if nl < 0:
                self._hold(data[start:], out)
                break
            self.line_start = self.fed - n + nl + 1
            if self._skipping:
                self._skipping = False
            elif self._held + nl - start > self.max_line:
                self._hold(data[start:nl], out)  # cuts or drops it
                self._skipping = False  # and its newline is here
            else:
                out.append(self._take(data[start:nl]))
            self.ends.extend([self.line_start] * (len(out) - len(self.ends)))
            start = nl + 1
        self.ends.extend([self.fed] * (len(out) - len(self.ends)))  # a line cut before its newline came
        return out

    def finish(self) -> bytes | None:
        """The bytes after the last newline (a last line without one), or None if there are none
        (or they were part of a line already cut or dropped); the splitter is empty after."""
        tail = None if self._skipping or not self._parts else b"".join(self._parts)
        self._parts, self._held, self._skipping = [], 0, False
        return tail

    def _take(self, piece: bytes) -> bytes:
        if not self._parts:
            return piece
        line = b"".join(self._parts) + piece
        self._parts, self._held = [], 0
        return line

    def _hold(self, piece: bytes, out: list[bytes]) -> None:
        """Keep `piece` of a line not yet ended, or cut/drop the line once it passes max_line."""
        if self._skipping or not piece:
            return
        if self._held + len(piece) <= self.max_line:
            self._parts.append(piece)
            self._held += len(piece)
            return
        self.cut += 1
        if self.marker is not None:
            room = self.max_line - self._held
            out.append(b"".join(self._parts) + piece[:room] + self.marker)
        self._parts, self._held, self._skipping = [], 0, True


def cut_marker(max_line: int) -> bytes:
    """What ends a line cut at `max_line` bytes."""
    return f" … [line cut at {max_line // KIB} KiB]".encode()
