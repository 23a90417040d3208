"""The dashboard's monitoring parts (App.run_test): throttle reasons in the GPU rows, the process
table (P: sort, filter, signals after a confirmation, sent in a worker), and the profile's
[alerts] evaluated in the poll worker, shown in the events and handed to the notifier."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Sequence

from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.monitor.polling import Telemetry
from gputui.ui.app import create_app
from gputui.ui.events_panel import EventsLog
from gputui.ui.hosts_panel import HostsView
from gputui.ui.processes_panel import ProcessScreen, ProcessTable
from gputui.ui.screens import ChoiceScreen
from tests.dashboard_support import drive, make_backend, screen_text, wait_for
from tests.signal_counter import signal_counter, signals_got


def log_text(app: Any) -> str:
    return "\n".join(app.query_one(EventsLog).lines_written)


def gpu(index: int, util: float = 90.0, temp: float = 50.0, throttle: tuple[str, ...] | None = (),
        processes: Sequence[GpuProcess] = ()) -> GpuSample:
    return GpuSample(index, name="NVIDIA H100 80GB HBM3", util_pct=util, mem_used_mib=1000.0, mem_total_mib=81559.0,
                     temperature_c=temp, power_w=300.0, throttle=throttle, processes=tuple(processes))


def host(name: str, *gpus: GpuSample) -> HostSnapshot:
    return HostSnapshot(name, HostState.OK, time.time(), kind="sim", cpu_pct=10.0, mem_used_mib=1000.0,
                        mem_total_mib=64000.0, gpus=gpus)


class Scripted:
    """A source that gives the rounds it is given (the last one again and again), records what it
    is asked, and answers kills as told."""

    def __init__(self, rounds: list[list[HostSnapshot]], kill_answer: Any = (True, "SIGTERM sent (scripted)")) -> None:
        self.rounds = rounds
        self.polls = 0
        self.kills: list[tuple[str, int, str]] = []
        self.kill_answer = kill_answer
        self.sm_asks: list[tuple[bool, str]] = []  # (on, thread name)

    def poll(self) -> list[HostSnapshot]:
        self.polls += 1
        return self.rounds[min(self.polls, len(self.rounds)) - 1]

    def want_process_sm(self, on: bool) -> None:
        self.sm_asks.append((on, threading.current_thread().name))

    def kill(self, host_name: str, pid: int, signal_name: str) -> tuple[bool, str]:
        self.kills.append((host_name, pid, signal_name))
        if isinstance(self.kill_answer, Exception):
            raise self.kill_answer
        return self.kill_answer

    def close(self) -> None:
        pass


def test_a_busy_throttled_gpu_shows_why_and_an_idle_one_does_not() -> None:
    source = Scripted([[host("rig", gpu(0, 93.0, throttle=("power-cap",)), gpu(1, 1.0, throttle=("sw-thermal",)),
                             gpu(2, 95.0, throttle=("idle",)), gpu(3, 95.0, throttle=None))]])
    app = create_app(make_backend(source=source))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1, what="a round")
        # The round drawn (its GPU rows): a busy machine may draw it a while after the poll.
        await wait_for(pilot, lambda: all("W " in ln for ln in screen_text(app).splitlines()[3:7]),
                       what="the round's four GPU rows drawn (their power column)")
        lines = screen_text(app).splitlines()
        rows = {line.split("│")[1].split()[0]: line.split("│")[1] for line in lines[3:7]}
        assert "power-cap" in rows["0"], rows
        assert "sw-thermal" not in rows["1"] and "idle" not in rows["2"] and "n/a" not in rows["3"].split("W", 1)[1]
        style = app.query_one(HostsView).get_component_rich_style("hosts--throttle", partial=True)
        assert style.color is not None  # drawn in the warning colour
        await pilot.press("q")

    drive(app, scenario)


def processes_round() -> list[HostSnapshot]:
    def proc(pid: int, user: str, mem: float, sm: float | None, cpu: float, command: str) -> GpuProcess:
        return GpuProcess(pid, command, user, mem, sm, cpu, 1000.0, 75.0)

    return [host("alpha", gpu(0, processes=[proc(300, "carol", 2000.0, 10.0, 50.0, "python infer.py")]),
                 gpu(1, processes=[proc(100, "alice", 9000.0, 5.0, 200.0, "python train.py --big")])),
            host("beta", gpu(0, processes=[proc(200, "bob", 500.0, 80.0, 20.0, "python train.py"),
                                           proc(400, "bob", 100.0, None, 5.0, "[bob's shell]")]))]


def shown_pids(app: Any) -> list[int]:
    screen = app.screen_stack[1] if len(app.screen_stack) > 1 else app.screen
    assert isinstance(screen, ProcessScreen)
    table = screen.query_one(ProcessTable)
    return [int(str(table.get_row_at(i)[2]).strip()) for i in range(table.row_count)]



async def signal_the_selected_process(pilot: Any, app: Any, key: str) -> None:
    """Send a signal from the process table, each key once what it acts on is there: on a busy
    machine the table's rows or the question may be drawn a while after the key before."""
    await wait_for(pilot, lambda: isinstance(app.screen, ProcessScreen) and bool(shown_pids(app))
                   and not [w for w in app.workers if w.name == "process-signal" and not w.is_finished],
                   what="the process table on top with its rows, no kill under way")
    await pilot.press(key)
    await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen), what=f"the question before {key}")
    await pilot.press("s")


def test_process_table_sorts_filters_and_signals_after_asking() -> None:
    source = Scripted([processes_round()])
    app = create_app(make_backend(source=source))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1)
        assert not any(on for on, _ in source.sm_asks)
        await pilot.press("P")
        assert isinstance(app.screen, ProcessScreen)
        await wait_for(pilot, lambda: (True, ) in [(on,) for on, _ in source.sm_asks], what="SM % asked for")
        assert all(thread != threading.main_thread().name for _, thread in source.sm_asks)  # by the poll worker
        # GPU memory, largest first (the screen holds the rows from a round's frame: wait for one)
        await wait_for(pilot, lambda: shown_pids(app) == [100, 300, 200, 400], what="the rows, largest GPU memory first")
        # The rows drawn (a busy machine may paint them a while after the table holds them).
        await wait_for(pilot, lambda: "python train.py --big" in screen_text(app), what="the table's rows drawn")
        text = screen_text(app)
        assert "alice" in text and "[bob's shell]" in text  # text, not markup
        for key, order in (("s", [200, 300, 100, 400]), ("c", [100, 300, 200, 400]), ("i", [100, 200, 300, 400]),
                           ("n", [100, 200, 400, 300]), ("r", [300, 200, 400, 100]), ("m", [100, 300, 200, 400])):
            await pilot.press(key)
            assert shown_pids(app) == order, key
        await pilot.press("slash", *"user:bob", "enter")
        assert sorted(shown_pids(app)) == [200, 400]
        await pilot.press("slash", "ctrl+u", *"TRAIN", "enter")  # part of a command, any case
        assert shown_pids(app) == [100, 200]
        await pilot.press("down")  # the second row: bob's pid 200 on beta
        await pilot.press("T")
        assert isinstance(app.screen, ChoiceScreen) and "SIGTERM to pid 200" in screen_text(app)
        await pilot.press("c")  # cancel: nothing is sent
        assert isinstance(app.screen, ProcessScreen) and source.kills == []
        await pilot.press("K", "s")
        await wait_for(pilot, lambda: "SIGTERM sent (scripted)" in log_text(app), what="the kill's line")
        assert source.kills == [("beta", 200, "KILL")]
        await wait_for(pilot, lambda: "SIGTERM sent (scripted)" in screen_text(app), what="the kill's line on the process screen")
        await pilot.press("escape")
        assert not isinstance(app.screen, ProcessScreen)
        await wait_for(pilot, lambda: source.sm_asks[-1][0] is False, what="SM % no longer asked for")
        await pilot.press("q")

    drive(app, scenario)


def test_a_refused_or_failing_kill_is_one_line_in_the_events() -> None:
    source = Scripted([processes_round()], kill_answer=(False, "kill refused: pid 100 on alpha belongs to alice"))
    app = create_app(make_backend(source=source))
    failures: list[Any] = []

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.hosts_polls >= 1)
        await pilot.press("P")
        await signal_the_selected_process(pilot, app, "I")
        await wait_for(pilot, lambda: "kill refused: pid 100 on alpha belongs to alice" in log_text(app))
        source.kill_answer = OSError("connection reset")
        await signal_the_selected_process(pilot, app, "I")
        await wait_for(pilot, lambda: "kill failed: pid 100 on alpha: connection reset" in log_text(app))
        assert source.kills == [("alpha", 100, "INT")] * 2
        failures.extend(w for w in app.workers if w.error is not None)
        await pilot.press("escape", "q")

    drive(app, scenario)
    assert failures == []


class LocalNvml:
    """What Telemetry needs of the NVML source: this machine's name, one round, the SM switch."""

    name = "local"

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.process_sm = False

    def poll(self) -> list[HostSnapshot]:
        me = __import__("getpass").getuser()
        return [HostSnapshot("local", HostState.OK, time.time(), kind="local",
                             gpus=(gpu(0, processes=[GpuProcess(self.pid, "sleep 60", me, 700.0)]),))]

    def close(self) -> None:
        pass


def test_sigterm_from_the_table_reaches_a_real_local_process() -> None:
    child = subprocess.Popen(["sleep", "60"])
    local = LocalNvml(child.pid)
    app = create_app(make_backend(source=Telemetry(local, None)))
    try:
        async def scenario(pilot: Any) -> None:
            await wait_for(pilot, lambda: app.hosts_polls >= 1)
            await pilot.press("P")
            await wait_for(pilot, lambda: local.process_sm, what="NVML asked for SM %")
            await signal_the_selected_process(pilot, app, "T")
            await wait_for(pilot, lambda: f"SIGTERM sent to pid {child.pid} (sleep 60) on local" in log_text(app))
            await pilot.press("escape")
            await wait_for(pilot, lambda: not local.process_sm, what="SM % off again")
            await pilot.press("q")

        drive(app, scenario)
        assert child.wait(10) == -15
    finally:
        child.kill()
        child.wait()


class ReusedPidNvml(LocalNvml):
    """LocalNvml whose snapshot saw another process under the pid: one that started a minute
    before the live one did (as if the snapshot's process ended and its pid was given again)."""

    def poll(self) -> list[HostSnapshot]:
        import psutil

        me = __import__("getpass").getuser()
        started = psutil.Process(self.pid).create_time() - 60.0
        return [HostSnapshot("local", HostState.OK, time.time(), kind="local",
                             gpus=(gpu(0, processes=[GpuProcess(self.pid, "python train.py", me, 700.0,
                                                                started=started)]),))]


def test_a_kill_confirmed_after_the_pid_was_reused_sends_nothing() -> None:
    with signal_counter() as child:
        pid = child.proc.pid
        app = create_app(make_backend(source=Telemetry(ReusedPidNvml(pid), None)))

        async def scenario(pilot: Any) -> None:
            await wait_for(pilot, lambda: app.hosts_polls >= 1)
            await pilot.press("P")
            await signal_the_selected_process(pilot, app, "T")
            refused = f"process {pid} has ended (its PID now belongs to another process): nothing sent"
            await wait_for(pilot, lambda: refused in log_text(app), what="the kill's refusal")
            await pilot.press("escape", "q")

        drive(app, scenario)
        assert signals_got(child) == 0


RECORDER = "import sys; open(sys.argv[1], 'a').write(sys.stdin.read().strip() + '\\n')"


def test_alerts_fire_once_clear_once_in_the_events_and_to_the_command(tmp_path: Path, monkeypatch: Any) -> None:
    got = tmp_path / "alerts.jsonl"
    script = tmp_path / "record.py"
    script.write_text(RECORDER, encoding="utf-8")
    profile = tmp_path / "alerting.toml"
    profile.write_text(f"[alerts]\ngpu_temperature_c = 80\ncommand = \"{sys.executable} {script} {got}\"\n",
                       encoding="utf-8")
    hot, cool = [host("rig", gpu(0, temp=91.0))], [host("rig", gpu(0, temp=50.0))]
    source = Scripted([cool, hot, hot, hot, hot, cool])  # then cool for ever
    threads: list[str] = []
    from gputui.dashboard import alerting

    evaluate = alerting.DashboardAlerts.round

    def round_(self: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(alerting.DashboardAlerts, "round", round_)
    app = create_app(make_backend(profile, source=source))

    async def scenario(pilot: Any) -> str:
        await wait_for(pilot, lambda: "ALERT cleared" in log_text(app), what="the alert to clear")
        polls = app.hosts_polls
        await wait_for(pilot, lambda: app.hosts_polls >= polls + 3, what="more rounds")
        await wait_for(pilot, lambda: got.is_file() and len(got.read_text().splitlines()) >= 2, what="the command")
        highlighted = [s for s in app.query_one(EventsLog).lines if "ALERT firing" in s.text]
        assert highlighted and any(seg.style is not None and seg.style.bgcolor is not None
                                   for seg in highlighted[0]._segments)
        log = log_text(app)
        await pilot.press("q")
        return log

    log = drive(app, scenario)
    assert log.count("ALERT firing: rig GPU 0 temperature: 91°C (alert at 80°C)") == 1, log
    assert log.count("ALERT cleared: rig GPU 0 temperature") == 1
    assert threads and threading.main_thread().name not in threads  # evaluated in the poll worker
    sent = [json.loads(line)["alert"] for line in got.read_text(encoding="utf-8").splitlines()]
    assert [(a["rule"], a["state"], a["host"]) for a in sent] == [("gpu_temperature", "firing", "rig"),
                                                                  ("gpu_temperature", "cleared", "rig")]
