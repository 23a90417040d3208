"""Alerts: the `[alerts]` table, the engine (fire once, clear once, repeat at an interval,
never every poll), the watched run and cloud, delivery to a recording command and a local
HTTP server, and `{"alert": ...}` lines from `gputui monitor --json` against a real sshd."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import pytest

from gputui.monitor.alerts import ALERTS_SECTION, AlertEngine, AlertSettings, CloudFacts, Notifier, RunFacts, alert_settings
from gputui.cli import main
from gputui.model.errors import UserError
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.monitor.watches import RunWatch, find_run
from tests.conftest import json_lines
from tests.sshd_fixture import Sshd, SshdFactory, sshd_factory  # noqa: F401


def host(name: str = "rig", state: HostState = HostState.OK, **gpu: Any) -> HostSnapshot:
    values: dict[str, Any] = dict(util_pct=95.0, temperature_c=60.0, mem_used_mib=100.0, mem_total_mib=1000.0, throttle=())
    values.update(gpu)
    gpus = (GpuSample(0, **values),) if state.worked else ()
    return HostSnapshot(name, state, 0.0, gpus=gpus, message=None if state.worked else "connection refused")


def run_rounds(engine: AlertEngine, rounds: list[tuple[float, HostSnapshot]]) -> list[tuple[float, str, str]]:
    out = []
    for now, snap in rounds:
        out += [(now, a.rule, a.state) for a in engine.evaluate([snap], now)]
    return out


def test_temperature_fires_once_clears_once_and_does_not_flap() -> None:
    engine = AlertEngine(AlertSettings(gpu_temperature_c=85))
    temps = [80, 85, 90, 91, 84, 83.5, 82.9, 86, 86]
    said = run_rounds(engine, [(float(t), host(temperature_c=c)) for t, c in enumerate(temps)])
    assert said == [(1.0, "gpu_temperature", "firing"), (6.0, "gpu_temperature", "cleared"), (7.0, "gpu_temperature", "firing")]
    alert = engine.evaluate([host(temperature_c=50.0)], 9.0)[0]
    assert alert.message == "rig GPU 0 temperature: cleared after 2 s (50°C (alert at 85°C))"
    assert (alert.host, alert.gpu, alert.value, alert.threshold, alert.since) == ("rig", 0, 50.0, 85, 7.0)


def test_a_lasting_alert_repeats_at_its_interval_only() -> None:
    engine = AlertEngine(AlertSettings(gpu_memory_pct=90, repeat_s=60))
    said = run_rounds(engine, [(float(t), host(mem_used_mib=950.0)) for t in range(0, 200, 2)])
    assert said == [(0.0, "gpu_memory", "firing"), (60.0, "gpu_memory", "repeat"), (120.0, "gpu_memory", "repeat"),
                    (180.0, "gpu_memory", "repeat")]


def test_throttled_needs_a_busy_gpu_held_back_for_its_time() -> None:
    engine = AlertEngine(AlertSettings(throttled_s=60))
    rounds = [(0.0, host(throttle=("power-cap",))), (59.0, host(throttle=("power-cap",))),
              (60.0, host(throttle=("power-cap", "sw-thermal"))), (61.0, host(throttle=None)),  # no reading: no change
              (90.0, host(throttle=("power-cap",), util_pct=1.0)),  # idle now: not slowed by it
              (100.0, host(throttle=("idle",), util_pct=0.0))]
    assert run_rounds(engine, rounds) == [(60.0, "throttled", "firing"), (90.0, "throttled", "cleared")]
    assert run_rounds(AlertEngine(AlertSettings(throttled_s=0)), [(0.0, host(throttle=("app-clocks",)))]) == []


def test_unreachable_for_its_time_and_back() -> None:
    engine = AlertEngine(AlertSettings(unreachable_s=30))
    rounds = [(0.0, host()), (10.0, host(state=HostState.UNREACHABLE)), (39.0, host(state=HostState.UNREACHABLE)),
              (40.0, host(state=HostState.UNREACHABLE)), (41.0, host(state=HostState.CONNECTING)), (50.0, host())]
    assert run_rounds(engine, rounds) == [(40.0, "unreachable", "firing"), (50.0, "unreachable", "cleared")]
    # while a host does not answer, its GPU alerts neither clear nor fire
    temps = AlertEngine(AlertSettings(gpu_temperature_c=85))
    assert run_rounds(temps, [(0.0, host(temperature_c=90.0)), (1.0, host(state=HostState.UNREACHABLE)),
                              (2.0, host(temperature_c=90.0))]) == [(0.0, "gpu_temperature", "firing")]


def test_idle_gpu_while_a_gputui_run_holds_it() -> None:
    train = GpuProcess(42, name="python -m gputui run --epochs 9", user="ann")
    other = GpuProcess(43, name="python notebook.py", user="bob")
    engine = AlertEngine(AlertSettings(gpu_idle_s=120))
    rounds = [(0.0, host(util_pct=0.0, processes=(other,))), (200.0, host(util_pct=0.0, processes=(other,))),
              (300.0, host(util_pct=0.0, processes=(train,))), (419.0, host(util_pct=2.0, processes=(train,))),
              (420.0, host(util_pct=0.0, processes=(train,))), (430.0, host(util_pct=80.0, processes=(train,)))]
    assert run_rounds(engine, rounds) == [(420.0, "gpu_idle", "firing"), (430.0, "gpu_idle", "cleared")]


def test_a_gpu_that_is_gone_from_an_answering_host_clears() -> None:
    engine = AlertEngine(AlertSettings(gpu_temperature_c=85))
    assert [a.state for a in engine.evaluate([host(temperature_c=99.0)], 0.0)] == ["firing"]
    cleared = engine.evaluate([HostSnapshot("rig", HostState.OK, 1.0, gpus=())], 1.0)
    assert [(a.state, a.message) for a in cleared] == [("cleared", "rig GPU 0 temperature: cleared after 1 s (no longer seen)")]


def test_stalled_and_non_finite_loss_of_a_watched_run(tmp_path: Path) -> None:
    events = tmp_path / "run" / "events.jsonl"
    events.parent.mkdir()
    watch = RunWatch(find_run(str(events.parent)))
    engine = AlertEngine(AlertSettings(stalled_s=300, nan_loss=True))

    def write(*lines: dict[str, Any]) -> RunFacts:
        with events.open("a") as fh:
            fh.write("".join(json.dumps(line) + "\n" for line in lines))
        return watch.poll()

    facts = write({"event": "start", "run_id": "r1", "time": 1000.0}, {"event": "step", "step": 5, "loss": 2.3, "time": 1010.0})
    assert facts.active and facts.loss == 2.3 and facts.step == 5
    assert engine.evaluate([], 1309.0, facts) == []
    (stalled,) = engine.evaluate([], 1310.0, facts)
    assert (stalled.rule, stalled.state, stalled.run_id) == ("stalled", "firing", "r1")
    assert engine.evaluate([], 1400.0, facts) == []  # not every poll
    with events.open("a") as fh:
        fh.write('{"event": "step", "step": 6, "loss": NaN, "time": 1401.0}\n{"event": "step", "st')  # a torn last line
    facts = watch.poll()
    said = {(a.rule, a.state) for a in engine.evaluate([], 1402.0, facts)}
    assert said == {("stalled", "cleared"), ("nan_loss", "firing")} and facts.loss == 2.3  # the last finite loss stays
    with events.open("a") as fh:
        fh.write('ep": 7, "loss": NaN, "time": 1402.5}\n')  # the torn line, completed
    assert watch.poll().step == 7
    facts = write({"event": "error", "reason": "nan", "time": 1403.0, "step": 7,  # as gputui.train.loop's Diverged says it
                   "message": "training diverged: the loss is not finite at step 7 (epoch 1); the last good state ..."})
    assert not facts.active and engine.evaluate([], 5000.0, facts) == []  # an ended run does not stall, NaN said once
    facts = write({"event": "start", "run_id": "r2", "time": 6000.0})
    assert {(a.rule, a.state, a.run_id) for a in engine.evaluate([], 6001.0, facts)} == {("nan_loss", "cleared", "r1")}
    # a run whose first word of it is the error event (no NaN step was written)
    from gputui.monitor.watches import fold

    diverged = fold(RunFacts(run_id="r4", active=True), {"event": "error", "reason": "nan", "message": "training diverged"})
    assert diverged.non_finite == "training diverged" and not diverged.active
    assert fold(RunFacts(run_id="r5"), {"event": "error", "message": "financial trouble: no GPU"}).non_finite is None
    other = AlertEngine(AlertSettings(nan_loss=True))
    bad = RunFacts(run_id="r3", active=False, non_finite="loss is NaN")
    assert [a.message for a in other.evaluate([], 1.0, bad)] == ["run r3: loss is not finite: loss is NaN"]
    with pytest.raises(UserError, match="--run nowhere: no such run"):
        find_run("nowhere", home=tmp_path)


def test_budget_share_of_the_cloud_cluster() -> None:
    engine = AlertEngine(AlertSettings(budget_pct=80))
    spend = [(0.0, 50.0), (1.0, 79.0), (2.0, 80.0), (3.0, 95.0)]
    said = [(t, a.state, a.value) for t, s in spend for a in engine.evaluate([], t, cloud=CloudFacts("c", 100.0, s, 0.0, 1.5))]
    assert said == [(2.0, "firing", 80.0)]


def test_the_alerts_table_schema(tmp_path: Path) -> None:
    from gputui.config.schema import Source

    text = '[alerts]\ngpu_temperature_c = 85\nrepeat_s = 600\nwebhook = "http://127.0.0.1:9/x"\ncommand = "notify-send gputui"\n'
    table = ALERTS_SECTION.validate({"gpu_temperature_c": 85, "repeat_s": 600, "webhook": "http://127.0.0.1:9/x",
                                     "command": "notify-send gputui"}, Source(tmp_path / "p.toml", text))
    settings = AlertSettings.from_table(table)
    assert settings.gpu_temperature_c == 85.0 and settings.repeat_s == 600.0 and settings.gpu_memory_pct is None
    assert all(f.doc for f in ALERTS_SECTION.fields.values())
    for bad, words in (({"webhook": "ftp://x"}, "[alerts] webhook: expected an http:// or https:// URL"),
                       ({"temperature": 80}, "[alerts] temperature: unknown key"),
                       ({"command": "say 'hi"}, "balanced quotes"),
                       ({"gpu_memory_pct": 101}, "[alerts] gpu_memory_pct: expected a number >= 1 and <= 100")):
        with pytest.raises(UserError, match=None) as info:
            ALERTS_SECTION.validate(bad, Source(tmp_path / "p.toml", "[alerts]\n"))
        assert words in str(info.value) and str(tmp_path / "p.toml") in str(info.value)


# -- delivery ---------------------------------------------------------------------------------

class Hook:
    """A local HTTP server recording what is POSTed to it (status `status`)."""

    def __init__(self, status: int = 204) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.status = status
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", 0))
                hook.bodies.append({"type": self.headers.get("Content-Type"), "body": json.loads(self.rfile.read(length))})
                self.send_response(hook.status)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def hook() -> Iterator[Hook]:
    found = Hook()
    yield found
    found.close()


@pytest.fixture
def recorder(tmp_path: Path) -> tuple[str, Path]:
    """A command line that appends its stdin and GPUTUI_ALERT_STATE to a file, one JSON line each."""
    out = tmp_path / "received.jsonl"
    script = tmp_path / "record.py"
    script.write_text("import json, os, sys\n"
                      f"with open({str(out)!r}, 'a') as fh:\n"
                      "    fh.write(json.dumps({'stdin': json.load(sys.stdin), 'state': os.environ['GPUTUI_ALERT_STATE']}) + '\\n')\n")
    return f"{sys.executable} {script}", out


def test_alerts_go_to_the_command_and_the_webhook(hook: Hook, recorder: tuple[str, Path]) -> None:
    command, received = recorder
    settings = AlertSettings(gpu_temperature_c=85, command=command, webhook=hook.url, timeout_s=30)
    engine, lines = AlertEngine(settings), []
    notifier = Notifier(settings, report=lines.append)
    for now, temp in ((0.0, 90.0), (1.0, 91.0), (2.0, 70.0)):
        notifier.send(engine.evaluate([host(temperature_c=temp)], now))
    assert notifier.wait(2, timeout=60), "the two alerts were not delivered"
    notifier.close()
    got = [json.loads(line) for line in received.read_text().splitlines()]
    assert [(g["state"], g["stdin"]["alert"]["state"]) for g in got] == [("firing", "firing"), ("cleared", "cleared")]
    assert [b["body"] for b in hook.bodies] == [g["stdin"] for g in got] and hook.bodies[0]["type"] == "application/json"
    assert hook.bodies[0]["body"]["alert"]["message"] == "rig GPU 0 temperature: 90°C (alert at 85°C)"
    assert lines == []


def test_delivery_failures_are_one_line_each(tmp_path: Path) -> None:
    broken = Hook(status=500)
    try:
        lines: list[str] = []
        settings = AlertSettings(gpu_temperature_c=1, command=f"{sys.executable} -c 'import sys; sys.exit(\"disk full\")'",
                                 webhook=broken.url, timeout_s=30)
        notifier = Notifier(settings, report=lines.append)
        notifier.send(AlertEngine(settings).evaluate([host()], 0.0))
        assert notifier.wait(1, timeout=60)
        missing = Notifier(replace(settings, command=str(tmp_path / "no-such-command"), webhook="http://127.0.0.1:1/x"),
                           report=lines.append)
        missing.send(AlertEngine(settings).evaluate([host()], 0.0))
        assert missing.wait(1, timeout=60)
        notifier.close()
        missing.close()
    finally:
        broken.close()
    assert lines[0].startswith("alert command ") and lines[0].endswith("failed (exit 1): disk full")
    assert lines[1].startswith("alert webhook 127.0.0.1:") and "HTTP 500" in lines[1]
    assert "cannot run" in lines[2] and lines[3].startswith("alert webhook 127.0.0.1:1: ")
    assert all("\n" not in line for line in lines) and len(lines) == 4


# -- gputui monitor: {"alert": ...} lines, from a profile, against a real sshd ----------------


def test_monitor_json_prints_alert_lines_once_and_delivers_them(
    sshd_factory: SshdFactory, tmp_path: Path, hook: Hook, recorder: tuple[str, Path],
) -> None:
    import signal

    from tests.conftest import cli_env
    from tests.proc_support import Child

    server = sshd_factory("r580-h100x8")  # GPU 2 at 88 C; GPUs 1, 2, 3 and 5 held back while busy
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(server.known_hosts_line())
    command, received = recorder
    profile = tmp_path / "watch.toml"
    profile.write_text(f'[[hosts]]\nname = "rig"\naddress = "127.0.0.1"\nport = {server.port}\nuser = "root"\n'
                       f'identity_file = "{sshd_factory.user_key}"\n\n'
                       f'[alerts]\ngpu_temperature_c = 85\nthrottled_s = 0\ncommand = "{command}"\nwebhook = "{hook.url}"\n')
    env = cli_env(HOME=str(home))
    env.pop("SSH_AUTH_SOCK", None)
    argv = [sys.executable, "-m", "gputui", "monitor", "--json", "--no-local", "--profile", str(profile), "--interval", "0.1"]
    try:
        with Child(argv, env=env, name="gputui monitor --json") as child:
            child.wait_for(lambda e: "alert" in e, 60, "the first alert line")
            after = len(child.events)
            child.wait_for(lambda e: "hosts" in e and len([x for x in child.events[after:] if "hosts" in x]) >= 5, 60,
                           "five more rounds")
            child.proc.send_signal(signal.SIGTERM)  # the monitor ends cleanly: queued alerts are delivered
            assert child.finish(60) == 0, child.stderr
            lines = child.events
    finally:
        server.stop()
    alerts = [line["alert"] for line in lines if "alert" in line]
    assert sorted((a["rule"], a["gpu"], a["state"]) for a in alerts) == [
        ("gpu_temperature", 2, "firing"), ("throttled", 1, "firing"), ("throttled", 2, "firing"), ("throttled", 3, "firing"),
        ("throttled", 5, "firing")]  # once each, not on every round
    first = next(n for n, line in enumerate(lines) if "alert" in line)
    assert "hosts" in lines[first - 1] and lines[first - 1]["hosts"][0]["state"] == "ok"  # after the round that raised them
    assert all(a["host"] == "rig" and a["message"].startswith(f"rig GPU {a['gpu']} ") for a in alerts)
    delivered = [json.loads(line)["stdin"]["alert"] for line in received.read_text().splitlines()]
    assert delivered == alerts and [b["body"]["alert"] for b in hook.bodies] == alerts
