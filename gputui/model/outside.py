"""Data from outside the process, read in one place: the JSON lines of sweep workers, slaves,
event files and remote commands, and the numbers in them.

A line from outside is data and may be hostile. `parse` takes text or bytes (bytes are decoded
with errors="replace": a bad byte costs one character, never the line) and returns the JSON
value, or raises `Refused` saying why: not JSON, longer than `MAX_LINE` characters, nested
deeper than `MAX_DEPTH`. Every error the json module raises on hostile text (ValueError,
RecursionError, OverflowError) becomes `Refused`, so one `except Refused` is all a reader needs.

Bounds, decided once:
- an integer literal beyond +-2**63 (`MAX_INT`) is read as None: no step, count or time of
  ours is that large, no float holds it, sqlite refuses it, and a 4,301-digit one would make
  `int()` raise. The line is kept (its other fields are good) and the value counted as nulled.
- a lone UTF-16 surrogate escape ("\\ud800") becomes U+FFFD: it could not be printed or written.
- `finite(v)`: an int or a float as it is when it is finite (and |int| < 2**63), else None (a
  bool, text, NaN, an infinity). `number(v)`: the same as a float.
- `index(v)`: a whole number 0 <= v <= `MAX_INDEX` (2**31 - 1), else None: what any index or
  count from outside (an evaluation's index, a trial number, a pid, a number of nodes) may be;
  sqlite, range() and numpy all take it.

`Tally` is one source's reader (a worker, a slave, a file): it parses lines and counts what it
refused or nulled, and its `warning()` gives one line the first time, so a flood of bad lines
is said once and counted, never said once a line.
"""

from __future__ import annotations

import json
import math
import re
import threading
from typing import Any

MAX_LINE = 1 << 20  # characters: an event or a protocol message is far shorter (a trial message carries a profile)
MAX_DEPTH = 32  # our deepest message (a protocol event holding an event holding a list of records) is 4 deep
MAX_INT = 2**63  # an integer at or past this (either sign) is not a count of anything, and no float holds it
MAX_INDEX = 2**31 - 1  # the largest index or count taken from outside


class Refused(ValueError):
    """A line from outside that is not taken; its text says why (one short phrase)."""


_state = threading.local()  # integers nulled by the parse running on this thread


def _int(text: str) -> int | None:
    """parse_int: the integer, or None (counted) when it is out of +-2**63."""
    if len(text) < 19:  # at most 18 digits: always inside
        return int(text)
    if len(text) <= 20:  # 19 or 20 characters, a sign perhaps: look
        value = int(text)
        if -MAX_INT < value < MAX_INT:
            return value
    _state.nulled = getattr(_state, "nulled", 0) + 1  # longer: out of range, and never given to int()
    return None


_DECODER = json.JSONDecoder(parse_int=_int)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")
_WS = " \t\r\n"  # the whitespace JSON allows around a value


def _fix_strings(value: Any) -> Any:
    """Lone surrogates in every string (keys too) replaced by U+FFFD."""
    if isinstance(value, str):
        return value.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    if isinstance(value, dict):
        return {_fix_strings(k): _fix_strings(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_fix_strings(v) for v in value]
    return value


def _depth(value: Any, limit: int) -> bool:
    """Whether `value` nests containers deeper than `limit` (walked without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        if depth > limit:
            return True
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def decode(data: bytes | str) -> str:
    """Bytes from outside as text: UTF-8, a bad byte replaced (U+FFFD), never an error."""
    return data if isinstance(data, str) else data.decode("utf-8", errors="replace")


def parse_counted(text: bytes | str, max_chars: int = MAX_LINE) -> tuple[Any, int]:
    """The JSON value of one line from outside and how many of its integers were out of range
    (read as None); Refused if it is not one JSON value we take."""
    text = decode(text).strip(_WS)
    if len(text) > max_chars:
        raise Refused(f"a line longer than {max_chars} characters")
    _state.nulled = 0
    try:
        value, end = _DECODER.raw_decode(text)
    except RecursionError:
        raise Refused("a line of JSON nested too deep") from None
    except json.JSONDecodeError as exc:
        raise Refused(f"a line that is not JSON ({exc.msg})") from None
    except (ValueError, OverflowError) as exc:  # whatever else a literal makes the decoder raise
        raise Refused(f"a line that is not JSON ({type(exc).__name__})") from None
    if end != len(text):
        raise Refused("a line that is not JSON (text after the value)")
    if (text.count("[") + text.count("{") > MAX_DEPTH) and _depth(value, MAX_DEPTH):
        raise Refused(f"a line of JSON nested deeper than {MAX_DEPTH}")
    if "\\u" in text and _SURROGATE.search(text):
        value = _fix_strings(value)
    return value, _state.nulled


def parse(text: bytes | str, max_chars: int = MAX_LINE) -> Any:
    """The JSON value of one line (or document) from outside; Refused if it is not one we take.
    Integers out of +-2**63 are None."""
    return parse_counted(text, max_chars)[0]


def parse_object(text: bytes | str, max_chars: int = MAX_LINE) -> dict[str, Any]:
    """As `parse`, for a line that must be one JSON object."""
    value = parse(text, max_chars)
    if not isinstance(value, dict):
        raise Refused("a line that is not a JSON object")
    return value


class Tally:
    """One source's lines (`source` names it in the warning: "worker on slot a", "slave s1"):
    `line()` parses each, counting the refused lines and the nulled integers; `warning()` says
    the first problem once (then None), so a flood is one line, and the counts say the rest."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.refused = 0  # lines not taken
        self.nulled = 0  # integers out of range, read as None
        self._first: str | None = None
        self._said = False

    def line(self, text: bytes | str, max_chars: int = MAX_LINE) -> dict[str, Any] | None:
        """The line's JSON object, or None (counted) for a line that is not one."""
        try:
            value, nulled = parse_counted(text, max_chars)
        except Refused as exc:
            self.refuse(str(exc))
            return None
        if not isinstance(value, dict):
            self.refuse("a line that is not a JSON object")
            return None
        if nulled:
            self.nulled += nulled
            if self._first is None:
                self._first = "an integer beyond +-2**63 (read as not known)"
        return value

    def refuse(self, why: str) -> None:
        """Count a line the caller refused (for its own reason)."""
        self.refused += 1
        if self._first is None:
            self._first = why

    def warning(self) -> str | None:
        """The one line to say the first time this source sent something not taken, else None."""
        if self._first is None or self._said:
            return None
        self._said = True
        return f"{self.source} sent {self._first}; ignored (any more are counted, not shown)"

    def summary(self) -> str | None:
        """How much was not taken in all (None when nothing was)."""
        if not (self.refused or self.nulled):
            return None
        return f"{self.source}: {self.refused} {'line' if self.refused == 1 else 'lines'} refused, {self.nulled} {'integer' if self.nulled == 1 else 'integers'} out of range"


def finite(value: Any) -> int | float | None:
    """A number from outside as it is if it is finite, else None: text, a bool, NaN, an
    infinity, or an integer at or past +-2**63 (`float()` of a huge one overflows)."""
    kind = type(value)
    if kind is float:  # what JSON gives: checked first, this runs for every number of every event
        return value if value - value == 0.0 else None  # NaN and the infinities give NaN
    if kind is int:
        return value if -MAX_INT < value < MAX_INT else None
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value if -MAX_INT < value < MAX_INT else None
    return None


def number(value: Any) -> float | None:
    """`finite(value)` as a float (None stays None)."""
    found = finite(value)
    return None if found is None else float(found)


_NUMBER_TEXT = re.compile(r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$")


def number_text(text: str) -> int | float | None:
    """A number written as decimal text (a program's output: "0.812", "98", "1e-3"): an int when
    written as one, else a float; None for anything else (nan, inf, hex, a thousand digits)."""
    if len(text) > 64 or not _NUMBER_TEXT.match(text):
        return None
    stripped = text.strip()
    if stripped.lstrip("+-").isdigit():
        return finite(int(stripped))
    return finite(float(stripped))


def index(value: Any) -> int | None:
    """A whole number 0 <= value <= MAX_INDEX from outside (an index, a count, a pid), else None."""
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):
        return value if 0 <= value <= MAX_INDEX else None
    return None
