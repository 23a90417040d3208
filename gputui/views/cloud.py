"""How the cloud and cost commands show things: rich tables, JSON shapes, questions.

Ids, zones, states and messages come from the cloud's API: tables hold them as Text (never
markup) and lines on stderr drop their control characters."""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Iterable, Sequence

from gputui.model import units
from gputui.model.errors import UserError
from gputui.model.cloud import CloudEvent, FleetEntry, InstanceInfo, LaunchAttempt, PriceQuote, SpendLine
from gputui.model.text import clean
from gputui.model.units import plural


NOTE_MIN = 12  # a table's last column (a note) is cut to no fewer characters than this to make room


def print_table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]], caption: str | None = None,
                hide_first: Sequence[str] = ()) -> None:
    """A table under its title, with its caption (a hint) under it. The last column (a note, a
    reason) gives way first, cut with an ellipsis; where the others do not fit either (a narrow
    terminal), the columns of `hide_first` are left out in that order, and a line says which."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from gputui.views.progress import table_width

    cells = [[Text(clean(str(cell))) for cell in row] for row in rows]
    # Piped output keeps whole ids (a terminal's width is respected; rich folds only there).
    console = Console(width=table_width(250))
    widths = [max([len(column), *(row[i].cell_len for row in cells if i < len(row))]) for i, column in enumerate(columns)]
    shown = list(range(len(columns)))

    def room() -> int:  # what the last shown column may take: the others at their widest, 3 a column for borders
        return console.width - sum(widths[i] for i in shown[:-1]) - 3 * len(shown) - 1

    def fits() -> bool:  # every shown column whole, but the table's own last one, which may be cut to NOTE_MIN
        end = shown[-1]
        return room() >= (min(widths[end], NOTE_MIN) if end == len(columns) - 1 else widths[end])

    hidden = []
    for name in hide_first:
        if not shown or fits():
            break
        if name in columns and columns.index(name) in shown:
            shown.remove(columns.index(name))
            hidden.append(name)
    # The title and caption are lines of their own: inside the table rich wraps them to its width
    # (a narrow table split "Runs in DIR" over lines) and pads them with spaces to it.
    table = Table()
    for i in shown:
        table.add_column(columns[i], justify="right" if columns[i].startswith(("$", "cost", "saving", "up")) else "left",
                         no_wrap=True)
    last = max(len(columns[shown[-1]]), room()) if shown else 0
    for row in cells:
        kept = [row[i] for i in shown if i < len(row)]
        if len(kept) == len(shown) and kept and kept[-1].cell_len > last:
            # a long note once squeezed every other column of `gputui runs` to nothing: it is cut instead
            kept[-1].truncate(last, overflow="ellipsis")
        table.add_row(*kept)
    console.print(Text(clean(title), style="table.title"), soft_wrap=True)  # lines: a terminal folds them itself
    console.print(table)
    if hidden:
        console.print(Text(f"left out to fit {console.width} columns: {', '.join(hidden)} (a wider terminal "
                           f"shows {'them' if len(hidden) > 1 else 'it'})", style="table.caption"), soft_wrap=True)
    if caption is not None:
        console.print(Text(clean(caption), style="table.caption"), soft_wrap=True)


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, indent=2, allow_nan=False) + "\n")


def json_line(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), allow_nan=False)


def say(message: str) -> None:
    print(clean(message, 4000), file=sys.stderr, flush=True)  # one line, whatever the cloud put in it


def confirm(question: str, yes: bool, refusal: str) -> bool:
    """True with --yes; on a terminal, the user's answer; otherwise a UserError (exit 2)."""
    if yes:
        return True
    if not sys.stdin.isatty():
        raise UserError(f"{refusal}: no terminal to ask on, pass --yes to go ahead")
    try:
        return input(question).strip().lower() in ("y", "yes")
    except EOFError:
        return False


def interactive() -> bool:
    return sys.stdin.isatty()


def attempt_line(a: LaunchAttempt) -> str:
    if a.ok:
        return f"launch {a.lifecycle} in {a.zone}: {a.launched} of {a.requested} started"
    return f"launch {a.lifecycle} in {a.zone}: refused ({a.error_code}: {a.message})"


def event_line(e: CloudEvent) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(e.time))
    return f"{stamp} {e.kind}: {e.message}"


def event_json(e: CloudEvent) -> dict[str, Any]:
    return {"time": e.time, "kind": e.kind, "message": e.message, "instance_id": e.instance_id, "cluster": e.cluster}


def rate_text(usd: float | None) -> str:
    """A recorded $/h with its source where the ledger has one: "$0.4012 (api 2026-11-25)"."""
    source = getattr(usd, "source", None)
    return units.money(usd, 4) + (f" ({source})" if source and usd is not None else "")


def instances_table(title: str, infos: Sequence[InstanceInfo], rates: dict[str, float]) -> None:
    print_table(title, ["id", "type", "zone", "market", "address", "$/h"],
                ([i.instance_id, i.instance_type, i.zone, i.lifecycle, i.public_ip or "-", rate_text(rates.get(i.instance_id))]
                 for i in infos))


def fleet_json(entries: Sequence[FleetEntry], now: float) -> list[dict[str, Any]]:
    return [{
        "id": e.instance.instance_id, "cluster": e.instance.cluster, "owner": e.instance.owner,
        "type": e.instance.instance_type, "zone": e.instance.zone, "lifecycle": e.instance.lifecycle,
        "state": e.instance.state, "address": e.instance.public_ip, "launched": e.instance.launched,
        "up_s": round(max(0.0, now - e.instance.launched), 1),
        "usd_per_hour": None if e.usd_per_hour is None else float(e.usd_per_hour),
        "price_source": getattr(e.usd_per_hour, "source", None),
        "cost_usd": e.cost_usd, "known": e.known, "orphan": e.orphan,
    } for e in entries]


def fleet_table(entries: Sequence[FleetEntry], now: float, region: str, sweep: str = "gputui cloud sweep") -> None:
    rows = [[e.instance.instance_id, e.instance.cluster or "-", e.instance.instance_type, e.instance.zone,
             e.instance.lifecycle, e.instance.state, e.instance.public_ip or "-", units.duration(now - e.instance.launched),
             rate_text(e.usd_per_hour), units.money(e.cost_usd, 4), "ORPHAN (not in records)" if e.orphan else "yes"]
            for e in entries]
    orphans = sum(e.orphan for e in entries)
    caption = (f"{plural(orphans, 'orphan')}: `{sweep}` terminates them" if orphans else None)
    print_table(f"gputui instances in {region} (costs are estimates)",
                ["id", "cluster", "type", "zone", "market", "state", "address", "up", "$/h", "cost", "known"], rows, caption)


def quotes_json(quotes: Sequence[PriceQuote]) -> list[dict[str, Any]]:
    return [{"instance_type": q.instance_type, "zone": q.zone, "spot_usd_per_hour": q.spot, "spot_source": q.spot_source,
             "on_demand_usd_per_hour": q.on_demand, "on_demand_source": q.on_demand_source,
             "saving": None if q.saving is None else round(q.saving, 4)}
            for q in quotes]


def sourced(usd: float | None, source: str | None, digits: int = 4) -> str:
    """A $/h figure with where it came from: "$1.1230/h (api 2026-11-25)"."""
    return units.per_hour(usd, digits) + (f" ({source})" if source and usd is not None else "")


def quotes_table(quotes: Sequence[PriceQuote], title: str, note: str | None = None) -> None:
    """Spot next to on-demand per zone; each column names its source (all zones share one)."""
    spot_source = next((q.spot_source for q in quotes if q.spot_source), None)
    od_source = next((q.on_demand_source for q in quotes if q.on_demand_source), None)
    rows = [[q.zone, units.money(q.spot, 4), units.money(q.on_demand, 4), "n/a" if q.saving is None else f"{q.saving:.0%}"] for q in quotes]
    print_table(title, ["zone", "$/h spot" + (f" ({spot_source})" if spot_source else ""),
                        "$/h on-demand" + (f" ({od_source})" if od_source else ""), "saving"], rows, note)


def launch_price_text(quotes: Sequence[PriceQuote], zone: str, market: str) -> str:
    """What one instance of a launch plan's first attempt costs, each figure with its source:
    "spot $0.4012/h (api 2026-11-25) in eu-west-1a, on-demand $1.1230/h (api 2026-11-25), saving 64%"."""
    from gputui.cloud.pricing import launch_price

    quote = next((q for q in quotes if q.zone == zone), None)
    rate, source = launch_price(quote, market, None)
    on_demand, od_source = (quote.on_demand, quote.on_demand_source) if quote else (None, None)
    text = f"{market} {sourced(rate, source)} in {zone}"
    if market == "spot":
        text += f", on-demand {sourced(on_demand, od_source)}"
        if rate is not None and on_demand:
            text += f", saving {1 - rate / on_demand:.0%}"
    return text


def spend_json(line: SpendLine, now: float, sources: Sequence[str] = (), methods: Sequence[str] = ()) -> dict[str, Any]:
    rate = line.usd_per_hour(now)
    return {"name": line.name, "cluster": line.cluster, "start": line.start, "end": line.end,
            "duration_s": round(line.duration(now), 1), "usd_per_hour": None if rate is None else round(rate, 6),
            "price_sources": list(sources), "energy_methods": list(methods),
            "total_usd": round(line.usd, 6), "running": line.running, "energy_kwh": round(line.energy_kwh, 6),
            "estimate": line.estimate}


def measured_by(sources: Sequence[str], methods: Sequence[str]) -> str:
    """Where a cluster's rates came from and how its energy was measured, in one cell."""
    parts = ([", ".join(sources)] if sources else []) + ([f"energy by {', '.join(methods)}"] if methods else [])
    return "; ".join(parts) or "-"


def spend_table(title: str, lines: Sequence[SpendLine], now: float, first: str,
                sources: dict[str, list[str]] | None = None, methods: dict[str, list[str]] | None = None) -> None:
    """One row per cluster or run; beside the rate, `sources` ({cluster: [price source, ...]}) and
    `methods` ({cluster: [energy method, ...]})."""
    sources, methods = sources or {}, methods or {}
    rows = [[line.name, *([line.cluster] if first == "run" else []), units.duration(line.duration(now)),
             units.money(line.usd_per_hour(now), 4), measured_by(sources.get(line.cluster, ()), methods.get(line.cluster, ())),
             units.money(line.usd, 4) + " est.",
             *([str(line.running)] if first == "cluster" else []), f"{line.energy_kwh:.3f}"]
            for line in lines]
    columns = [first, *(["cluster"] if first == "run" else []), "up", "$/h (mean)", "prices from", "cost",
               *(["running"] if first == "cluster" else []), "kWh (local)"]
    print_table(title, columns, rows)
