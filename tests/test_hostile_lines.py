"""One line from a hostile sweep worker, slave or events file never ends the master: each
boundary that parses outside text goes through gputui.model.outside, survives the line, and
says so once (a flood of such lines is counted, not said once a line)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gputui.model import outside
from tests.sweep_support import Seen

HUGE = "1" + "0" * 400  # a 401-digit integer: float() of it overflows, math.isfinite() raises
DEEP = "[" * 100_000  # the json module recurses on it: RecursionError
DEEP_EVENT = '{"event": "step", "step": 1, "x": ' + "[" * 200 + "]" * 200 + "}"  # parses, yet deeper than ours


# -- the one parser and its numbers ------------------------------------------------------------

@pytest.mark.parametrize("line, why", [
    (DEEP, "nested too deep"),
    (DEEP_EVENT, f"nested deeper than {outside.MAX_DEPTH}"),
    ("1" * 5000, None),  # 5,000 digits: int() would raise ValueError; read as None
    (b'{"a": 1}\xff', "not JSON"),
    ('{"a": 1} trailing', "not JSON"),
    ("x" * (outside.MAX_LINE + 1), "longer than"),
], ids=["deep", "deep-event", "5000-digits", "0xff-after", "trailing", "too-long"])
def test_the_parser_refuses_hostile_text_with_refused_alone(line: str | bytes, why: str | None) -> None:
    if why is None:
        assert outside.parse_counted(line) == (None, 1)
        return
    with pytest.raises(outside.Refused, match=why):
        outside.parse(line)


def test_an_integer_beyond_2_63_is_read_as_none_and_counted_and_the_rest_of_the_line_kept() -> None:
    value, nulled = outside.parse_counted('{"a": %d, "b": %d, "c": -%d, "d": %s}' % (2**63, 2**63 - 1, 2**63, HUGE))
    assert value == {"a": None, "b": 2**63 - 1, "c": None, "d": None} and nulled == 3


def test_bad_bytes_and_lone_surrogates_cost_a_character_not_the_line() -> None:
    assert outside.parse(b'{"m": "a\xffb"}') == {"m": "a\ufffdb"}
    assert outside.parse('{"m": "a\\ud800b", "ok": "\\ud83d\\ude00"}') == {"m": "a\ufffdb", "ok": "\U0001f600"}


@pytest.mark.parametrize("value", [True, False, float("nan"), float("inf"), -float("inf"), "1", 2**63, -2**63,
                                   10**400, None, [1]])
def test_a_number_from_outside_is_none_unless_it_is_a_finite_number(value: Any) -> None:
    assert outside.finite(value) is None and outside.number(value) is None


def test_an_index_or_count_from_outside_is_a_whole_number_from_0_to_2_31_minus_1() -> None:
    assert [outside.index(v) for v in (0, 7, 2**31 - 1)] == [0, 7, 2**31 - 1]
    assert [outside.index(v) for v in (-1, 2**31, 2**63, True, 1.0, "3")] == [None] * 6


def test_a_flood_of_bad_lines_is_said_once_and_counted() -> None:
    tally = outside.Tally("slave s1")
    for _ in range(1000):
        assert tally.line(DEEP) is None
    said = [tally.warning() for _ in range(3)]
    assert said[0] is not None and said[0].startswith("slave s1 sent a line of JSON nested too deep") and said[1:] == [None, None]
    assert tally.refused == 1000


# -- the sweep master and its workers ---------------------------------------------------------


def master(tmp_path: Path, study: Any = None) -> tuple[Any, Seen]:
    from gputui.sweep import scheduler as sched
    from gputui.sweep.sim import SimSlot
    from gputui.sweep.space import parse_text

    profile, spec = parse_text('[run]\nmodel = "fast"\n[sweep]\nname = "h"\ntrials = 2\nlr = [1e-3, 1e-1]\n',
                               tmp_path / "h.toml")
    view = Seen()
    scheduler = sched.Scheduler(study, spec, profile.run, [], view)
    slot = SimSlot("hostile")
    scheduler.workers[0] = sched.Worker(0, slot, SimpleNamespace(), spawned=0.0)
    return scheduler, view


def test_a_ready_line_with_a_400_digit_load_time_is_taken_with_one_warning(tmp_path: Path) -> None:
    scheduler, view = master(tmp_path)
    for _ in range(50):  # a flood of them: said once
        scheduler._handle(0, '{"op":"ready","pid":7,"device":"cpu","load_s":%s}\n' % HUGE)
    assert scheduler.workers[0].ready  # the worker is taken: its load time is not known
    ready = [f for k, f in view.lines if k == "slot" and f.get("state") == "ready"]
    assert ready and ready[0]["load_s"] is None and ready[0]["pid"] == 7
    assert len(view.warnings()) == 1 and "hostile" in view.warnings()[0]["slot"], view.lines


def test_garbage_deep_nesting_and_huge_lines_from_a_worker_are_one_warning(tmp_path: Path) -> None:
    scheduler, view = master(tmp_path)
    for line in (DEEP, DEEP_EVENT, "\udcff garbage", '{"no": "op"}', "[1]", '{"op": "ready", "pid": %s}' % HUGE):
        scheduler._handle(0, line)
    assert len(view.warnings()) == 1, view.lines
    assert scheduler.tallies["hostile"].refused == 5


def test_an_eval_index_of_2_63_never_reaches_the_study(tmp_path: Path) -> None:
    from gputui.sweep import scheduler as sched
    from gputui.sweep import study as studies

    scheduler, view = master(tmp_path)
    study = studies.create(scheduler.spec)
    scheduler.attach(study)
    handle = study.ask()
    trial = sched.Trial(number=handle.number, handle=handle, params={}, profile="")
    scheduler.workers[0].busy = trial
    event = {"event": "eval", "epoch": 1, "step": 10, "test_acc": 91.0}
    for index in (2**64, 2**63, 2**63 - 1, 2**31):  # past sqlite's integers; inside them, but no index of ours
        scheduler._handle(0, json.dumps({"op": "event", "trial": trial.number, "eval": index, "data": event}))
    assert handle.storage.get_trial(handle._trial_id).intermediate_values == {}  # nothing reported
    assert len(view.warnings()) == 1  # the integer out of +-2**63 (2**31 is only not an index)
    scheduler._handle(0, json.dumps({"op": "event", "trial": trial.number, "eval": 1, "data": event}))
    assert handle.storage.get_trial(handle._trial_id).intermediate_values == {0: 91.0}  # a good one still counts


# -- the cluster relay ---------------------------------------------------------------------------

def relay_of() -> tuple[Any, list[dict[str, Any]], list[dict[str, Any]]]:
    from gputui.model import events
    from gputui.cluster.relay import Relay

    written: list[dict[str, Any]] = []
    emitted: list[dict[str, Any]] = []

    def emit(name: str, /, **fields: Any) -> dict[str, Any]:
        event = events.make(name, **fields)
        emitted.append(event)
        return event

    ctx = SimpleNamespace(identity=SimpleNamespace(rewrite=lambda e: e), out=SimpleNamespace(write=written.append),
                          emit=emit, settings=SimpleNamespace(master_trains=True))
    return Relay(ctx), written, emitted  # type: ignore[arg-type]


def test_the_relay_survives_deep_nesting_and_huge_numbers_with_one_warning_a_slave() -> None:
    from gputui.cluster.worker import EVENT_TAG

    relay, written, emitted = relay_of()
    node = SimpleNamespace(name="s1", proc=None, log=None)
    for _ in range(100):
        relay.line(node, EVENT_TAG + DEEP)  # type: ignore[arg-type]
    relay.line(node, EVENT_TAG + '{"event": "step", "step": %s, "loss": 0.5}' % HUGE)  # type: ignore[arg-type]
    relay.line(node, EVENT_TAG + '{"event": "step", "step": 3, "loss": 0.25}')  # type: ignore[arg-type]
    assert [e.get("step") for e in written] == [None, 3]  # the good events go on; the huge step is not known
    assert relay.last_step == 3
    warnings = [e for e in emitted if e["event"] == "warning"]
    assert len(warnings) == 1 and warnings[0]["node"] == "s1" and warnings[0]["reason"] == "bad_line", emitted
    assert relay.tallies["s1"].refused == 100


# -- events files: `gputui runs`, the follower, DDP's launcher ---------------------------------

def hostile_run(home: Path) -> Path:
    run = home / "runs" / "20260101-000000-abcd"
    run.mkdir(parents=True)
    (run / "profile.toml").write_text('[run]\nmodel = "fast"\n')
    lines = [
        json.dumps({"event": "start", "time": 1.0, "run_id": run.name, "model": "fast", "device": "cpu",
                    "strategy": "single", "epochs": 2}).encode(),
        b'\xff\xfe not even text',
        DEEP.encode(),
        b'{"event": "step", "step": 1, "loss": 0.5, "time": %s}' % HUGE.encode(),
        b'{"event": "error", "time": 2.0, "message": "bad byte \xff here", "exit_code": 1}',
    ]
    (run / "events.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    return run


def test_gputui_runs_lists_a_run_whose_events_hold_0xff_bytes_and_hostile_lines(gputui_home: Path) -> None:
    from tests.conftest import run_cli

    run = hostile_run(gputui_home)
    done = run_cli("runs", "--json", timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    listed = json.loads(done.stdout)
    rows = listed if isinstance(listed, list) else listed.get("runs", [])
    row = next(r for r in rows if r["run_id"] == run.name)
    assert row["state"] == "failed" and row["detail"] == "bad byte \ufffd here"  # the last word kept, its byte replaced


def test_the_follower_keeps_an_event_with_a_0xff_byte_and_drops_hostile_lines(tmp_path: Path) -> None:
    from gputui.runs.follow import Follower

    run = hostile_run(tmp_path)
    follower = Follower(run / "events.jsonl", alive=lambda: False)
    got = [event for event, _history in follower.events()]
    assert [e.get("event") for e in got] == ["start", "step", "error"]
    assert got[1]["time"] is None and got[2]["message"] == "bad byte \ufffd here"
    assert follower.dropped == 2


def test_ddp_s_launcher_shows_rank_0_s_events_around_garbage_with_one_warning(tmp_path: Path) -> None:
    from gputui.train.distributed import show_lines

    shown: list[dict[str, Any]] = []
    tally = outside.Tally("the events file")
    lines = [b'{"event": "step", "step": 1, "loss": 0.5}', b"\xff\xfe garbage", DEEP.encode(), b"[1, 2]", b""]
    last = show_lines(lines, shown.append, tally)
    last = show_lines([b"garbage again", b'{"event": "done", "step": 2}'], shown.append, tally) or last
    assert [e["event"] for e in shown] == ["step", "warning", "done"]
    assert shown[1]["reason"] == "bad_line" and shown[1]["message"].startswith("the events file sent")
    assert last is not None and last["event"] == "done" and tally.refused == 4


def test_a_checkpoint_a_dead_remote_worker_could_not_hand_back_is_a_warning_of_the_sweep(tmp_path: Path) -> None:
    scheduler, view = master(tmp_path)
    said = "checkpoint of the trial in /x not pulled back from host h1 (not a regular file); the retry's checkpoint: none"
    handle = SimpleNamespace(kill=lambda: None, exit_code=lambda: None, last_words=lambda: "gone", pid=None,
                             warnings=[said])
    scheduler.workers[0].handle = handle
    scheduler.deaths["hostile"] = 99  # not started again: only what its death says is looked at
    scheduler._lost(scheduler.workers[0])
    assert [w["message"] for w in view.warnings()] == [said]
