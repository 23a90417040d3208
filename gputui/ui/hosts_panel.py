"""Hosts and GPUs: per host its state, GPU model, CPU and RAM; per GPU utilisation and memory
(bars and figures), temperature, power of its limit and a utilisation sparkline. Draws a
HostsFrame; never polls anything itself.

A Line API widget (like Textual's Log): only the visible lines become strips, and each
line is built from segments directly, so a refresh a second of 32 GPUs stays cheap. Names and
messages come from remote hosts: they are cleaned of control characters (segments are never
markup). Focus it (Tab or a click) and the arrows, PgUp/PgDn, Home/End scroll it.

What a narrow panel drops first (see gputui.ui's docstring for the whole order): the
sparkline, then a throttle reason (the power figure stays coloured), then the per-GPU name
column (the model stays on the host line), then the two bars; the figures (utilisation,
memory, temperature, power) are never dropped nor cut. On the
host line RAM goes first, then CPU; the name and the GPU model stay. A reason (an unreachable
host's error) wraps onto the next lines rather than being cut.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputui.model import units
from gputui.dashboard.hosts import HostsFrame
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, throttle_text
from gputui.model.text import clean
from gputui.ui.draw import bar, sparkline

BUSY_PCT = 5.0  # a GPU this busy or more that is throttled shows why (an idle GPU's clocks are low anyway)
HOT_C = 83.0
SEP = " · "
# The figures of a GPU row, never dropped: index, util %, memory, temperature, power (widths padded).
IDX_W, UTIL_W, MEM_W, TEMP_W, POWER_W = 2, 5, 12, 5, 10
FIXED_W = IDX_W + UTIL_W + MEM_W + TEMP_W + POWER_W
MAX_BAR, MAX_NAME, MAX_SPARK = 16, 18, 60
MAX_MODEL = 32  # the host line's GPU model ("8× RTX 6000 Ada Generation" fits; a longer one ends in …)
REASON_LINES = 3  # an unreachable host's reason wraps onto at most this many lines
Line = list[tuple[str, Style | None]]


def short_name(name: str | None) -> str:
    if not name:
        return units.NA
    return clean(name).replace("NVIDIA ", "").replace(" (simulated)", "").strip() or units.NA


def gpu_model(host: HostSnapshot) -> str:
    """The host's GPUs in a few words: "H100 80GB HBM3", "8× A100-SXM4-80GB", "no GPU"."""
    if not host.gpus:
        return "no GPU"
    names = list(dict.fromkeys(short_name(g.name) for g in host.gpus))
    if len(names) == 1:
        text = names[0] if len(host.gpus) == 1 else f"{len(host.gpus)}× {names[0]}"
    else:
        text = " + ".join(names)
    return text if len(text) <= MAX_MODEL else text[: MAX_MODEL - 1] + "…"


def gpu_layout(width: int, throttle: str) -> tuple[int, int, int, int]:
    """How the optional parts of a GPU row share what the figures leave: (bar, name, throttle,
    sparkline) widths, each counting its leading space. The bars and the name column depend on
    the width only, so every row of the panel lines up; a throttle reason takes from the
    sparkline. A narrower panel drops the sparkline, then the throttle reason (the power figure
    stays coloured), the name column, the bars."""
    rest = width - FIXED_W
    bar_w = min(MAX_BAR, rest // 4) if rest >= 12 else 0
    rest -= 2 * bar_w
    name_w = MAX_NAME if rest >= MAX_NAME + 12 else 0
    rest -= name_w
    throttle_w = min(len(throttle) + 1, rest) if throttle and rest >= min(len(throttle) + 1, 8) else 0
    rest -= throttle_w
    spark_w = min(MAX_SPARK, rest) if rest >= 6 else 0
    return bar_w, name_w, throttle_w, spark_w


class HostsView(ScrollView, can_focus=True):
    """The hosts panel: one line per host, one per GPU."""

    COMPONENT_CLASSES = {"hosts--name", "hosts--ok", "hosts--bad", "hosts--dim", "hosts--util", "hosts--mem",
                         "hosts--spark", "hosts--hot", "hosts--throttle", "hosts--run"}
    frame: reactive[HostsFrame | None] = reactive(None)
    error: reactive[str | None] = reactive(None)
    # The GPUs (NVML indices) of this machine that the dashboard's run holds (a program's start
    # event says them): their index is marked on the local host's lines.
    held: reactive[tuple[int, ...]] = reactive(())

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._built_width = 0
        self._seen: set[str] = set()  # the hosts of the last frame: one that appears is scrolled to

    def watch_frame(self) -> None:
        self._rebuild()

    def watch_error(self) -> None:
        self._rebuild()

    def watch_held(self) -> None:
        self._rebuild()

    def on_resize(self) -> None:
        self._rebuild()

    def on_mount(self) -> None:
        self.app.theme_changed_signal.subscribe(self, self._theme_changed)

    def _theme_changed(self, _theme: object) -> None:
        """Another theme (L): the colours of every line, once the new variables are in place."""
        self._styles = {}
        self.call_after_refresh(self._restyle)

    def _restyle(self) -> None:
        self._styles = {}
        self._rebuild()

    def notify_style_update(self) -> None:
        self._styles = {}
        super().notify_style_update()
        self._rebuild()

    def _style(self, name: str) -> Style:
        if name not in self._styles:
            self._styles[name] = self.get_component_rich_style(name, partial=True)
        return self._styles[name]

    @property
    def text_lines(self) -> list[str]:
        """Every line as plain text (the tests read it)."""
        return ["".join(text for text, _style in line) for line in self._lines]

    def _rebuild(self) -> None:
        if not self.is_mounted:
            return
        width = max(20, self.scrollable_content_region.width)
        lines: list[Line] = []
        shown: tuple[int, int] | None = None  # the lines of the first host that appeared
        if self.frame is None:
            lines += self._wrapped(self.error or "waiting for the first round of telemetry ...", width, "hosts--dim")
        else:
            for host in self.frame.hosts:
                first = len(lines)
                lines += self._host_lines(host, width)
                lines.extend(self._gpu_line(host, gpu, width) for gpu in host.gpus)
                if shown is None and self._seen and host.name not in self._seen:
                    shown = (first, len(lines))
            self._seen = {host.name for host in self.frame.hosts}
            if not self.frame.hosts:
                lines.append([("no hosts", self._style("hosts--dim"))])
            if self.error:
                lines += self._wrapped(self.error, width, "hosts--bad")
        self._lines, self._strips, self._built_width = lines, {}, width
        self.virtual_size = Size(width, len(lines))
        if shown is not None:  # once the new size is laid out (the scroll range follows it)
            self.call_after_refresh(self._show_lines, *shown)
        self.refresh()

    def _show_lines(self, start: int, end: int) -> None:
        """Scroll so lines start..end show (a new slave's host and its GPUs), its top first."""
        height = self.scrollable_content_region.height
        top = self.scroll_offset.y
        if height <= 0 or (start >= top and end <= top + height):
            return
        self.scroll_to(y=min(start, max(0, end - height)) if end - start <= height else start, animate=False)

    def _wrapped(self, text: str, width: int, style: str, indent: int = 0, most: int = 0) -> list[Line]:
        """`text` (data: cleaned, never markup) folded at word boundaries to `width`."""
        body = Text(clean(text))
        folded = body.wrap(self.app.console, max(10, width - indent), overflow="fold")
        pieces = [line.plain.rstrip() for line in folded] or [""]
        if most and len(pieces) > most:
            pieces = pieces[:most]
            pieces[-1] = pieces[-1][: max(0, width - indent - 1)] + "…"
        return [[(" " * indent + piece, self._style(style))] for piece in pieces]

    def render_line(self, y: int) -> Strip:
        index = self.scroll_offset.y + y
        width = self.scrollable_content_region.width
        if index >= len(self._lines):
            return Strip.blank(width, self.rich_style)
        strip = self._strips.get(index)
        if strip is None:
            segments = [Segment(text, style) for text, style in self._lines[index]]
            strip = Strip(segments).simplify()
            if strip.cell_length > width:
                strip = Strip.join([strip.crop(0, max(0, width - 1)), Strip([Segment("…")])])
            strip = strip.apply_style(self.rich_style).extend_cell_length(width, self.rich_style)
            self._strips[index] = strip
        return strip.crop(0, width).apply_offsets(0, index)

    def _host_lines(self, host: HostSnapshot, width: int) -> list[Line]:
        """The host's line; a reason that does not fit wraps onto the next lines (indented)."""
        good = host.state.worked
        head: Line = [("● " if good else "✖ ", self._style("hosts--ok" if good else "hosts--bad")),
                      (clean(host.name), self._style("hosts--name"))]
        used = 2 + len(head[1][0])
        if host.state is HostState.OK:
            # Separators start each part, so a part never runs into the name: "vm · H100 ... · cpu 10%".
            parts = [gpu_model(host), f"cpu {units.pct(host.cpu_pct)}",
                     f"RAM {units.mem(host.mem_used_mib, host.mem_total_mib)}"]
            detail = ""
            for part in parts:  # in order of importance: what does not fit is dropped from the end
                if used + len(detail) + len(SEP) + len(part) <= width or not detail:
                    detail += SEP + part
            head.append((detail, self._style("hosts--dim")))
            if not host.message:
                return [head]
            return [head] + self._wrapped(host.message, width, "hosts--dim", indent=4, most=REASON_LINES)
        head.append((f"{SEP}{host.state.value}", self._style("hosts--dim" if good else "hosts--bad")))
        if not host.message:
            return [head]
        return [head] + self._wrapped(host.message, width, "hosts--dim" if good else "hosts--bad", indent=4,
                                      most=REASON_LINES)

    def _gpu_line(self, host: HostSnapshot, gpu: GpuSample, width: int) -> Line:
        util = gpu.util_pct
        busy = gpu.throttled and (util or 0.0) >= BUSY_PCT
        throttle = clean(throttle_text(gpu.throttle), 60) if busy else ""
        name = short_name(gpu.name)
        bar_w, name_w, throttle_w, spark_w = gpu_layout(width, throttle)
        mem_frac = None if gpu.mem_pct is None else gpu.mem_pct / 100.0
        hot = gpu.temperature_c is not None and gpu.temperature_c >= HOT_C
        # Each part starts with its space: "  0 ████░░ 22% ██░░ 1.5/80 GiB 34°C 57/400 W".
        held = host.kind == "local" and gpu.index in self.held
        # Held: "▸0", marked in the index's own two columns (one more from index 10 on).
        line: Line = [(f"▸{gpu.index}", self._style("hosts--run")) if held else (f"{gpu.index:>2}", None)]
        if name_w:
            shown = name if len(name) < name_w else name[: name_w - 2] + "…"
            line.append((" " + shown.ljust(name_w - 1), self._style("hosts--dim")))
        if bar_w:
            line += [(" ", None), (bar(None if util is None else util / 100.0, bar_w - 1, fill="░"), self._style("hosts--util"))]
        util_at = len(line)
        line.append((f" {units.pct(util):>4}", None))
        if bar_w:
            line += [(" ", None), (bar(mem_frac, bar_w - 1, fill="░"), self._style("hosts--mem"))]
        figures: Line = [
            (f" {units.mem(gpu.mem_used_mib, gpu.mem_total_mib)}".ljust(MEM_W), None),
            (f" {units.temp(gpu.temperature_c):>4}", self._style("hosts--hot") if hot else None),
            (f" {units.power(gpu.power_w, gpu.power_limit_w):>9}", self._style("hosts--throttle") if busy else None),
        ]
        if sum(len(text) for text, _style in line + figures) > width:  # a wide figure: no padding then
            figures = [(" " + text.strip(), style) for text, style in figures]
            line[util_at] = (" " + line[util_at][0].strip(), None)
        line += figures
        if throttle_w:
            text = throttle if len(throttle) < throttle_w else throttle[: max(0, throttle_w - 2)] + "…"
            line.append((" " + text, self._style("hosts--throttle")))
        spark_w = min(spark_w, width - sum(len(text) for text, _style in line))  # a wider figure takes from it
        if spark_w >= 6 and self.frame is not None:
            line.append((" " + sparkline(self.frame.util.get((host.name, gpu.index), ()), spark_w - 1), self._style("hosts--spark")))
        return line
