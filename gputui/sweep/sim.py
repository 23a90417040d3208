"""A simulated slot: a worker that answers the sweep protocol from a thread, without torch.

Its trials end at once with a test accuracy made from their parameters, so the scheduler's
rules (budget, retries, counting) are tested in milliseconds, and a cloud slot's spend can be
played with `usd_per_hour`. `die_on` lists trial numbers whose first attempt on this slot kills
the worker mid-trial (its output ends, as a SIGKILLed process's does); `fail_on` lists trials
that end with an error on this slot.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from gputui.model import events
from gputui.sweep import protocol
from gputui.sweep.base import WorkerGone

_pids = itertools.count(900000)


def accuracy(params: dict[str, Any], evaluation: int) -> float:
    """A made-up curve: best near lr = 0.01, rising with the evaluations."""
    lr = float(params.get("lr", 0.01))
    peak = 99.0 - 10 * abs(math.log10(lr) + 2)
    return max(5.0, peak - 20.0 / evaluation)


class SimHandle:
    def __init__(self, slot: "SimSlot") -> None:
        self.slot = slot
        self.pid: int | None = next(_pids)
        self._out: "queue.Queue[str | None]" = queue.Queue()
        self._alive = True
        self._out.put(protocol.encode({"op": "ready", "pid": self.pid, "device": slot.device, "torch": "sim",
                                       "threads": 1, "load_s": 0.0}))

    def send(self, message: dict[str, Any]) -> None:
        if not self._alive:
            raise WorkerGone("the simulated worker is gone")
        if message.get("op") == "exit":
            self.kill()
        elif message.get("op") == "trial":
            self._trial(message)

    def _trial(self, message: dict[str, Any]) -> None:
        number = int(message["trial"])
        self.slot.seen.append((number, int(message.get("attempt", 1))))
        from gputui.config.profile import parse_profile

        run = parse_profile(str(message["profile"])).run
        params = {"lr": run.lr}
        put = self._out.put
        put(protocol.encode({"op": "event", "trial": number, "data": events.make("start", run_id=f"t{number}")}))
        if number in self.slot.die_on and number not in self.slot.died:
            self.slot.died.add(number)
            for k in range(1, self.slot.die_after + 1):  # what it evaluated before dying (1 point below a full run's)
                put(protocol.encode({"op": "event", "trial": number, "eval": k, "data": events.make(
                    "eval", epoch=1, step=k, test_acc=accuracy(params, k) - 1.0, elapsed_s=0.1 * k)}))
            self.kill()
            return
        if number in self.slot.fail_on:
            put(protocol.encode({"op": "result", "trial": number, "outcome": "error", "reason": "error",
                                 "error": f"simulated failure of trial {number}"}))
            return
        if self.slot.gate is not None:  # the trial ends once the test opens the gate
            threading.Thread(target=self._finish, args=(number, params), daemon=True).start()
            return
        self._finish(number, params)

    def _finish(self, number: int, params: dict[str, Any]) -> None:
        if self.slot.gate is not None:
            self.slot.gate.wait(60)
        put = self._out.put
        acc = 0.0
        for k in range(1, self.slot.evaluations + 1):
            acc = accuracy(params, k)
            put(protocol.encode({"op": "event", "trial": number, "eval": k,
                                 "data": events.make("eval", epoch=1, step=k, test_acc=acc, elapsed_s=0.1 * k)}))
        if self.slot.advance is not None:
            self.slot.advance(self.slot.trial_s)  # the trial's time passes on the sweep's clock
        put(protocol.encode({"op": "result", "trial": number, "outcome": "done", "test_acc": acc, "best_acc": acc,
                             "elapsed_s": 0.1 * self.slot.evaluations}))

    def lines(self) -> Iterator[str]:
        while True:
            line = self._out.get()
            if line is None:
                return
            yield line

    def kill(self) -> None:
        if self._alive:
            self._alive = False
            self._out.put(None)

    def alive(self) -> bool:
        return self._alive

    def exit_code(self) -> int | None:
        return None if self._alive else -9

    def last_words(self) -> str:
        return "" if self._alive else "killed (simulated)"


@dataclass
class SimSlot:
    """A slot whose worker is simulated; `seen` records (trial, attempt) of every trial it was sent."""

    name: str
    device: str = "sim"
    usd_per_hour: float = 0.0
    evaluations: int = 3
    die_on: set[int] = field(default_factory=set)
    die_after: int = 0  # evaluations a trial of die_on reports before its worker dies
    fail_on: set[int] = field(default_factory=set)
    seen: list[tuple[int, int]] = field(default_factory=list)
    died: set[int] = field(default_factory=set)
    closed: bool = False
    advance: Callable[[float], None] | None = None  # moves a test's clock on by trial_s at each trial's end
    trial_s: float = 0.0
    gate: threading.Event | None = None  # set: each trial ends only once the gate is open

    def spawn(self) -> SimHandle:
        return SimHandle(self)

    def close(self) -> None:
        self.closed = True
