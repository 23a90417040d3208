"""Hosts and GPUs: per host its state, per GPU utilisation and memory bars, temperature,
power and a utilisation sparkline. Draws a HostsFrame; never polls anything itself."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.reactive import reactive
from textual.widget import Widget

from gputui.dashboard.hosts import HostsFrame
from gputui.model.telemetry import GpuSample, HostSnapshot, HostState, fmt
from gputui.ui.draw import bar, gib, sparkline

FIXED_W = 32  # every column of a GPU row but the name, the two bars and the sparkline


def short_name(name: str | None) -> str:
    if not name:
        return "n/a"
    return name.replace("NVIDIA ", "").replace(" (simulated)", "")


class HostsView(Widget):
    """The hosts panel's body (inside a scrolling container)."""

    COMPONENT_CLASSES = {"hosts--name", "hosts--ok", "hosts--bad", "hosts--dim", "hosts--util", "hosts--mem",
                         "hosts--spark", "hosts--hot"}
    frame: reactive[HostsFrame | None] = reactive(None, layout=True)
    error: reactive[str | None] = reactive(None, layout=True)

    def render(self) -> Text:
        width = max(20, self.size.width)
        lines: list[Text] = []
        if self.frame is None:
            lines.append(Text(self.error or "waiting for the first round of telemetry ...", self._style("hosts--dim")))
        else:
            for host in self.frame.hosts:
                lines.append(self._host_line(host, width))
                for gpu in host.gpus:
                    lines.append(self._gpu_line(host, gpu, width))
            if not self.frame.hosts:
                lines.append(Text("no hosts", self._style("hosts--dim")))
            if self.error:
                lines.append(Text(self.error, self._style("hosts--bad")))
        return Text("\n").join(lines)

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def _host_line(self, host: HostSnapshot, width: int) -> Text:
        good = host.state.worked
        text = Text("● " if good else "✖ ", self._style("hosts--ok" if good else "hosts--bad"))
        text.append(host.name, self._style("hosts--name"))
        if host.state is HostState.OK:
            text.append(f"  cpu {fmt(host.cpu_pct, '%')}  mem {gib(host.mem_used_mib)}/{gib(host.mem_total_mib)} GiB",
                        self._style("hosts--dim"))
            if host.message:
                text.append(f"  {host.message}", self._style("hosts--dim"))
        else:
            reason = f": {host.message}" if host.message else ""
            text.append(f"  {host.state.value}{reason}", self._style("hosts--dim" if good else "hosts--bad"))
        text.truncate(width, overflow="ellipsis")
        return text

    def _gpu_line(self, host: HostSnapshot, gpu: GpuSample, width: int) -> Text:
        name_w = 16 if width >= 90 else 0
        rest = max(0, width - FIXED_W - name_w)
        bar_w = max(3, min(20, rest // 4))
        spark_w = max(0, rest - 2 * bar_w)
        util = gpu.util_pct
        mem_frac = None if gpu.mem_pct is None else gpu.mem_pct / 100.0
        hot = gpu.temperature_c is not None and gpu.temperature_c >= 83
        text = Text(f"{gpu.index:>2} ")
        if name_w:
            text.append(short_name(gpu.name)[:name_w - 1].ljust(name_w), self._style("hosts--dim"))
        text.append(bar(None if util is None else util / 100.0, bar_w), self._style("hosts--util"))
        text.append(f"{fmt(util, '%'):>5} ")
        text.append(bar(mem_frac, bar_w), self._style("hosts--mem"))
        text.append(f" {gib(gpu.mem_used_mib)}/{gib(gpu.mem_total_mib)}G".ljust(9) + " ")
        text.append(f"{fmt(gpu.temperature_c, '°C'):>5} ", self._style("hosts--hot") if hot else Style())
        text.append(f"{fmt(gpu.power_w, 'W'):>5} ")
        if spark_w and self.frame is not None:
            text.append(sparkline(self.frame.util.get((host.name, gpu.index), ()), spark_w), self._style("hosts--spark"))
        text.truncate(width)
        return text
