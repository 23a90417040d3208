"""Compact JSON for the documents written once a round: `gputui monitor --json` and `--record`
(a lab's round of 256 hosts x 8 GPUs is 1.1 MB a second).

orjson writes the same bytes as `json.dumps(doc, separators=(",", ":"))` about ten times faster
(12.4 -> 1.3 ms for that round here), and NaN as null, which keeps each line JSON. json writes
the line where orjson cannot: an integer past 64 bits, text beyond ASCII (json escapes it, so a
line is ASCII whatever stdout's encoding), or orjson not installed.
"""

from __future__ import annotations

import json
from typing import Any

_dumps: Any = None


def compact(doc: Any) -> str:
    """`doc` (plain values: dicts with str keys, lists, tuples, str, int, float, bool, None) on one line."""
    global _dumps
    if _dumps is None:
        try:
            import orjson

            _dumps = orjson.dumps
        except ImportError:
            _dumps = False
    if _dumps:
        try:
            data = _dumps(doc)
        except TypeError:  # orjson.JSONEncodeError: an integer past 64 bits, a lone surrogate
            data = None
        if data is not None and data.isascii():
            return str(data.decode("ascii"))
    return json.dumps(doc, separators=(",", ":"), check_circular=False)
