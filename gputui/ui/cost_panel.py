"""Cost: spent so far, $/h now, projected to the run's end, a budget gauge, one row per slave,
and what `u` and `d` will do before they are pressed (instance type, zone and $/h; the
selected slave and its spend).

Wide (120 columns or more), the summary sits left of the slaves table, one figure a line;
narrower, the summary packs its figures into two lines above the table. Ids, types, zones
and states come from the cloud: rich Text, never markup.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import DataTable, Static

from gputui.model import units
from gputui.dashboard.cost import CostFrame, SlaveLine
from gputui.model.text import clean
from gputui.ui.draw import bar
from gputui.ui.tables import KeyedTable

COLUMNS = ("id", "type", "zone", "state", "up", "$/h", "cost")
LEVEL_CLASS = {"ok": "cost--ok", "warn": "cost--warn", "stop": "cost--bad"}
PACKED_FROM = 48  # a summary this wide or wider packs two figures a line (the narrow layouts)
LABEL_W = 10

NO_SLAVES = "no slaves: u starts one"


def slaves_word(n: int) -> str:
    return f"{n} slave" + ("" if n == 1 else "s")


def launch_text(frame: CostFrame | None, confirm: bool = False, verb: str = "u launches") -> str:
    """What `u` will do: "u launches 1 × g4dn.xlarge spot in us-east-1c at $0.2042/h"."""
    ask = " (asks first)" if confirm else ""
    p = frame.next_launch if frame is not None else None
    if p is None:
        what = clean(frame.instance_type) if frame is not None else "slave"
        return f"{verb} 1 × {what}{ask} (price: asking the cloud ...)"
    return f"{verb} 1 × {clean(p.instance_type)} {p.market} in {clean(p.zone)} at {units.per_hour(p.usd_per_hour)}{ask}"


def slave_text(frame: CostFrame, instance_id: str | None) -> str | None:
    """A slave in a few words: "i-0abc (g4dn.xlarge, up 2m06s, $0.0034 spent)"; None if not in the frame."""
    slave = next((s for s in frame.slaves if s.instance_id == instance_id), None)
    if slave is None:
        return None
    return (f"{clean(slave.instance_id)} ({clean(slave.instance_type)}, up {units.duration(slave.uptime_s(frame.time))}, "
            f"{units.money(slave.cost_usd)} spent)")


def terminate_text(frame: CostFrame, selected: str | None, confirm: bool = False) -> str:
    """What `d` will do: "d terminates i-0abc (g4dn.xlarge, up 2m06s, $0.0034 spent)"."""
    what = slave_text(frame, selected)
    if what is None:
        return "d: no slave selected"
    return f"d terminates {what}" + (" (asks first)" if confirm else "")


class CostSummary(Widget):
    COMPONENT_CLASSES = {"cost--ok", "cost--warn", "cost--bad", "cost--dim", "cost--label"}
    frame: reactive[CostFrame | None] = reactive(None)
    eta_s: reactive[float | None] = reactive(None)
    note: reactive[str] = reactive("connecting to the cloud ...")

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def _figures(self, f: CostFrame, gauge_w: int) -> list[tuple[str, Text]]:
        projected = f.projected(self.eta_s)
        level = self._style(LEVEL_CLASS[f.budget.level])
        return [
            ("spent", Text(units.money(f.budget.spent_usd))),
            ("now", Text(f"{units.per_hour(f.usd_per_hour)} · {slaves_word(len(f.live))}")),
            ("projected", Text(f"{units.money(projected)} at run end" if projected is not None else "n/a (no run)")),
            ("budget", Text.assemble((bar(min(1.0, f.budget.fraction), gauge_w, fill="░"), level),
                                     (f" {units.pct(100.0 * f.budget.fraction)} of {units.money(f.budget.budget_usd)}",
                                      level))),
        ]

    _shown: Text | None = None  # what the last show() drew: no repaint while it stays the same

    def show(self, frame: CostFrame | None, eta_s: float | None, note: str) -> None:
        """Take new figures; repaint only when the text changed (the ETA moves with every
        training update, the projected dollars it gives much less often)."""
        self.set_reactive(CostSummary.frame, frame)
        self.set_reactive(CostSummary.eta_s, eta_s)
        self.set_reactive(CostSummary.note, note)
        text = self.render()
        if self._shown is None or text != self._shown:
            self._shown = text
            self.refresh()

    def on_resize(self) -> None:
        self._shown = None

    def render(self) -> Text:
        f = self.frame
        width = max(20, self.size.width)
        if f is None:
            return Text(clean(self.note), self._style("cost--dim"))
        note = Text(clean(self.note or f"{f.cluster} @ {f.provider} {f.region}"),
                    self._style("cost--warn" if self.note else "cost--dim"))
        label = self._style("cost--label")
        lines: list[Text] = []
        if width >= PACKED_FROM:  # two figures a line, the budget and the cluster on the second
            first, second = Text(), Text()
            spent, now, projected, _budget = self._figures(f, 0)
            for name, value in (spent, now, projected):
                if first:
                    first.append(" · ", label)
                first.append(f"{name} ", label)
                first.append_text(value)
            second.append("budget ", label)
            second.append_text(self._figures(f, max(4, min(20, width // 5)))[3][1])
            second.append(" · ", label)
            second.append_text(note)
            lines = [first, second]
        else:
            for name, value in self._figures(f, max(4, width - LABEL_W - 16)):
                line = Text(f"{name:<{LABEL_W}}", label)
                line.append_text(value)
                lines.append(line)
            lines.append(note)
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return Text("\n").join(lines)


class CostPreview(Widget):
    """What `u` and `d` will do, from the last cost frame and the selected row; wraps to its width."""

    COMPONENT_CLASSES = {"cost--dim", "cost--key"}
    text: reactive[str] = reactive("", layout=True)  # its height follows the text (one or two lines)

    def render(self) -> Text:
        return Text(self.text, self.get_component_rich_style("cost--key", partial=True))


def slave_cells(slave: SlaveLine, now: float, region: str, wide: bool) -> tuple[Text, ...]:
    """The row of one slave. Ids, types, zones and states come from the cloud: Text, never markup
    (a DataTable reads a plain string as markup)."""
    zone = slave.zone if wide or not slave.zone.startswith(region) else slave.zone[len(region) - 1:]
    cells = (slave.instance_id + (" (orphan)" if slave.orphan else ""), slave.instance_type, zone, slave.state,
             units.duration(slave.uptime_s(now)), units.money(slave.usd_per_hour), units.money(slave.cost_usd))
    return tuple(Text(clean(cell) + " ") for cell in cells)


class SlavesTable(KeyedTable):
    """One row per slave, keyed by instance id; the cursor row is the selected slave. A cell that
    grows ("shutting-down") widens its column: nothing is cut."""

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        for column in COLUMNS:  # no cell padding (narrow terminals): one trailing space separates columns
            self.add_column(column + " ", key=column)

    def show(self, frame: CostFrame) -> bool:
        """Show the frame's slaves; True when a slave came or went."""
        wanted = {s.instance_id: s for s in frame.slaves}
        present = {k.value for k in self.rows if k.value is not None}
        changed = present != set(wanted)
        for key in present - set(wanted):
            self.remove_row(key)
        wide = self.size.width >= 80
        for slave in frame.slaves:
            cells = slave_cells(slave, frame.time, frame.region, wide)
            if slave.instance_id in present:
                for column, value in zip(COLUMNS, cells):
                    self.update_cell(slave.instance_id, column, value, update_width=True)
            else:
                self.add_row(*cells, key=slave.instance_id)
        return changed

    @property
    def selected(self) -> str | None:
        return self.selected_key


class CostPanel(Vertical):
    confirm = False  # the profile's [ui] confirm: the preview says u and d ask first

    def compose(self) -> ComposeResult:
        with Horizontal(id="cost-top"):
            yield CostSummary(id="cost-summary")
            yield SlavesTable(id="slaves", cell_padding=0)
            yield Static(NO_SLAVES, id="slaves-empty")
        yield CostPreview(id="cost-preview")

    def show(self, frame: CostFrame | None, eta_s: float | None, note: str) -> None:
        self.query_one(CostSummary).show(frame, eta_s, note)
        drawn = getattr(self, "_drawn", None)
        if drawn is not None and drawn[0] is frame and drawn[1] == self.confirm:
            return  # the same frame (a training update moved the ETA): the table and preview stand
        self._frame, self._drawn = frame, (frame, self.confirm)
        table = self.query_one(SlavesTable)
        if self.has_class("-no-frame") != (frame is None):
            self.set_class(frame is None, "-no-frame")  # no cloud (or none yet): the note alone, full width
            self.screen.set_class(frame is None, "-no-cloud")  # the cost row shrinks (dashboard.tcss)
        empty = frame is not None and not frame.slaves
        # Each display set only when it changes: a change lays the whole screen out again, and the
        # cost frame comes every few seconds (a lab's screen is not cheap to lay out).
        if table.display != (frame is not None and not empty):
            table.display = frame is not None and not empty
        if frame is not None and table.show(frame) and self.screen.has_class("-narrow"):
            self.scroll_visible(animate=False)  # one column that scrolls: a slave came or went, show it
        hint = self.query_one("#slaves-empty")
        if hint.display != empty:
            hint.display = empty  # says what the empty table is, and how to fill it
        self.update_preview()

    def update_preview(self) -> None:
        frame: CostFrame | None = getattr(self, "_frame", None)
        preview = self.query_one(CostPreview)
        if frame is None:
            preview.text = ""
            if preview.display:
                preview.display = False
            return
        if not preview.display:
            preview.display = True
        selected = self.query_one(SlavesTable).selected
        preview.text = f"{launch_text(frame, self.confirm)} · {terminate_text(frame, selected, self.confirm)}"

    def on_data_table_row_highlighted(self, _event: DataTable.RowHighlighted) -> None:
        self.update_preview()
