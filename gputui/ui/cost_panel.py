"""Cost: spent so far, $/h now, projected to the run's end, a budget gauge, one row per slave."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widget import Widget

from gputui.dashboard.cost import CostFrame, SlaveLine, money
from gputui.model.text import clean
from gputui.ui.tables import KeyedTable
from gputui.ui.draw import bar, duration

COLUMNS = ("id", "type", "zone", "state", "up", "$/h", "cost")
LEVEL_CLASS = {"ok": "cost--ok", "warn": "cost--warn", "stop": "cost--bad"}


class CostSummary(Widget):
    COMPONENT_CLASSES = {"cost--ok", "cost--warn", "cost--bad", "cost--dim", "cost--label"}
    frame: reactive[CostFrame | None] = reactive(None)
    eta_s: reactive[float | None] = reactive(None)
    note: reactive[str] = reactive("connecting to the cloud ...")

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def render(self) -> Text:
        f = self.frame
        if f is None:
            return Text(clean(self.note), self._style("cost--dim"))
        width = max(20, self.size.width)
        projected = f.projected(self.eta_s)
        level = self._style(LEVEL_CLASS[f.budget.level])
        rows = [
            ("spent", Text(money(f.budget.spent_usd))),
            ("now", Text(f"{money(f.usd_per_hour, 2)}/h, {len(f.live)} slave(s)")),
            ("projected", Text(f"{money(projected)} at run end" if projected is not None else "n/a (no run)")),
            ("budget", Text.assemble((bar(min(1.0, f.budget.fraction), max(4, width - 24), fill="░"), level),
                                     (f" {f.budget.fraction:4.0%} of {money(f.budget.budget_usd, 2)}", level))),
            ("", Text(clean(self.note or f"{f.cluster} @ {f.provider} {f.region}"),
                      self._style("cost--warn" if self.note else "cost--dim"))),
        ]
        lines = []
        for label, value in rows:
            line = Text(f"{label:<10}", self._style("cost--label"))
            line.append_text(value)
            line.truncate(width, overflow="ellipsis")
            lines.append(line)
        return Text("\n").join(lines)


def slave_cells(slave: SlaveLine, now: float, region: str, wide: bool) -> tuple[Text, ...]:
    """The row of one slave. Ids, types, zones and states come from the cloud: Text, never markup
    (a DataTable reads a plain string as markup)."""
    zone = slave.zone if wide or not slave.zone.startswith(region) else slave.zone[len(region) - 1:]
    cells = (slave.instance_id + (" (orphan)" if slave.orphan else ""), slave.instance_type, zone, slave.state,
             duration(slave.uptime_s(now)), money(slave.usd_per_hour, 3)[1:] if slave.usd_per_hour is not None else "n/a",
             money(slave.cost_usd, 4))
    return tuple(Text(clean(cell) + " ") for cell in cells)


class SlavesTable(KeyedTable):
    """One row per slave, keyed by instance id; the cursor row is the selected slave."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for column in COLUMNS:  # no cell padding (narrow terminals): one trailing space separates columns
            self.add_column(column + " ", key=column)

    def show(self, frame: CostFrame) -> None:
        wanted = {s.instance_id: s for s in frame.slaves}
        present = {k.value for k in self.rows if k.value is not None}
        for key in present - set(wanted):
            self.remove_row(key)
        wide = self.size.width >= 80
        for slave in frame.slaves:
            cells = slave_cells(slave, frame.time, frame.region, wide)
            if slave.instance_id in present:
                for column, value in zip(COLUMNS, cells):
                    self.update_cell(slave.instance_id, column, value)
            else:
                self.add_row(*cells, key=slave.instance_id)

    @property
    def selected(self) -> str | None:
        return self.selected_key


class CostPanel(Horizontal):
    def compose(self) -> ComposeResult:
        yield CostSummary(id="cost-summary")
        yield SlavesTable(id="slaves", cell_padding=0)

    def show(self, frame: CostFrame | None, eta_s: float | None, note: str) -> None:
        summary = self.query_one(CostSummary)
        summary.frame, summary.eta_s, summary.note = frame, eta_s, note
        if frame is not None:
            self.query_one(SlavesTable).show(frame)
