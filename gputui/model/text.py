"""Text from outside the process (remote hosts, slaves, profiles, event files) made safe to show.

`clean()` turns such a value into one printable line: terminal escape sequences (CSI, OSC
such as OSC 52's clipboard write, DCS, ...) are dropped whole, other control characters
(C0, DEL, C1, and the bidi overrides that reorder what a terminal shows) are dropped,
line breaks and tabs become spaces, and an overlong value is cut with an ellipsis.
Parsers call it where the text enters; views render the result as `rich.text.Text`,
never as markup, so `[/]` or `[link=...]` in a GPU name stays literal.
"""

from __future__ import annotations

import re
from typing import Any, overload

MAX_CHARS = 512  # a value longer than this is data gone wrong: cut, with an ellipsis
ELLIPSIS = "…"

_ESCAPE = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]?"  # CSI: ESC [ parameters intermediates final
    r"|\x1b\][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC ... ended by BEL or ST (or by nothing)
    r"|\x1b[PX^_][^\x1b\x9c]*(?:\x1b\\|\x9c)?"  # DCS, SOS, PM, APC ... ST
    r"|\x1b[ -/]*[0-~]?"  # any other escape (charset, keypad, ...)
    r"|\x9b[0-?]*[ -/]*[@-~]?"  # 8-bit CSI
    r"|[\x90\x98\x9d\x9e\x9f][^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # 8-bit DCS, SOS, OSC, PM, APC
)
_SPACE = re.compile("[\t\n\v\f\r\x1c-\x1f\x85\u2028\u2029]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


@overload
def clean(text: str, limit: int = MAX_CHARS) -> str: ...
@overload
def clean(text: None, limit: int = MAX_CHARS) -> None: ...
def clean(text: str | None, limit: int = MAX_CHARS) -> str | None:
    """`text` as one printable line of at most `limit` characters (None stays None)."""
    if text is None:
        return None
    text = str(text)
    if text.isprintable() and len(text) <= limit:  # the common case, cheap (isprintable: no Cc, Cf, Zl, Zp)
        return text
    text = _CONTROL.sub("", _SPACE.sub(" ", _ESCAPE.sub("", text)))
    if len(text) > limit:
        text = text[: max(0, limit - 1)] + ELLIPSIS
    return text


_PLAIN = (int, float, bool, type(None))  # JSON values with no text in them


def clean_tree(value: Any, limit: int = MAX_CHARS) -> Any:
    """Every string in a parsed JSON value (dict keys too) cleaned; other values as they are."""
    if isinstance(value, str):
        return clean(value, limit)
    if isinstance(value, dict):
        for key, item in value.items():  # the common case first: a flat event, nothing to clean (a copy)
            if not (type(key) is str and key.isprintable() and len(key) <= limit):
                break
            kind = type(item)
            if not (kind in _PLAIN or (kind is str and item.isprintable() and len(item) <= limit)):
                break
        else:
            return dict(value)
        return {clean(k, limit) if isinstance(k, str) else k: clean_tree(v, limit) for k, v in value.items()}
    if isinstance(value, list):
        return [clean_tree(v, limit) for v in value]
    return value
