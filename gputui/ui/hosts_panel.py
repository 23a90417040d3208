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

The lab view (gputui.ui.lab_panel): when the per-GPU lines would fill more than LAB_PAGES
heights of the panel, it shows one line per host under the fleet's line (which stays at the
top), and only the lines on screen are built, each kept while its host's line is the same: a
round costs the lines in view, whatever the fleet. s, /, Enter and U act there (gputui.ui.bindings.LAB_KEYS).
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.css.scalar import Unit
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.strip import Strip

from gputui.model import units
from gputui.dashboard.hosts import HostsFrame
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, throttle_text
from gputui.model.text import clean
from gputui.monitor.lab import HostLine, LabFilter
from gputui.ui.bindings import lab_bindings
from gputui.ui.draw import bar, sparkline
from gputui.ui.lines import LinesView
from gputui.ui.themed import Themed
from gputui.ui import lab_panel

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
# The lab view takes over when the per-GPU lines would fill more than this many heights of the
# panel: a few lines to scroll keep every GPU's figures (six one-GPU hosts at 80x24 stay per GPU),
# and the per-GPU view's cost stays bounded by the panel's size.
LAB_PAGES = 2


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


class HostsView(LinesView, Themed, can_focus=True):
    """The hosts panel: one line per host, one per GPU; the lab view (one line per host) when
    they do not fit. `only`: draw that host alone (the host screen), never the lab view."""

    BINDINGS = lab_bindings()
    COMPONENT_CLASSES = {"hosts--name", "hosts--ok", "hosts--bad", "hosts--dim", "hosts--util", "hosts--mem",
                         "hosts--spark", "hosts--hot", "hosts--throttle", "hosts--run", "hosts--warn", "hosts--free",
                         "hosts--full", "hosts--cursor", "hosts--fleet"}
    # A new frame repaints what it changed (watch_frame): in the lab view, only the lines whose
    # content changed, not the whole panel.
    frame: reactive[HostsFrame | None] = reactive(None, repaint=False)
    error: reactive[str | None] = reactive(None)
    # The GPUs (NVML indices) of this machine that the dashboard's run holds (a program's start
    # event says them): their index is marked on the local host's lines.
    held: reactive[tuple[int, ...]] = reactive(())

    class HostChosen(Message):
        """Enter on a host line of the lab view: open that host."""

        def __init__(self, name: str) -> None:
            super().__init__()
            self.name = name

    class FilterAsked(Message):
        """/ in the lab view: ask for a filter (the app asks in a dialog, then calls set_filter)."""

        def __init__(self, current: str) -> None:
            super().__init__()
            self.current = current

    def __init__(self, only: str | None = None, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.only = only
        self._lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._built_width = 0
        self._seen: set[str] = set()  # the hosts of the last frame: one that appears is scrolled to
        # The lab view: its rows (sorted, filtered), header lines, layout, the selected host, and
        # its built strips by content (this round's and the last's: what did not change is reused).
        self.lab = False
        self.lab_sort = "listed"
        self.lab_filter = LabFilter()
        self._rows: list[HostLine] = []
        self._header: list[Line] = []
        self._layout = (0, 0)
        self._cursor = 0
        self._cursor_name: str | None = None
        self._cache: dict[tuple[object, ...], Strip] = {}
        self._old: dict[tuple[object, ...], Strip] = {}
        self._content: dict[int, tuple[tuple[str, Style | None], ...]] = {}  # a row's line (its text and styles) this round
        self._shown: tuple[object, list[object]] | None = None  # the screen's lines as last repainted
        self.built = 0  # lab strips built (the tests and the benchmark read it)

    def watch_frame(self) -> None:
        self._rebuild()

    def watch_error(self) -> None:
        self._rebuild()

    def watch_held(self) -> None:
        self._rebuild()

    def on_resize(self) -> None:
        self._rebuild()

    def restyled(self) -> None:
        """Another theme (L): the colours of every line, once the new variables are in place."""
        self._cache, self._old, self._shown = {}, {}, None
        self._rebuild()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self.restyled()

    @property
    def text_lines(self) -> list[str]:
        """Every line as plain text (the tests read it; in the lab view, every host's line is built)."""
        if self.lab:
            width = self._built_width
            lines = self._header + [lab_panel.lab_line(row, width, *self._layout, self._style) for row in self._rows]
            return ["".join(text for text, _style in line) for line in lines]
        return ["".join(text for text, _style in line) for line in self._lines]

    @property
    def lab_rows(self) -> list[HostLine]:
        """The lab view's host lines in their order on screen (sorted, filtered)."""
        return list(self._rows)

    @property
    def selected(self) -> str | None:
        """The lab view's selected host."""
        return self._rows[self._cursor].name if self.lab and self._rows else None

    def _room(self) -> int:
        """The panel's height for lines. A panel whose height follows its lines up to a cap (the
        narrow layout) counts the cap, so the choice of view does not feed on itself."""
        room = self.scrollable_content_region.height
        cap, height = self.styles.max_height, self.styles.height
        if height is not None and height.is_auto and cap is not None and cap.unit is Unit.CELLS:
            room = max(room, int(cap.value) - self.styles.gutter.height)
        return room

    def _wants_lab(self) -> bool:
        frame = self.frame
        if self.only is not None or frame is None or frame.lab is None:
            return False
        room = self._room()
        if room <= 0:
            return self.lab
        return len(frame.hosts) + frame.gpu_count > LAB_PAGES * room

    def _rebuild(self) -> None:
        if not self.is_mounted:
            return
        lab = self._wants_lab()
        if lab != self.lab:
            self.lab = lab
            self._shown = None  # the other view was on screen: repaint it all
            self.border_subtitle = None
            self.scroll_to(y=0, animate=False)
            self.refresh_bindings()  # the lab keys show in the footer (or leave it)
        if lab:
            self._rebuild_lab()
            return
        width = max(20, self.scrollable_content_region.width)
        lines: list[Line] = []
        shown: tuple[int, int] | None = None  # the lines of the first host that appeared
        if self.frame is None:
            lines += self._wrapped(self.error or "waiting for the first round of telemetry ...", width, "hosts--dim")
        else:
            hosts = self.frame.hosts if self.only is None else tuple(h for h in self.frame.hosts if h.name == self.only)
            for host in hosts:
                first = len(lines)
                lines += self._host_lines(host, width)
                lines.extend(self._gpu_line(host, gpu, width) for gpu in host.gpus)
                if shown is None and self._seen and host.name not in self._seen:
                    shown = (first, len(lines))
            self._seen = {host.name for host in hosts}
            if not hosts:
                lines.append([("no hosts", self._style("hosts--dim"))])
            if self.error:
                lines += self._wrapped(self.error, width, "hosts--bad")
        self._lines, self._strips, self._built_width = lines, {}, width
        self.virtual_size = Size(width, len(lines))
        if shown is not None:  # once the new size is laid out (the scroll range follows it)
            self.call_after_refresh(self._show_lines, *shown)
        self.refresh()

    # the lab view ---------------------------------------------------------------------------------
    def _rebuild_lab(self) -> None:
        """This round's order and header; the lines themselves are built when drawn."""
        frame = self.frame
        assert frame is not None and frame.lab is not None
        width = max(20, self.scrollable_content_region.width)
        lab = frame.lab
        self._rows = lab_panel.lab_rows(lab.lines, self.lab_sort, self.lab_filter)
        self._layout = lab_panel.lab_layout(self._rows)
        header = self._wrapped(lab.totals.line(), width, "hosts--fleet", indent=0, most=2)
        if self.error:
            header.append([(lab_panel.cut(clean(self.error), width), self._style("hosts--bad"))])
        if not self._rows:
            header.append([("no host matches the filter (/ and Enter on an empty line clear it)", self._style("hosts--dim"))])
        self._header = header
        names = [row.name for row in self._rows]
        if self._cursor_name in names:
            self._cursor = names.index(self._cursor_name)
        else:
            self._cursor = min(self._cursor, max(0, len(self._rows) - 1))
            self._cursor_name = names[self._cursor] if names else None
        subtitle = lab_panel.filter_text(self.lab_filter, len(self._rows), len(lab.lines), self.lab_sort)
        if self.border_subtitle is None or subtitle.plain != str(self.border_subtitle):
            self.border_subtitle = subtitle
        self._built_width = width
        # The strips the last frame drew serve this round; when no frame came since the last
        # rebuild (two rounds, or a resize and a round, in a row), the older ones stay.
        if self._cache:
            self._old, self._cache = self._cache, {}
        self._content = {}
        self.virtual_size = Size(width, len(header) + len(self._rows))
        self._repaint_changed()

    def _repaint_changed(self) -> None:
        """Repaint the lines on screen whose content changed since the last repaint; all of them
        after a change of size, scroll, cursor, focus or layout (a lab's round changes the busy
        hosts' figures, seldom the idle ones')."""
        region = self.scrollable_content_region
        top = self.scroll_offset.y
        view = (region.size, top, self._cursor, self.has_focus, self._layout, self._built_width, len(self._header))
        lines: list[object] = []
        for y in range(region.height):
            if y < len(self._header):
                lines.append(tuple(self._header[y]))
            else:
                index = top + y - len(self._header)
                lines.append(self._line(index) if index < len(self._rows) else None)
        before, self._shown = self._shown, (view, lines)
        if before is None or before[0] != view:
            self.refresh()
            return
        changed = [Region(0, y, region.width, 1) for y, (was, now) in enumerate(zip(before[1], lines)) if was != now]
        if changed:
            self.refresh(*changed)

    def _line(self, index: int) -> tuple[tuple[str, Style | None], ...]:
        """Row `index`'s lab line, as (text, style) pairs, made once a round."""
        line = self._content.get(index)
        if line is None:
            line = self._content[index] = tuple(lab_panel.lab_line(self._rows[index], self._built_width, *self._layout,
                                                                   self._style))
        return line

    def _lab_strip(self, index: int, width: int, base: Style) -> Strip:
        chosen = index == self._cursor and self.has_focus
        line = self._line(index) if width == self._built_width else tuple(
            lab_panel.lab_line(self._rows[index], width, *self._layout, self._style))
        key = (line, width, chosen)  # what it shows: a host whose figures did not change is drawn as it was
        strip = self._cache.get(key) or self._old.get(key)
        if strip is None:
            self.built += 1
            strip = Strip([Segment(text, style) for text, style in line]).simplify()
            if chosen:
                strip = strip.apply_style(self._style("hosts--cursor"))
            strip = strip.apply_style(base).extend_cell_length(width, base).crop(0, width)
        self._cache[key] = strip
        return strip

    def _move(self, to: int) -> None:
        if not self._rows:
            return
        self._cursor = max(0, min(len(self._rows) - 1, to))
        self._cursor_name = self._rows[self._cursor].name
        rows = max(1, self.scrollable_content_region.height - len(self._header))
        top = self.scroll_offset.y
        if self._cursor < top:
            self.scroll_to(y=self._cursor, animate=False)
        elif self._cursor >= top + rows:
            self.scroll_to(y=self._cursor - rows + 1, animate=False)
        self.refresh()

    def set_filter(self, text: str) -> None:
        """The lab view's filter (`/`): LabFilter's words; empty clears."""
        self.lab_filter = LabFilter.parse(text)
        self._cursor = 0
        self.scroll_to(y=0, animate=False)
        self._rebuild()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action in ("sort", "filter", "open", "users"):
            return self.lab
        return True

    def action_sort(self) -> None:
        self.lab_sort = lab_panel.next_sort(self.lab_sort)
        self._rebuild()

    def action_filter(self) -> None:
        self.post_message(self.FilterAsked(str(self.lab_filter)))

    def action_open(self) -> None:
        if self.selected is not None:
            self.post_message(self.HostChosen(self.selected))

    async def action_users(self) -> None:
        await self.app.run_action("users")

    def action_scroll_up(self) -> None:
        self._move(self._cursor - 1) if self.lab else super().action_scroll_up()

    def action_scroll_down(self) -> None:
        self._move(self._cursor + 1) if self.lab else super().action_scroll_down()

    def action_page_up(self) -> None:
        step = max(1, self.scrollable_content_region.height - len(self._header))
        self._move(self._cursor - step) if self.lab else super().action_page_up()

    def action_page_down(self) -> None:
        step = max(1, self.scrollable_content_region.height - len(self._header))
        self._move(self._cursor + step) if self.lab else super().action_page_down()

    def action_scroll_home(self) -> None:
        self._move(0) if self.lab else super().action_scroll_home()

    def action_scroll_end(self) -> None:
        self._move(len(self._rows) - 1) if self.lab else super().action_scroll_end()

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if self.lab and offset is not None and offset.y >= len(self._header):
            index = self.scroll_offset.y + offset.y - len(self._header)
            if index < len(self._rows):
                self._move(index)
                if event.chain >= 2:
                    self.action_open()

    def on_focus(self) -> None:
        if self.lab:
            self.refresh()  # the selection shows while the panel has the focus

    def on_blur(self) -> None:
        if self.lab:
            self.refresh()

    # the per-GPU view ----------------------------------------------------------------------------
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
        width, base = self.width_style()
        if self.lab:
            if y < len(self._header):
                return self._plain_strip(self._header[y], width, base).apply_offsets(0, y)
            index = self.scroll_offset.y + y - len(self._header)
            if index >= len(self._rows) or width <= 0:
                return Strip.blank(width, base)
            return self._lab_strip(index, width, base).apply_offsets(0, index + len(self._header))
        index = self.scroll_offset.y + y
        if index >= len(self._lines):
            return Strip.blank(width, base)
        strip = self._strips.get(index)
        if strip is None:
            strip = self._plain_strip(self._lines[index], width, base)
            self._strips[index] = strip
        return strip.crop(0, width).apply_offsets(0, index)

    def _plain_strip(self, line: Line, width: int, base: Style) -> Strip:
        segments = [Segment(text, style) for text, style in line]
        strip = Strip(segments).simplify()
        if strip.cell_length > width:
            strip = Strip.join([strip.crop(0, max(0, width - 1)), Strip([Segment("…")])])
        return strip.apply_style(base).extend_cell_length(width, base)

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
