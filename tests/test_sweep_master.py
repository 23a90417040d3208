"""One master per sweep (the study's master lock), a shutdown whose steps do not depend on each
other, and a trial finished by someone else: on simulated slots (gputui.sweep.sim), in-process."""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.sweep import scheduler as sched
from gputui.sweep import study as studies
from gputui.sweep.sim import SimHandle, SimSlot
from gputui.sweep.space import parse_text
from tests.sweep_support import Seen

WAIT_S = 60.0
PROFILE = '[run]\nmodel = "fast"\n[sweep]\nname = "{name}"\ntrials = {trials}\npruner = "none"\nlr = [1e-3, 1e-1]\n'


@dataclass
class Signalling(SimSlot):
    """A simulated slot that sets `trial_sent` once its worker is sent a trial."""

    trial_sent: threading.Event = field(default_factory=threading.Event)

    def spawn(self) -> SimHandle:
        handle = SimHandle(self)
        send = handle.send

        def sending(message: dict[str, Any]) -> None:
            send(message)
            if message.get("op") == "trial":
                self.trial_sent.set()

        handle.send = sending  # type: ignore[method-assign]
        return handle


def trials_of(name: str) -> list[tuple[int, str, dict[str, Any]]]:
    """The study's trials as a fresh reader sees them: (number, state, user attributes)."""
    import optuna

    study = optuna.load_study(study_name=name, storage=studies.storage())
    return [(t.number, t.state.name, dict(t.user_attrs)) for t in study.get_trials()]


def test_a_second_master_on_a_running_sweep_is_refused_before_it_touches_a_trial(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    profile = tmp_path / "s.toml"
    profile.write_text(PROFILE.format(name="s", trials=1))
    gate = threading.Event()  # the first master's trial ends once the second master has been refused
    slot = Signalling("a", gate=gate)
    made: list[str] = []

    def slots(_profile: Any, spec: Any, _logs: Path, _workers: int | None = None) -> list[Any]:
        made.append(spec.name)
        return [slot] if len(made) == 1 else [SimSlot("second")]

    monkeypatch.setattr("gputui.sweep.slots.sweep_slots", slots)
    second: dict[str, Any] = {}

    def second_master() -> None:
        try:
            if not slot.trial_sent.wait(WAIT_S):
                second["error"] = f"the first master sent no trial to its worker within {WAIT_S:.0f} s"
                return
            second["code"] = main(["sweep", "--resume", "s", "--json"])
            second["trials"] = trials_of("s")
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            second["error"] = repr(exc)
        finally:
            gate.set()

    thread = threading.Thread(target=second_master, name="second-master")
    thread.start()
    try:
        first = main(["sweep", str(profile), "--json"])
    finally:
        gate.set()
        thread.join(WAIT_S)
    assert not thread.is_alive(), "the second master did not end"
    assert "error" not in second, second["error"]
    err = capsys.readouterr().err
    assert second["code"] == 2
    assert f"gputui: error: sweep s is running (pid {os.getpid()}): stop it first, or wait\n" in err, err
    assert made == ["s"]  # the second master started no slot
    number, state, attrs = second["trials"][0]
    assert len(second["trials"]) == 1 and (number, state) == (0, "RUNNING") and studies.REQUEUED not in attrs
    assert first == 0
    assert [(n, s) for n, s, _ in trials_of("s")] == [(0, "COMPLETE")]  # the first master told it
    assert slot.closed


def test_a_sweep_runs_again_once_its_master_is_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    profile = tmp_path / "s.toml"
    profile.write_text(PROFILE.format(name="s", trials=1))
    monkeypatch.setattr("gputui.sweep.slots.sweep_slots", lambda *_a, **_k: [SimSlot("a")])
    assert main(["sweep", str(profile), "--json"]) == 0
    assert main(["sweep", "--resume", "s", "--trials", "2", "--json"]) == 0  # the lock went with the first
    assert [s for _n, s, _a in trials_of("s")] == ["COMPLETE", "COMPLETE"]


class Stubborn(SimHandle):
    """A worker handle whose kill raises (after ending the simulated worker)."""

    def kill(self) -> None:
        super().kill()
        raise OSError(f"stub: cannot kill the worker of {self.slot.name}")


@dataclass
class Recording(SimSlot):
    """A slot whose worker cannot be killed; `close_raises`: its close raises too (after recording it)."""

    close_raises: bool = False
    closes: int = 0

    def spawn(self) -> SimHandle:
        return Stubborn(self)

    def close(self) -> None:
        self.closes += 1
        if self.close_raises:
            raise RuntimeError(f"stub: slot {self.name} cannot be released")


def test_a_shutdown_whose_first_step_raises_still_closes_every_slot(tmp_path: Path) -> None:
    profile, spec = parse_text(PROFILE.format(name="sd", trials=2), tmp_path / "sd.toml")
    slots = [Recording("a", close_raises=True), Recording("b"), Recording("c")]
    view = Seen()
    s = sched.Scheduler(studies.create(spec), spec, profile.run, slots, view)
    progress = s.run()  # each worker's end raises (the shutdown's first steps), then slot a's close
    assert progress.done == 2
    assert [sl.closes for sl in slots] == [1, 1, 1]
    failed = [f["step"] for f in view.of("shutdown_failed")]
    assert sorted(failed) == ["close slot a", "end worker a", "end worker b", "end worker c"]  # once each
    assert len(s.shutdown_errors) == 4 and "close slot a: stub: slot a cannot be released" in s.shutdown_errors


def test_a_trial_finished_by_someone_else_is_a_warning_and_the_sweep_goes_on(tmp_path: Path) -> None:
    import optuna
    from optuna.trial import TrialState

    profile, spec = parse_text(PROFILE.format(name="other", trials=1), tmp_path / "other.toml")
    gate = threading.Event()
    slot = Signalling("a", gate=gate)
    view = Seen()
    s = sched.Scheduler(studies.create(spec), spec, profile.run, [slot], view)
    outside: dict[str, str] = {}

    def someone_else() -> None:  # tells trial 0 FAIL through a storage of its own while it runs
        try:
            if not slot.trial_sent.wait(WAIT_S):
                outside["error"] = f"no trial was sent within {WAIT_S:.0f} s"
                return
            optuna.load_study(study_name="other", storage=studies.storage()).tell(0, state=TrialState.FAIL)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            outside["error"] = repr(exc)
        finally:
            gate.set()

    thread = threading.Thread(target=someone_else, name="someone-else")
    thread.start()
    try:
        progress = s.run()
    finally:
        gate.set()
        thread.join(WAIT_S)
    assert "error" not in outside, outside["error"]
    warnings = [f for f in view.of("warning") if f.get("trial") == 0]
    assert len(warnings) == 1 and "finished in the study already" in warnings[0]["message"]
    assert progress.done == 1 and progress.complete == 1  # trial 0 not counted: a new one ran
    assert [(n, st) for n, st, _ in trials_of("other")] == [(0, "FAIL"), (1, "COMPLETE")]
    assert slot.closed
