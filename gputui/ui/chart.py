"""A line chart in braille dots (2x4 per cell): loss and test accuracy against the step.

Drawn here rather than with plotext: about a hundred lines, no dependency, and fast enough
to redraw on every step event. Loss is on a log scale (left axis), accuracy linear (right).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

from rich.style import Style
from rich.text import Text

# Bit of each dot in a braille cell, by [row][column] within the cell.
DOTS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))
AXIS_W = 7  # width of each side's labels


@dataclass(frozen=True)
class Series:
    points: Sequence[tuple[float, float]]
    low: float
    high: float
    style: Style
    log: bool = False

    def y(self, value: float) -> float:
        """`value` as 0 (bottom) .. 1 (top)."""
        lo, hi, v = self.low, self.high, value
        if self.log:
            lo, hi, v = math.log10(max(lo, 1e-9)), math.log10(max(hi, 1e-9)), math.log10(max(value, 1e-9))
        return 0.5 if hi <= lo else (v - lo) / (hi - lo)


class Canvas:
    """Braille cells `width` x `height`; each dot remembers the style of the last series drawn."""

    def __init__(self, width: int, height: int) -> None:
        self.width, self.height = width, height
        self.bits = [[0] * width for _ in range(height)]
        self.styles: list[list[Style | None]] = [[None] * width for _ in range(height)]

    def dot(self, px: int, py: int, style: Style) -> None:
        """Pixel (px, py), py counted from the bottom."""
        row = self.height * 4 - 1 - py
        if 0 <= px < self.width * 2 and 0 <= row < self.height * 4:
            cy, cx = divmod(row, 4)[0], px // 2
            self.bits[cy][cx] |= DOTS[row % 4][px % 2]
            self.styles[cy][cx] = style

    def line(self, x0: int, y0: int, x1: int, y1: int, style: Style) -> None:
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for i in range(steps + 1):
            self.dot(round(x0 + (x1 - x0) * i / steps), round(y0 + (y1 - y0) * i / steps), style)

    def rows(self) -> list[Text]:
        out = []
        for bits, styles in zip(self.bits, self.styles):
            text = Text()
            for b, s in zip(bits, styles):
                text.append(chr(0x2800 + b) if b else " ", s or Style())
            out.append(text)
        return out


def plot(canvas: Canvas, series: Series, x_max: float) -> None:
    w, h = canvas.width * 2 - 1, canvas.height * 4 - 1
    pixels = [(round(w * x / x_max) if x_max > 0 else 0, round(h * series.y(y))) for x, y in series.points]
    for (x0, y0), (x1, y1) in zip(pixels, pixels[1:]):
        canvas.line(x0, y0, x1, y1, series.style)
    if len(pixels) == 1:
        canvas.dot(*pixels[0], series.style)


def _label(value: float | None, digits: int, suffix: str = "") -> str:
    return "" if value is None else f"{value:.{digits}f}{suffix}"


def training_chart(loss: Sequence[tuple[float, float]], acc: Sequence[tuple[float, float]], width: int, height: int,
                   x_max: float | None, steps_per_epoch: int | None, loss_style: Style, acc_style: Style,
                   axis_style: Style) -> Text:
    """The whole chart, axes and labels included, `width` x `height` cells."""
    inner_w, inner_h = width - 2 * AXIS_W, height - 1
    if inner_w < 8 or inner_h < 2:
        return Text("(too small for the chart)", style=axis_style)
    xs = [x for x, _ in loss] + [x for x, _ in acc]
    top_x = max([x_max or 0.0] + xs) or 1.0
    canvas = Canvas(inner_w, inner_h)
    loss_s = acc_s = None
    if loss:
        values = [y for _, y in loss]
        loss_s = Series(loss, min(values) * 0.9, max(values) * 1.1, loss_style, log=True)
        plot(canvas, loss_s, top_x)
    if acc:
        values = [y for _, y in acc]
        acc_s = Series(acc, math.floor(min(values)) - 0.5 if min(values) < 99.5 else 99.0, 100.0, acc_style)
        plot(canvas, acc_s, top_x)
    lines = []
    for i, row in enumerate(canvas.rows()):
        left = right = ""
        if i == 0:
            left, right = _label(loss_s.high if loss_s else None, 3), _label(acc_s.high if acc_s else None, 1, "%")
        elif i == inner_h - 1:
            left, right = _label(loss_s.low if loss_s else None, 3), _label(acc_s.low if acc_s else None, 1, "%")
        elif i == inner_h // 2:
            left, right = "loss", "acc"
        line = Text(left.rjust(AXIS_W - 1) + "┤", style=loss_style if left else axis_style)
        line.stylize(axis_style, AXIS_W - 1)
        line.append_text(row)
        line.append("├", axis_style)
        line.append(right.ljust(AXIS_W - 1), acc_style)
        lines.append(line)
    lines.append(_x_axis(inner_w, top_x, steps_per_epoch, axis_style))
    return Text("\n").join(lines)


def _x_axis(width: int, x_max: float, steps_per_epoch: int | None, style: Style) -> Text:
    """Epoch ticks under the plot (steps when the epoch length is unknown)."""
    cells = [" "] * width
    marks: list[tuple[float, str]]
    if steps_per_epoch:
        epochs = int(x_max // steps_per_epoch)
        every = max(1, math.ceil(epochs * 4 / max(1, width)))
        marks = [(e * steps_per_epoch, f"{e}") for e in range(0, epochs + 1, every)]
    elif x_max >= 4:
        marks = [(x_max * k / 4, f"{x_max * k / 4:.0f}") for k in range(5)]
    else:  # nothing to scale yet
        marks = []
    for x, label in marks:
        col = min(width - 1, round((width - 1) * x / x_max)) if x_max > 0 else 0
        for j, ch in enumerate(label):
            if col + j < width:
                cells[col + j] = ch
    name = "epoch" if steps_per_epoch else "step"
    return Text(" " * (AXIS_W - len(name) - 1) + name + " " + "".join(cells), style=style)
