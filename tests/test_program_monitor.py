"""`gputui monitor --run ID` and its Prometheus exporter for a run of the user's own program (issue
31): the watch folds the program's metrics events (each metric's latest value; progress for the
stalled alert), and the exporter shows them as `gputui_run_metric{run_id, name}`. A metric's name
is data from the events file: quotes, backslashes, line breaks or a huge name never break the
exposition, checked with prometheus-client's own parsers of both formats."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gputui.model.events import make
from gputui.monitor import watches
from gputui.monitor.alerts import AlertEngine, AlertSettings, RunFacts
from gputui.monitor.exporter import METRIC_NAME_CHARS, Collector, ExportState, scrape_text
from gputui.runs import store as runs


def start(run_id: str = "p") -> dict[str, Any]:
    return {**make("start", run_id=run_id, program="python train.py", workdir="/w", device="cpu", strategy="single",
                   world_size=1, resumed=False, direction="maximize"), "time": 1000.0}


def metrics(values: dict[str, float], at: float, **extra: Any) -> dict[str, Any]:
    return {**make("metrics", values=values, elapsed_s=at, source="report", **extra), "time": 1000.0 + at}


def watched(tmp_path: Path, events: list[dict[str, Any]]) -> RunFacts:
    """What `gputui monitor --run` knows of a run whose events file holds `events`."""
    path = tmp_path / runs.EVENTS
    path.write_text("".join(runs.encode(event) + "\n" for event in events))
    return watches.RunWatch(path).poll()


def run_metrics(text: str) -> dict[str, float]:
    """The gputui_run_metric samples of a scrape (text format), name label -> value."""
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gputui_run_metric":
                assert sample.labels["name"] not in out, f"two samples named {sample.labels['name']!r}"
                out[sample.labels["name"]] = sample.value
    return out


def scraped(facts: RunFacts) -> str:
    state = ExportState()
    state.update([], 2000.0, facts)
    return scrape_text(state)


def test_the_watch_keeps_each_metrics_latest_value_first_seen_first(tmp_path: Path) -> None:
    facts = watched(tmp_path, [start(), metrics({"loss": 2.0, "acc": 0.1}, 1.0, step=1),
                               metrics({"val_acc": 0.5}, 2.0, step=2),
                               metrics({"loss": 1.0}, 3.0, step=3),
                               metrics({"loss": 9.0, "rank1_only": 1.0}, 3.5, step=3, rank=1)])  # not rank 0's
    assert facts.metrics == (("loss", 1.0), ("acc", 0.1), ("val_acc", 0.5))
    assert (facts.run_id, facts.step, facts.last_step, facts.active) == ("p", 3, 1003.5, True)  # any report is progress


def test_a_program_that_reports_is_not_stalled(tmp_path: Path) -> None:
    facts = watched(tmp_path, [start(), metrics({"loss": 1.0}, 280.0)])
    engine = AlertEngine(AlertSettings(stalled_s=300))
    assert engine.evaluate([], 1000.0 + 400.0, facts) == []  # 400 s since its start, 120 s since its report
    (stalled,) = engine.evaluate([], 1000.0 + 280.0 + 301.0, facts)
    assert (stalled.rule, stalled.state) == ("stalled", "firing")


def test_the_exporter_shows_the_programs_metrics_beside_the_runs_gauges(tmp_path: Path) -> None:
    facts = watched(tmp_path, [start(), metrics({"loss": 2.0, "val_acc": 0.25}, 1.0, step=7),
                               metrics({"val_acc": 0.75}, 2.0, step=8)])
    text = scraped(facts)
    assert run_metrics(text) == {"loss": 2.0, "val_acc": 0.75}
    assert 'gputui_run_metric{name="val_acc",run_id="p"} 0.75' in text
    assert 'gputui_run_step{run_id="p"} 8.0' in text and 'gputui_run_up{run_id="p"} 1.0' in text


def test_a_nets_run_has_no_metric_samples(tmp_path: Path) -> None:
    facts = watched(tmp_path, [make("start", run_id="net", model="seed", device="cpu", strategy="single"),
                               make("step", step=1, loss=0.5, elapsed_s=0.1)])
    text = scraped(facts)
    assert run_metrics(text) == {} and 'gputui_run_loss{run_id="net"} 0.5' in text


HOSTILE = [
    'quote"d',
    "back\\slash",
    'line\nbreak} 1\ngputui_fake_metric 1\n# TYPE x',
    "carriage\rreturn\x1b[31m",
    'x" ,name="evil',
    "n" * 100_000,
    "ünïcødé ✓",
]


def test_hostile_metric_names_are_label_values_that_never_break_the_exposition(tmp_path: Path) -> None:
    facts = watched(tmp_path, [start(), metrics({name: float(i) for i, name in enumerate(HOSTILE)}, 1.0)])
    assert len(facts.metrics) == len(HOSTILE)
    expected = {'quote"d': 0.0, "back\\slash": 1.0, "line break} 1 gputui_fake_metric 1 # TYPE x": 2.0,
                "carriage return": 3.0, 'x" ,name="evil': 4.0, "n" * (METRIC_NAME_CHARS - 1) + "…": 5.0,
                "ünïcødé ✓": 6.0}
    text = scraped(facts)
    families = {family.name for family in text_string_to_metric_families(text)}
    assert "gputui_fake_metric" not in families and "x" not in families
    assert run_metrics(text) == expected
    assert all(len(line) < 1000 for line in text.splitlines())
    # The same through the OpenMetrics format (what a scraper asking for it gets).
    registry = CollectorRegistry(auto_describe=False)
    state = ExportState()
    state.update([], 2000.0, facts)
    registry.register(Collector(state))
    found = {s.labels["name"]: s.value for family in parse_openmetrics(openmetrics_latest(registry).decode())
             for s in family.samples if s.name == "gputui_run_metric"}
    assert found == expected


def test_names_that_clean_to_the_same_text_give_one_sample(tmp_path: Path) -> None:
    facts = watched(tmp_path, [start(), metrics({"a\nb": 1.0, "a b": 2.0, "a\tb": 3.0}, 1.0)])
    assert run_metrics(scraped(facts)) == {"a b": 1.0}


def test_a_program_naming_a_new_metric_each_report_is_cut_at_the_cap(tmp_path: Path) -> None:
    events = [start()] + [metrics({f"m{i}": float(i)}, float(i)) for i in range(watches.MAX_METRICS + 10)]
    events.append(metrics({"m0": -1.0}, 1000.0))  # a name already kept still moves
    facts = watched(tmp_path, events)
    assert len(facts.metrics) == watches.MAX_METRICS and facts.metrics[0] == ("m0", -1.0)
    assert ("m%d" % watches.MAX_METRICS) not in dict(facts.metrics)


@pytest.mark.parametrize("values", [{"ok": 1.0, "bad": "1.5"}, {"ok": 1.0, "nan": float("nan")}, {"ok": 1.0, "flag": True}])
def test_values_that_are_not_finite_numbers_are_left_out(values: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / runs.EVENTS  # written by hand, as a hostile file would be (make refuses these)
    path.write_text(runs.encode(start()) + "\n" + json.dumps({**metrics({"ok": 1.0}, 1.0), "values": values}) + "\n")
    assert watches.RunWatch(path).poll().metrics == (("ok", 1.0),)
