"""Small text drawings the panels share: bars and sparklines. Pure functions. Numbers are
formatted by gputui.model.units, the one place for display formats."""

from __future__ import annotations

import math
from typing import Sequence

from gputui.model import units

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
