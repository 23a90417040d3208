"""Small text drawings the panels share: bars, sparklines, durations. Pure functions (rich only)."""

from __future__ import annotations

import math
from typing import Sequence

EIGHTHS = " ▏▎▍▌▋▊▉█"
SPARKS = "▁▂▃▄▅▆▇█"


def bar(fraction: float | None, width: int, fill: str = " ") -> str:
    """A horizontal bar `width` cells wide, filled to `fraction` (0..1) in eighths, the rest `fill`;
    dots if unknown."""
    if width <= 0:
        return ""
    if fraction is None or math.isnan(fraction):
        return "·" * width
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, part = divmod(eighths, 8)
    text = "█" * full + (EIGHTHS[part] if part else "")
    return text.ljust(width, fill)


def sparkline(values: Sequence[float | None], width: int, top: float = 100.0) -> str:
    """The last `width` values as ▁..█ (0..top); a gap (None) is a space; right-aligned."""
    if width <= 0:
        return ""
    cells = []
    for value in list(values)[-width:]:
        if value is None:
            cells.append(" ")
        else:
            level = max(0.0, min(1.0, value / top)) if top > 0 else 0.0
            cells.append(SPARKS[min(len(SPARKS) - 1, int(level * len(SPARKS)))])
    return "".join(cells).rjust(width)


def duration(seconds: float | None) -> str:
    """12s, 4m05s, 2h03m; "n/a" when unknown."""
    if seconds is None:
        return "n/a"
    seconds = int(max(0.0, seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def gib(mib: float | None) -> str:
    return "n/a" if mib is None else f"{mib / 1024:.0f}" if mib >= 10240 else f"{mib / 1024:.1f}"
