"""Hosts and GPUs: per host its state, per GPU utilisation and memory bars, temperature,
power and a utilisation sparkline. Draws a HostsFrame; never polls anything itself.

A Line API widget (like Textual's Log): only the visible lines become strips, and each
line is built from segments directly, so a refresh a second of 32 GPUs stays cheap. Names and
messages come from remote hosts: they are cleaned of control characters (segments are never
markup), and a line too long for the panel ends in an ellipsis.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.geometry import Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gputui.dashboard.hosts import HostsFrame
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, fmt, throttle_text
from gputui.model.text import clean
from gputui.ui.draw import bar, gib, sparkline

FIXED_W = 32  # every column of a GPU row but the name, the two bars, the throttle reasons and the sparkline
BUSY_PCT = 5.0  # a GPU this busy or more that is throttled shows why (an idle GPU's clocks are low anyway)
Line = list[tuple[str, Style | None]]


def short_name(name: str | None) -> str:
    if not name:
        return "n/a"
    return clean(name).replace("NVIDIA ", "").replace(" (simulated)", "")


class HostsView(ScrollView, can_focus=True):
    """The hosts panel: one line per host, one per GPU."""

    COMPONENT_CLASSES = {"hosts--name", "hosts--ok", "hosts--bad", "hosts--dim", "hosts--util", "hosts--mem",
                         "hosts--spark", "hosts--hot", "hosts--throttle"}
    frame: reactive[HostsFrame | None] = reactive(None)
    error: reactive[str | None] = reactive(None)

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._styles: dict[str, Style] = {}
        self._built_width = 0

    def watch_frame(self) -> None:
        self._rebuild()

    def watch_error(self) -> None:
        self._rebuild()

    def on_resize(self) -> None:
        self._rebuild()

    def notify_style_update(self) -> None:
        self._styles = {}
        super().notify_style_update()
        self._rebuild()

    def _style(self, name: str) -> Style:
        if name not in self._styles:
            self._styles[name] = self.get_component_rich_style(name, partial=True)
        return self._styles[name]

    def _rebuild(self) -> None:
        if not self.is_mounted:
            return
        width = max(20, self.scrollable_content_region.width)
        lines: list[Line] = []
        if self.frame is None:
            lines.append([(clean(self.error or "waiting for the first round of telemetry ..."), self._style("hosts--dim"))])
        else:
            for host in self.frame.hosts:
                lines.append(self._host_line(host))
                lines.extend(self._gpu_line(host, gpu, width) for gpu in host.gpus)
            if not self.frame.hosts:
                lines.append([("no hosts", self._style("hosts--dim"))])
            if self.error:
                lines.append([(clean(self.error), self._style("hosts--bad"))])
        self._lines, self._strips, self._built_width = lines, {}, width
        self.virtual_size = Size(width, len(lines))
        self.refresh()

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

    def _host_line(self, host: HostSnapshot) -> Line:
        good = host.state.worked
        line: Line = [("● " if good else "✖ ", self._style("hosts--ok" if good else "hosts--bad")),
                      (clean(host.name), self._style("hosts--name"))]
        if host.state is HostState.OK:
            detail = f"  cpu {fmt(host.cpu_pct, '%')}  mem {gib(host.mem_used_mib)}/{gib(host.mem_total_mib)} GiB"
            line.append((detail + (f"  {clean(host.message)}" if host.message else ""), self._style("hosts--dim")))
        else:
            reason = f": {clean(host.message)}" if host.message else ""
            line.append((f"  {host.state.value}{reason}", self._style("hosts--dim" if good else "hosts--bad")))
        return line

    def _gpu_line(self, host: HostSnapshot, gpu: GpuSample, width: int) -> Line:
        name_w = 16 if width >= 90 else 0
        rest = max(0, width - FIXED_W - name_w)
        bar_w = max(3, min(20, rest // 4))
        throttle = clean(throttle_text(gpu.throttle), 60) + " " if gpu.throttled and (gpu.util_pct or 0.0) >= BUSY_PCT else ""
        spark_w = max(0, rest - 2 * bar_w - len(throttle))
        util = gpu.util_pct
        mem_frac = None if gpu.mem_pct is None else gpu.mem_pct / 100.0
        hot = gpu.temperature_c is not None and gpu.temperature_c >= 83
        line: Line = [(f"{gpu.index:>2} ", None)]
        if name_w:
            line.append((short_name(gpu.name)[:name_w - 1].ljust(name_w), self._style("hosts--dim")))
        line += [
            (bar(None if util is None else util / 100.0, bar_w), self._style("hosts--util")),
            (f"{fmt(util, '%'):>5} ", None),
            (bar(mem_frac, bar_w), self._style("hosts--mem")),
            (f" {gib(gpu.mem_used_mib)}/{gib(gpu.mem_total_mib)}G".ljust(9) + " ", None),
            (f"{fmt(gpu.temperature_c, '°C'):>5} ", self._style("hosts--hot") if hot else None),
            (f"{fmt(gpu.power_w, 'W'):>5} ", None),
        ]
        if throttle:
            line.append((throttle, self._style("hosts--throttle")))
        if spark_w and self.frame is not None:
            line.append((sparkline(self.frame.util.get((host.name, gpu.index), ()), spark_w), self._style("hosts--spark")))
        return line
