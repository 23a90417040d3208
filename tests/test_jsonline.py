"""gputui.model.jsonline: the per-round JSON lines (monitor --json, --record) are json's bytes,
from orjson when it can, from json when it cannot."""

from __future__ import annotations

import json
import math

import pytest

from gputui.model import jsonline
from gputui.model.telemetry import round_from_dict, round_to_dict
from gputui.sources.sim import SimSource


def json_line(doc: object) -> str:
    return json.dumps(doc, separators=(",", ":"), check_circular=False)


def test_a_labs_round_is_the_same_line_json_writes_and_reads_back() -> None:
    source = SimSource(hosts=8, gpus=4, seed=2, clock=lambda: 1000.25)
    for _ in range(3):
        hosts = source.poll()
    doc = round_to_dict(hosts, 1000.25)
    line = jsonline.compact(doc)
    assert line == json_line(doc) and "\n" not in line
    assert round_from_dict(json.loads(line)) == hosts


def test_orjson_writes_it_when_installed() -> None:
    pytest.importorskip("orjson")
    jsonline.compact({})
    assert jsonline._dumps, "orjson is installed (a dependency) but compact() does not use it"


def test_what_orjson_refuses_json_writes_and_nan_stays_json() -> None:
    assert jsonline.compact({"big": 2**70, "t": (1, 2)}) == '{"big":1180591620717411303424,"t":[1,2]}'
    doc = {"host": "gpu-é", "users": ["ådam", None]}
    assert jsonline.compact(doc) == json_line(doc) == '{"host":"gpu-\\u00e9","users":["\\u00e5dam",null]}'  # ASCII
    lone = {"name": "gpu\udcff"}  # a lone surrogate (a name decoded with surrogateescape): orjson refuses it
    assert jsonline.compact(lone) == json_line(lone) == '{"name":"gpu\\udcff"}'
    line = jsonline.compact({"util": math.nan, "ok": [1.5, None, True]})
    assert json.loads(line)["ok"] == [1.5, None, True]
    if jsonline._dumps:
        assert json.loads(line)["util"] is None  # orjson: null, a valid line
