"""The garbage collector's setting for gputui's long-lived polling processes: the dashboard
and `gputui monitor`.

A lab's round (256 hosts x 8 GPUs) builds some 15,000 objects (samples, their processes,
host lines, the frame that carries them) that live until the next round replaces them.
CPython's default young generation (700 new objects) runs the collector some 50 times a
round, each run promoting the live round towards the oldest generation, and a full
collection follows every 5-10 s: 45 ms over the dashboard's whole heap, about 1% of a
core, a third of its idle cost at that size. With a young generation larger than a
round's objects, each round is freed (by reference counting) before the collector is
due: it runs only when the heap really grows.
"""

from __future__ import annotations

import gc

YOUNG_OBJECTS = 50_000  # the young generation's threshold (CPython's default: 700)


def for_polling() -> None:
    """Size the young generation for rounds of polls (never smaller than it is; idempotent)."""
    young, *older = gc.get_threshold()
    if young and young < YOUNG_OBJECTS:  # 0: the collector is off, and stays off
        gc.set_threshold(YOUNG_OBJECTS, *older)
