"""`gputui cost`: spend per cluster and per run, from the ledger (estimates)."""

from __future__ import annotations

from gputui.cloud.ledger import Ledger
from gputui.model.cloud import SpendLine


def report(ledger: Ledger, now: float, since: float | None = None) -> tuple[list[SpendLine], list[SpendLine]]:
    """(clusters, runs) with their estimated cost inside [since, now]."""
    window = (since if since is not None else float("-inf"), now)
    instances = ledger.instances(since=since)
    energy = ledger.energy(since=since)
    clusters: dict[str, dict[str, float]] = {}

    def add(cluster: str, start: float, end: float | None, usd: float, running: int = 0, kwh: float = 0.0) -> None:
        c = clusters.setdefault(cluster, {"start": start, "end": 0.0, "open": 0, "usd": 0.0, "kwh": 0.0})
        c["start"] = min(c["start"], start)
        c["end"] = max(c["end"], end if end is not None else now)
        c["open"] += running
        c["usd"] += usd
        c["kwh"] += kwh

    for rec in instances:
        add(rec.cluster, max(rec.launched, window[0]), rec.terminated, rec.cost(now, window), int(rec.running))
    for _subject, cluster, _run, start, end, kwh, rate in energy:
        share = _share(start, end, window)
        add(cluster, max(start, window[0]), end, kwh * share * rate, kwh=kwh * share)
    cluster_lines = [SpendLine(name, name, c["start"], None if c["open"] else c["end"], c["usd"], int(c["open"]),
                               c["kwh"]) for name, c in sorted(clusters.items())]
    run_lines = []
    for run_id, cluster, started, ended, _status in ledger.runs(since):
        span = (max(started, window[0]), min(ended if ended is not None else now, now))
        usd = sum(r.cost(now, span) for r in instances if r.cluster == cluster)
        kwh = sum(k * _share(s, e, span) for _sub, _c, rid, s, e, k, _rate in energy if rid == run_id)
        usd += sum(k * _share(s, e, span) * rate for _sub, _c, rid, s, e, k, rate in energy if rid == run_id)
        run_lines.append(SpendLine(run_id, cluster, span[0], ended, usd, energy_kwh=kwh))
    return cluster_lines, run_lines


def _share(start: float, end: float, window: tuple[float, float]) -> float:
    """The fraction of [start, end] inside the window (energy is spread evenly over its line)."""
    if end <= start:
        return 1.0 if window[0] <= end <= window[1] else 0.0
    inside = min(end, window[1]) - max(start, window[0])
    return max(0.0, inside) / (end - start)
