"""Bytes from a stream (a node's output, an events file) split into lines, at a bounded cost.

`LineSplitter.feed` takes each chunk as it comes and searches only that chunk for newlines
(never the whole buffer again: a line that arrives in a thousand chunks costs what its bytes
cost, not a thousand re-splits), and holds at most `max_line` bytes of a line not yet ended.
A line longer than that is cut (`marker` appended: the line is shown, the rest of it until
its newline is dropped) or, with no marker, dropped whole and counted: an events file's
line that long is not an event of ours.

With `redraws`, a program's output is split as a terminal shows it: a carriage return not
followed by a newline ends a segment too (a progress bar's redraw: tqdm, Keras, pip), returned
with its b"\r" kept so that it can be told from a line; b"\r\n" ends a line. A bar that
redraws itself for an hour is a stream of short segments, not one line cut at `max_line`.
"""

from __future__ import annotations

KIB = 1024
OUTPUT_LINE = 64 * KIB  # a process's output line past this is cut (with a marker): a log line, not a dump


class LineSplitter:
    """Splits a stream of byte chunks into lines without their b"\\n", each at most `max_line`
    bytes (a cut line: `max_line` bytes, then `marker`)."""

    def __init__(self, max_line: int, marker: bytes | None = None, redraws: bool = False) -> None:
        self.max_line = max_line
        self.marker = marker
        self.redraws = redraws
        self._cr = False  # a b"\r" ended the last chunk: the next one says whether a newline follows it
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
        it passes `max_line`, before its newline comes); with `redraws`, also the segments that a
        carriage return ends, each with its b"\r" (an empty one is left out)."""
        out: list[bytes] = []
        self.ends = []
        self.fed += len(data)
        start, n = 0, len(data)
        base = self.fed - n
        if self._cr and n:  # the last chunk ended in b"\r": a line's end if a newline comes now
            self._cr = False
            crlf = data[:1] == b"\n"
            start = 1 if crlf else 0
            self.scanned += start
            self._end(b"", out, redraw=not crlf, at=base + start)
        # Where the next b"\n" and b"\r" are (-1: none left in data), each searched for again only
        # once passed: a chunk of plain lines costs one search for a b"\r", a bar one for a b"\n".
        newline = creturn = -2
        while start < n:
            if newline != -1 and newline < start:
                newline = data.find(b"\n", start)
            nl = newline
            if self.redraws:
                if creturn != -1 and creturn < start:
                    creturn = data.find(b"\r", start)
                if creturn >= 0 and (newline < 0 or creturn < newline):
                    nl = creturn
            self.scanned += (nl if nl >= 0 else n) - start + (nl >= 0)
            if nl < 0:
                self._hold(data[start:], out)
                break
            after, redraw = nl + 1, False
            if data[nl] == 13:  # b"\r"
                if after == n:  # the chunk's last byte: the next chunk tells
                    self._hold(data[start:nl], out)
                    self._cr = True
                    break
                if data[after] == 10:  # b"\r\n": a line's end
                    after += 1
                    self.scanned += 1
                else:
                    redraw = True
            if redraw or self._skipping or self._parts or nl - start > self.max_line:
                self._end(data[start:nl], out, redraw, at=base + after)
            else:  # the common case, a whole line in this chunk, inline: a program that prints fast pays little
                out.append(data[start:nl])
                self.line_start = base + after
                self.ends.append(self.line_start)
            start = after
        self.ends.extend([self.fed] * (len(out) - len(self.ends)))  # a line cut before its newline came
        return out

    def _end(self, piece: bytes, out: list[bytes], redraw: bool, at: int) -> None:
        """The segment held so far and `piece` end here (before byte `at` of all fed)."""
        self.line_start = at
        if self._skipping:
            self._skipping = False
        elif self._held + len(piece) > self.max_line:
            self._hold(piece, out)  # cuts or drops it
            self._skipping = False  # and its end is here
        else:
            line = self._take(piece)
            if not redraw:
                out.append(line)
            elif line:
                out.append(line + b"\r")
        self.ends.extend([at] * (len(out) - len(self.ends)))

    def pending(self, most: int) -> bytes:
        """The first `most` bytes of the segment not yet ended (what a terminal shows on its last
        line). At most `most` bytes are copied: a line that comes a byte at a time costs each
        call `most`, not all it holds."""
        if self._skipping:
            return b""
        out: list[bytes] = []
        room = most
        for part in self._parts:
            if room <= 0:
                break
            out.append(part[:room])
            room -= len(out[-1])
        return b"".join(out)

    def finish(self) -> bytes | None:
        """The bytes after the last newline (a last line without one), or None if there are none
        (or they were part of a line already cut or dropped); the splitter is empty after. With
        `redraws`, a last segment that a b"\r" ended keeps it."""
        tail = None if self._skipping or not self._parts else b"".join(self._parts)
        if tail is not None and self._cr:
            tail += b"\r"
        self._parts, self._held, self._skipping, self._cr = [], 0, False, False
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
