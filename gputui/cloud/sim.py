"""A simulated cloud: seeded spot prices, a launch delay, scripted interruptions and
capacity errors. For the demo mode, UI tests and cost tests; thread-safe.

With a state file the simulation outlives the process, so `gputui cloud up --provider
sim` then `gputui cloud ls --provider sim` see the same instances. The clock is
injectable: tests drive time by hand (`GPUTUI_SIM_CLOCK`: a file holding the time, for
several processes).

Each instance runs a simulated watchdog (gputui/cloud/watchdog.sh, which its user data
installs) when the script says so: on the simulation's clock it checks every
`watchdog_interval_s` from boot, with the shell script's rules and order, whether the
budget time, the lease, the maximum life or the idle time has passed, and then the
instance shuts itself down (state reason Client.InstanceInitiatedShutdown) and its
console says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import random
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from gputui.cloud.tags import SELF_STOP_CODE, TAG_BUDGET, TAG_IDLE, TAG_LEASE, TAG_MAX
from gputui.cloud.pricing import ON_DEMAND_USD, SourcedPrice, table_price
from gputui.cloud.provider import CapacityError, LaunchRequest, parse_console_host_keys
from gputui.cloud.userdata import MARKER, user_data
from gputui.model.errors import UserError
from gputui.model.cloud import InstanceInfo

SPOT_REASON = "Server.SpotInstanceTermination"
USER_REASON = "Client.UserInitiatedShutdown"


@dataclass(frozen=True)
class SimScript:
    """What the simulated cloud does. Interruptions are keyed by launch ordinal (0, 1, ...)."""

    seed: int = 0
    launch_delay_s: float = 2.0
    shutdown_delay_s: float = 1.0
    interrupt_after_s: float | None = None  # every spot instance is reclaimed this long after launch
    # every spot instance is reclaimed once the simulation has reported it running this many times
    # (describe, list_tagged): an interruption tied to the polls that see it, not to the clock
    interrupt_after_polls: int | None = None
    interruptions: Mapping[int, float] = field(default_factory=dict)  # ordinal -> seconds after launch
    capacity_errors: Mapping[str, str] = field(default_factory=dict)  # zone (or "*") -> spot error code
    on_demand_errors: Mapping[str, str] = field(default_factory=dict)  # zone (or "*") -> error code
    # the SSH host keys ("type base64") every instance prints on its console once it runs
    host_keys: tuple[str, ...] = ()
    # instances whose user data installs the watchdog run it (off here: tests that drive the
    # clock by the hour without renewing opt in; the command line's simulation runs it)
    watchdog: bool = False
    watchdog_interval_s: float = 30.0  # the shell script's default


def _parse_errors(text: str) -> dict[str, str]:
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        zone, _, code = item.partition("=")
        out[zone] = code or "InsufficientInstanceCapacity"
    return out


def _file_clock(path: Path) -> Callable[[], float]:
    """A clock read from a file (Unix seconds), so tests drive several processes' time by hand."""
    def clock() -> float:
        try:
            return float(path.read_text(encoding="ascii").strip())
        except (OSError, ValueError) as exc:
            raise UserError(f"GPUTUI_SIM_CLOCK={path}: {exc}") from None

    return clock


def _read_keys(path: str) -> tuple[str, ...]:
    if not path:
        return ()
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ValueError(f"GPUTUI_SIM_HOST_KEYS={path}: {exc.strerror or exc}") from None
    return tuple(" ".join(ln.split()[:2]) for ln in lines if len(ln.split()) >= 2)


CALLS_KEPT = 10_000

class SimProvider:
    """CloudProvider in memory (or in a JSON state file shared by processes)."""

    name = "sim"

    def __init__(self, region: str = "us-east-1", script: SimScript | None = None,
                 clock: Callable[[], float] = time.time, state_path: Path | None = None) -> None:
        self.region = region
        self.script = script or SimScript()
        self.clock = clock
        self.state_path = state_path
        self._lock = threading.Lock()
        self._memory: dict[str, Any] = {"next": 0, "instances": {}, "key_pairs": {}, "groups": {}}
        # The operations served, newest last, for tests and the demo's activity view; the last
        # CALLS_KEPT only (a demo left open polls every 2 s: a list grew without end).
        self.calls: deque[str] = deque(maxlen=CALLS_KEPT)

    @classmethod
    def from_env(cls, region: str, state_path: Path) -> "SimProvider":
        """Configured by GPUTUI_SIM_SEED, _LAUNCH_DELAY, _INTERRUPT_AFTER (seconds), _INTERRUPT_AFTER_POLLS,
        _CAPACITY_ERRORS (zone=Code,...), _HOST_KEYS (a file of public keys the consoles show),
        _WATCHDOG (0: the instances' watchdogs do not run), _CLOCK (a file holding the time)."""
        env = os.environ
        clock: Callable[[], float] = time.time
        if env.get("GPUTUI_SIM_CLOCK"):
            clock = _file_clock(Path(env["GPUTUI_SIM_CLOCK"]))
        try:
            script = SimScript(
                seed=int(env.get("GPUTUI_SIM_SEED", "0")),
                launch_delay_s=float(env.get("GPUTUI_SIM_LAUNCH_DELAY", "2")),
                interrupt_after_s=float(env["GPUTUI_SIM_INTERRUPT_AFTER"]) if env.get("GPUTUI_SIM_INTERRUPT_AFTER") else None,
                interrupt_after_polls=(int(env["GPUTUI_SIM_INTERRUPT_AFTER_POLLS"])
                                       if env.get("GPUTUI_SIM_INTERRUPT_AFTER_POLLS") else None),
                capacity_errors=_parse_errors(env.get("GPUTUI_SIM_CAPACITY_ERRORS", "")),
                host_keys=_read_keys(env.get("GPUTUI_SIM_HOST_KEYS", "")),
                watchdog=env.get("GPUTUI_SIM_WATCHDOG", "1") != "0",
            )
        except ValueError as exc:
            raise UserError(f"GPUTUI_SIM_*: {exc}") from None
        return cls(region, script, clock=clock, state_path=state_path)

    @contextmanager
    def _state(self, op: str) -> Iterator[dict[str, Any]]:
        with self._lock:
            self.calls.append(op)
            if self.state_path is None:
                self._watch_all(self._memory)
                yield self._memory
                return
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.state_path, "a+", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.seek(0)
                text = fh.read()
                state = json.loads(text) if text.strip() else {"next": 0, "instances": {}, "key_pairs": {}, "groups": {}}
                self._watch_all(state)
                yield state
                fh.seek(0)
                fh.truncate()
                fh.write(json.dumps(state))

    def zones(self) -> list[str]:
        return [f"{self.region}{letter}" for letter in "abc"]

    def spot_price(self, instance_type: str, zone: str, when: float) -> float:
        """The seeded spot price: a zone discount of 55-75% that wanders by up to 10% each hour."""
        base = ON_DEMAND_USD.get(instance_type, 1.0)
        discount = random.Random(f"{self.script.seed}:{instance_type}:{zone}").uniform(0.25, 0.45)
        wiggle = random.Random(f"{self.script.seed}:{instance_type}:{zone}:{int(when // 3600)}").uniform(-0.1, 0.1)
        return round(base * discount * (1 + wiggle), 4)

    def spot_prices(self, instance_type: str, zones: Sequence[str]) -> dict[str, float]:
        now = self.clock()
        with self._state("spot_prices"):
            return {z: self.spot_price(instance_type, z, now) for z in self.zones() if not zones or z in zones}

    def spot_source(self) -> str:
        return "sim"

    def on_demand_price(self, instance_type: str) -> SourcedPrice | None:
        """The simulation has no price API: the table, saying so."""
        return table_price(instance_type)

    def resolve_image(self, ami: str) -> str:
        with self._state("resolve_image"):
            return ami if not ami.startswith("ssm:") else "ami-" + hashlib.sha256(ami.encode()).hexdigest()[:17]

    def ensure_key_pair(self, name: str, public_key: str, tags: Mapping[str, str]) -> str:
        with self._state("ensure_key_pair") as state:
            state["key_pairs"].setdefault(name, public_key)
        return name

    def ensure_security_group(self, name: str, ssh_cidr: str, tags: Mapping[str, str]) -> str:
        with self._state("ensure_security_group") as state:
            group = state["groups"].setdefault(name, {"id": f"sg-sim{len(state['groups']):013x}"})
            group["rules"] = [["tcp", 22, ssh_cidr], ["-1", None, group["id"]]]
            return str(group["id"])

    def security_group_rules(self, name: str) -> list[list[Any]]:
        with self._state("security_group_rules") as state:
            return list(state["groups"].get(name, {}).get("rules", []))

    def launch(self, request: LaunchRequest) -> list[InstanceInfo]:
        now = self.clock()
        errors = self.script.capacity_errors if request.lifecycle == "spot" else self.script.on_demand_errors
        code = errors.get(request.zone) or errors.get("*")
        if code:
            with self._lock:
                self.calls.append("launch")
            raise CapacityError(code, f"simulated: no {request.lifecycle} capacity for {request.instance_type} in {request.zone}")
        with self._state("launch") as state:
            new = []
            for _ in range(request.count):
                ordinal = state["next"]
                state["next"] += 1
                instance_id = f"i-{(self.script.seed * 7919 + ordinal + 1) % 16**17:017x}"
                after = self.script.interruptions.get(ordinal, self.script.interrupt_after_s)
                state["instances"][instance_id] = {
                    "type": request.instance_type, "zone": request.zone, "lifecycle": request.lifecycle,
                    "launched": now, "tags": dict(request.tags), "ip": f"203.0.113.{ordinal % 254 + 1}",
                    "terminate_at": None, "user_data": user_data(request.tags),
                    "interrupt_at": now + after if after is not None and request.lifecycle == "spot" else None,
                }
                new.append(instance_id)
            return [self._info(i, state["instances"][i], now) for i in new]

    def _info(self, instance_id: str, rec: Mapping[str, Any], now: float) -> InstanceInfo:
        ends = [(t, r) for t, r in ((rec["interrupt_at"], SPOT_REASON), (rec["terminate_at"], USER_REASON),
                                    (rec.get("self_stop_at"), SELF_STOP_CODE))
                if t is not None and now >= t]
        ip = None
        if ends:
            when, reason = min(ends)
            state = "shutting-down" if now < when + self.script.shutdown_delay_s else "terminated"
        elif now < rec["launched"] + self.script.launch_delay_s:
            state, reason = "pending", None
        else:
            state, reason, ip = "running", None, rec["ip"]
        return InstanceInfo(instance_id, rec["type"], rec["zone"], state, rec["lifecycle"], rec["launched"],
                            ip, reason, dict(rec["tags"]))

    def _reported(self, rec: dict[str, Any], now: float) -> None:
        """Count a report of a running spot instance; past interrupt_after_polls, reclaim it now."""
        limit = self.script.interrupt_after_polls
        if limit is None or rec["lifecycle"] != "spot" or self._info("", rec, now).state != "running":
            return
        rec["polls"] = rec.get("polls", 0) + 1
        if rec["polls"] > limit:
            rec["interrupt_at"] = now

    def describe(self, ids: Sequence[str]) -> list[InstanceInfo]:
        now = self.clock()
        with self._state("describe") as state:
            for i in ids:
                if i in state["instances"]:
                    self._reported(state["instances"][i], now)
            return [self._info(i, state["instances"][i], now) for i in ids if i in state["instances"]]

    def terminate(self, ids: Sequence[str]) -> None:
        now = self.clock()
        with self._state("terminate") as state:
            for i in ids:
                rec = state["instances"].get(i)
                if rec is not None and rec["terminate_at"] is None:
                    rec["terminate_at"] = now

    # the watchdog ------------------------------------------------------------------
    def _watch_all(self, state: dict[str, Any]) -> None:
        if self.script.watchdog:
            now = self.clock()
            for rec in state["instances"].values():
                self._watchdog(rec, now)

    def _watchdog(self, rec: dict[str, Any], now: float) -> None:
        """Run the instance's watchdog up to `now` with its tags as they are (tags changed at
        `wd_from` count from there): at the first check that finds a limit passed, it shuts down."""
        if rec.get("self_stop_at") is not None or MARKER not in rec.get("user_data", ""):
            return
        boot = rec["launched"] + self.script.launch_delay_s
        tags = rec["tags"]

        def number(tag: str) -> float | None:
            try:
                return float(int(float(tags[tag])))
            except (KeyError, ValueError):
                return None

        limits = [(number(TAG_BUDGET), "budget"), (number(TAG_LEASE), "lease"), (number(TAG_MAX), "max_hours")]
        idle = number(TAG_IDLE)
        if idle:
            limits.append((max(boot, rec.get("busy_at") or boot) + idle, "idle"))
        times = [t for t, _ in limits if t is not None]
        if not times:
            return
        step = self.script.watchdog_interval_s
        due = max(min(times), boot, rec.get("wd_from") or boot)
        check = boot + math.ceil(round((due - boot) / step, 9)) * step
        ended = [t for t in (rec["interrupt_at"], rec["terminate_at"]) if t is not None]
        if check > now or (ended and min(ended) <= check):
            return
        reason = next(r for t, r in limits if t is not None and t <= check)
        rec["self_stop_at"], rec["self_stop_reason"] = check, reason

    def set_tags(self, ids: Sequence[str], tags: Mapping[str, str]) -> None:
        """Create or overwrite tags (the lease renewal); the watchdog sees them from now on."""
        now = self.clock()
        with self._state("set_tags") as state:
            for i in ids:
                rec = state["instances"].get(i)
                if rec is not None:
                    rec["tags"].update(tags)
                    rec["wd_from"] = now

    def mark_busy(self, ids: Sequence[str]) -> None:
        """A gputui run is going on these instances now: their idle time starts again."""
        now = self.clock()
        with self._state("mark_busy") as state:
            for i in ids:
                if i in state["instances"]:
                    state["instances"][i]["busy_at"] = now

    def self_stops(self) -> dict[str, tuple[float, str]]:
        """{instance id: (when its watchdog shut it down, why)}, for tests and measurements."""
        with self._state("self_stops") as state:
            return {i: (rec["self_stop_at"], rec["self_stop_reason"]) for i, rec in state["instances"].items()
                    if rec.get("self_stop_at") is not None}

    def user_data(self, instance_id: str) -> str | None:
        with self._state("user_data") as state:
            rec = state["instances"].get(instance_id)
            return None if rec is None else str(rec.get("user_data", ""))

    def console_output(self, instance_id: str) -> str:
        """What the instance's console shows: cloud-init's host-key block once it runs, and the
        watchdog's reason once it has stopped the instance."""
        now = self.clock()
        with self._state("console_output") as state:
            rec = state["instances"].get(instance_id)
            if rec is not None and rec.get("self_stop_at") is not None:
                at = int(rec["self_stop_at"])
                return (f"[   1.0] booting {instance_id}\n"
                        f"gputui-watchdog: stopping: {rec['self_stop_reason']} (simulated, now {at})\n")
            if rec is None or self._info(instance_id, rec, now).state != "running":
                return ""
        keys = "".join(f"{key} root@sim\n" for key in self.script.host_keys)
        return (f"[   1.0] cloud-init: booting {instance_id}\n-----BEGIN SSH HOST KEY KEYS-----\n{keys}"
                "-----END SSH HOST KEY KEYS-----\n") if keys else f"[   1.0] booting {instance_id}\n"

    def console_host_keys(self, instance_id: str) -> list[str]:
        return parse_console_host_keys(self.console_output(instance_id))

    def list_tagged(self, tags: Mapping[str, str]) -> list[InstanceInfo]:
        now = self.clock()
        with self._state("list_tagged") as state:
            found = [(i, rec) for i, rec in state["instances"].items() if all(rec["tags"].get(k) == v for k, v in tags.items())]
            for _i, rec in found:
                self._reported(rec, now)
            return [self._info(i, rec, now) for i, rec in found]
