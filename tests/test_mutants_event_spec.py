"""gputui.model.events in process: `make` takes each kind of field (any, int, num, str, bool, list,
values) and refuses a value of the wrong kind in one message; `typed` nulls a received event's
numbers that are not finite numbers, by that event's own fields, and keeps only a metrics event's
finite named values. Written to kill what benchmarks/mutation.py showed untested."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gputui.model.events import NUMBERS, NonFinite, make, metric_values, typed


def fields(event: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in event.items() if k != "time"}


@pytest.mark.parametrize("value", ["hot", 3, 2.5, [1, 2], {"a": 1}, None, True])
def test_a_field_of_any_kind_takes_any_value(value: Any) -> None:
    assert fields(make("alert", value=value)) == {"event": "alert", "value": value}


@pytest.mark.parametrize("name, key", [("step", "loss"), ("step", "epoch"), ("kill", "ok"), ("node", "steps"),
                                       ("kill", "signal"), ("metrics", "values")])
def test_every_kind_of_field_may_be_none(name: str, key: str) -> None:
    assert fields(make(name, **{key: None})) == {"event": name, key: None}


def test_a_bool_field_takes_a_bool_only() -> None:
    assert fields(make("kill", ok=False)) == {"event": "kill", "ok": False}
    for wrong in (1, "yes", [True]):
        with pytest.raises(TypeError) as err:
            make("kill", ok=wrong)
        assert str(err.value) == f"event 'kill' field 'ok': {wrong!r} is not bool"


def test_a_list_field_takes_a_list_or_tuple_only() -> None:
    assert fields(make("node", steps=["a", "b"])) == {"event": "node", "steps": ["a", "b"]}
    assert make("slaves_started", instances=("i-1",))["instances"] == ("i-1",)
    for wrong in ("a,b", {"a": 1}, 3, True):
        with pytest.raises(TypeError, match="is not list$"):
            make("node", steps=wrong)


def test_values_are_an_object_of_names_to_finite_numbers() -> None:
    assert fields(make("metrics", values={"acc": 0.9, "n": 3})) == {"event": "metrics", "values": {"acc": 0.9, "n": 3}}
    assert make("metrics", values={})["values"] == {}
    for wrong in ({"acc": "0.9"}, {1: 0.5}, {"acc": math.nan}, {"acc": 0.9, "loss": math.inf}, {"ok": True},
                  [("acc", 0.9)], "acc=0.9"):
        with pytest.raises(TypeError) as err:
            make("metrics", values=wrong)
        assert str(err.value) == f"event 'metrics' field 'values': {wrong!r} is not values"


def test_a_number_field_refuses_text_and_a_bool_and_nan() -> None:
    with pytest.raises(TypeError, match="^event 'step' field 'loss': '1' is not num$"):
        make("step", loss="1")
    with pytest.raises(TypeError, match="^event 'step' field 'epoch': True is not int$"):
        make("step", epoch=True)
    with pytest.raises(NonFinite, match="^event 'step' field 'loss' is nan$"):
        make("step", loss=math.nan)


# -- typed ------------------------------------------------------------------------------------------

def test_a_received_events_numbers_are_checked_by_its_own_fields() -> None:
    # `nodes` is a number in `start` and a list in `cluster`: not in NUMBERS, but checked in a start event.
    assert "nodes" not in NUMBERS
    assert typed({"event": "start", "nodes": "2", "epochs": 3}) == {"event": "start", "nodes": None, "epochs": 3}
    assert typed({"event": "cluster", "nodes": ["a"], "world_size": math.nan}) == {"event": "cluster", "nodes": ["a"],
                                                                                   "world_size": None}


def test_an_unknown_or_unnamed_event_has_every_known_number_checked() -> None:
    assert typed({"event": "mystery", "loss": math.inf, "note": "x"}) == {"event": "mystery", "loss": None, "note": "x"}
    assert typed({"loss": "1", "step": 4}) == {"loss": None, "step": 4}


def test_a_metrics_events_values_keep_only_named_finite_numbers() -> None:
    got = typed({"event": "metrics", "step": 5, "values": {"acc": 0.5, "n": 2, "bad": "x", "nan": math.nan,
                                                           3: 1.0, "flag": True, "big": 2**70}})
    assert got == {"event": "metrics", "step": 5, "values": {"acc": 0.5, "n": 2}}
    assert typed({"event": "metrics", "values": [["acc", 0.5]]}) == {"event": "metrics", "values": {}}
    assert typed({"event": "metrics", "values": None}) == {"event": "metrics", "values": {}}
    assert typed({"event": "metrics", "step": 1}) == {"event": "metrics", "step": 1}  # no values: none added


def test_metric_values_of_anything_but_an_object_are_none() -> None:
    assert metric_values("acc=1") == {} and metric_values(None) == {} and metric_values([1]) == {}
    assert metric_values({"acc": 1, "x": "1"}) == {"acc": 1}
