"""The one place for display formats: memory, temperature, power, percent, money, rates, counts, durations.

Every view (`gputui monitor`, `gputui run`, the dashboard, the cost tables) formats a number here,
so a value reads the same everywhere. Each function takes None (or a non-finite float) and
returns `NA`. Pure functions, standard library only.

Rules:
- memory: MiB below 1 GiB ("512 MiB"), GiB with one decimal below 10 GiB ("1.5 GiB"), whole GiB
  from 10 GiB ("80 GiB"). A used/total pair takes its unit from the total ("4.0/80 GiB",
  "0.6/80 GiB", "300/512 MiB").
- temperature "36°C", power "57 W" and "57/400 W", percent "25%": whole numbers.
- money: "$12.34" from $1; below $1 four decimals ("$0.2042"), and below a cent at least two
  significant digits ("$0.0050", "$0.0034", "$0.00012"), so a small amount is never rounded up to a cent.
  Prices in the cloud tables keep four decimals from $1 too (`decimals=4`: "$1.1230/h"); a rough
  figure in a sentence may ask for fixed decimals (`fixed=True`: "$0.20/h", "$0.05 budget").
- rate: "458/s", "1.4k/s", "140k/s", "2.2M/s" (one decimal below 10 of a unit); count: "60,000".
- duration: "12s", "2m06s", "2h03m", "3d04h"; a process's age as `ps` shows it (`style="clock"`:
  "42s", "3:07", "5:03:07", "2d 05h"); in a sentence (`style="words"`: "42 s", "5 min").
"""

from __future__ import annotations

import math
from typing import Literal

from gputui.model.outside import number as _num  # a finite float, or None (None, NaN, bools, text)

NA = "n/a"
MIB_PER_GIB = 1024.0


def _gib_number(gib: float) -> str:
    """GiB as a number: one decimal below 10, whole from 10 (9.96 -> "10", not "10.0")."""
    return f"{gib:.1f}" if round(gib, 1) < 10 else f"{gib:.0f}"


def mib(value: float | int | None) -> str:
    """An amount of memory given in MiB: "512 MiB", "1.5 GiB", "80 GiB"."""
    v = _num(value)
    if v is None:
        return NA
    if round(v) < MIB_PER_GIB:
        return f"{v:.0f} MiB"
    return f"{_gib_number(v / MIB_PER_GIB)} GiB"


def size(nbytes: float | int | None) -> str:
    """A file's size in bytes: "512 B", "37 KiB", then as `mib` ("12 MiB", "1.5 GiB")."""
    v = _num(nbytes)
    if v is None:
        return NA
    if v < 1024:
        return f"{v:.0f} B"
    if round(v / 1024) < 1024:
        return f"{v / 1024:.0f} KiB"
    return mib(v / (1 << 20))


def mem(used_mib: float | int | None, total_mib: float | int | None) -> str:
    """Used of total memory (both MiB), in the total's unit: "4.0/80 GiB", "300/512 MiB".
    An unknown total shows the used amount alone; an unknown used amount is NA."""
    used, total = _num(used_mib), _num(total_mib)
    if used is None:
        return NA
    if total is None:
        return mib(used)
    if round(total) < MIB_PER_GIB:
        return f"{used:.0f}/{total:.0f} MiB"
    return f"{_gib_number(used / MIB_PER_GIB)}/{_gib_number(total / MIB_PER_GIB)} GiB"


def temp(celsius: float | int | None) -> str:
    """A temperature: "36°C"."""
    v = _num(celsius)
    return NA if v is None else f"{v:.0f}°C"


def watts(w: float | int | None) -> str:
    """A power: "57 W"."""
    v = _num(w)
    return NA if v is None else f"{v:.0f} W"


def power(draw_w: float | int | None, limit_w: float | int | None) -> str:
    """Power draw of its limit: "57/400 W"; the draw alone when the limit is unknown."""
    draw, limit = _num(draw_w), _num(limit_w)
    if draw is None:
        return NA
    if limit is None:
        return watts(draw)
    return f"{draw:.0f}/{limit:.0f} W"


def pct(x: float | int | None) -> str:
    """A percentage (0..100, not a fraction): "25%"."""
    v = _num(x)
    return NA if v is None else f"{v:.0f}%"


def money(usd: float | int | None, decimals: int = 2, fixed: bool = False) -> str:
    """US dollars: "$12.34", "$1,234.50", "$0.2042", "$0.0050", "$0.00012"; negative "-$1.20".
    `decimals` from $1 (4 for prices: "$1.1230"); `fixed`: `decimals` everywhere ("$0.20")."""
    v = _num(usd)
    if v is None:
        return NA
    sign, a = ("-" if v < 0 else ""), abs(v)
    if fixed:
        return f"{sign}${a:,.{decimals}f}"
    if a == 0:
        return "$0.00"
    if round(a, 4) >= 1:
        return f"{sign}${a:,.{decimals}f}"
    if round(a, 4) >= 0.01:
        return f"{sign}${a:.4f}"
    # Below a cent: at least two significant digits and at least four decimals.
    places = max(4, 1 - math.floor(math.log10(a)))
    return f"{sign}${a:.{places}f}"


def per_hour(usd: float | int | None, decimals: int = 2, fixed: bool = False) -> str:
    """A price per hour: "$0.2042/h", "$32.77/h" (`decimals`, `fixed`: as `money`)."""
    text = money(usd, decimals, fixed)
    return NA if text == NA else f"{text}/h"


def rate(per_s: float | int | None) -> str:
    """Things per second: "0.5/s", "5.2/s", "458/s", "1.4k/s", "140k/s", "2.2M/s"."""
    v = _num(per_s)
    if v is None:
        return NA
    sign, a = ("-" if v < 0 else ""), abs(v)
    if round(a, 1) < 10:
        return f"{sign}{a:.1f}/s"
    if round(a) < 1000:
        return f"{sign}{a:.0f}/s"
    for scale, suffix in ((1e3, "k"), (1e6, "M"), (1e9, "G")):
        n = a / scale
        if round(n) < 1000 or suffix == "G":
            text = f"{n:.1f}" if round(n, 1) < 10 else f"{n:.0f}"
            return f"{sign}{text}{suffix}/s"
    return NA  # not reached


def count(n: float | int | None) -> str:
    """A whole number with thousands separators: "60,000"."""
    v = _num(n)
    return NA if v is None else f"{round(v):,}"


DurationStyle = Literal["short", "clock", "words"]


def duration(seconds: float | int | None, style: DurationStyle = "short") -> str:
    """A length of time; negative reads as 0.
    short (tables, panels): "12s", "2m06s", "2h03m", "3d04h";
    clock (a process's age, a countdown, as `ps` shows it): "42s", "3:07", "5:03:07", "2d 05h";
    words (in a sentence: "cleared after 2 s"): "42 s" below two minutes, then "5 min"."""
    v = _num(seconds)
    if v is None:
        return NA
    if style == "words":
        v = max(0.0, v)
        return f"{v:.0f} s" if v < 120 else f"{v / 60:.0f} min"
    s = int(max(0.0, v))
    if s < 60:
        return f"{s}s"
    if style == "clock":
        if s < 3600:
            return f"{s // 60}:{s % 60:02d}"
        if s < 86400:
            return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"
        return f"{s // 86400}d {s % 86400 // 3600:02d}h"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def plural(n: int, noun: str, many: str | None = None, thousands: bool = False) -> str:
    """`n` and its noun, singular for exactly one: "1 epoch", "2 epochs", "0 processes" (the one
    place plurals are made: never "epoch(s)"); `thousands`: "2,048 GPUs"."""
    count = f"{n:,}" if thousands else str(n)
    if n == 1:
        return f"{count} {noun}"
    return f"{count} {many or _many(noun)}"


def _many(noun: str) -> str:
    """The plural of a noun of ours: "epochs", "processes" ("batch": pass `many` to plural())."""
    return noun + ("es" if noun.endswith(("s", "sh", "x")) else "s")


def plural_of(value: object, noun: str) -> str:
    """plural() for a count read from outside (an event's field): "n/a steps" when it is not a
    whole number."""
    if isinstance(value, int) and not isinstance(value, bool):
        return plural(value, noun)
    return f"{NA} {_many(noun)}"
