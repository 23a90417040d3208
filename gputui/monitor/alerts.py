"""Alerts: the `[alerts]` profile table, the engine that turns telemetry rounds into alerts,
and their delivery to a command and a webhook.

```toml
[alerts]
gpu_temperature_c = 85      # a GPU at or above 85 C
gpu_memory_pct = 95         # a GPU's memory 95% used or more
throttled_s = 60            # a busy GPU held back (power cap, thermal, ...) for 60 s
gpu_idle_s = 120            # a GPU idle for 120 s while a gputui run has a process on it
unreachable_s = 60          # a host not answering for 60 s
stalled_s = 300             # the watched run (--run) without a step event for 300 s
nan_loss = true             # the watched run's loss became NaN or infinite
budget_pct = 90             # the [cloud] cluster's spend at 90% of budget_usd
repeat_s = 900              # say it again every 15 min while it lasts (default: never)
command = "notify-send gputui"          # run with the alert's JSON on stdin
webhook = "https://hooks.example/T0/B0" # POST the alert's JSON
```

A key that is absent turns that alert off. Each alert fires once when its condition has
held for its time, once more when it clears, and, with `repeat_s`, again at that interval
while it lasts: never on every poll. Temperature and memory clear 2 degrees / 2 points below
their threshold, so a reading hovering at the line does not flap.
"""

from __future__ import annotations

import json
import math
import os
import queue
import re
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Sequence

from gputui.model import units
from gputui.cloud.redact import scrub_url, url_host
from gputui.config.alerts import ALERTS_SECTION, AlertSettings  # noqa: F401 - re-exported: declared there
from gputui.model.telemetry import HostSnapshot, throttle_text
from gputui.model.text import clean
from gputui.model.paths import user_umask

CLEAR_MARGIN = 2.0  # degrees C / percentage points below the threshold before a reading clears
# A process that is a gputui training run (the trainer, its DDP workers, a cluster's torchrun).
RUN_COMMAND = re.compile(r"gputui(?:\.__main__|/__main__\.py)?\s+run\b|gputui\.train\b")


def alert_settings(profile: Any) -> AlertSettings | None:
    """The profile's `[alerts]` table, or None without one."""
    table = getattr(profile, "tables", {}).get("alerts")
    return None if table is None else AlertSettings.from_table(table)


@dataclass(frozen=True)
class RunFacts:
    """What the alerts and the exporter know of the watched training run."""

    run_id: str | None = None
    active: bool = False  # started and not yet done, interrupted or failed
    started: float | None = None  # Unix time of its start event
    last_step: float | None = None  # Unix time of its last step event
    step: int | None = None
    loss: float | None = None  # the last finite loss
    test_acc: float | None = None
    samples_per_s: float | None = None
    non_finite: str | None = None  # why the loss is not a number, once it was seen
    # A program run's metrics (gputui run -- PROGRAM): each name's latest value, first seen first
    # (names are data from the events file: the exporter escapes them).
    metrics: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class CloudFacts:
    """The `[cloud]` cluster's money: what the alerts and the exporter show."""

    cluster: str
    budget_usd: float
    spent_usd: float
    committed_usd: float
    usd_per_hour: float

    @property
    def fraction(self) -> float:
        return (self.spent_usd + self.committed_usd) / self.budget_usd if self.budget_usd > 0 else math.inf


@dataclass(frozen=True)
class Alert:
    """One alert: a condition that started (firing), lasts (repeat) or ended (cleared)."""

    rule: str
    state: str  # firing, repeat, cleared
    message: str
    time: float
    since: float  # when the condition started
    host: str | None = None
    gpu: int | None = None
    run_id: str | None = None
    value: float | str | None = None
    threshold: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rule": self.rule, "state": self.state, "message": self.message, "time": round(self.time, 3),
                "since": round(self.since, 3), "host": self.host, "gpu": self.gpu, "run_id": self.run_id,
                "value": self.value, "threshold": self.threshold}


@dataclass(frozen=True)
class _Check:
    """One condition as seen this round: its key, whether it holds (None: cannot tell)."""

    rule: str
    key: tuple[Any, ...]
    holds: bool | None
    hold_s: float
    what: str  # "rig1 GPU 0 temperature" - the subject of the message
    value: float | str | None
    threshold: float | None
    detail: str  # how it is now: "91 C >= 85 C"
    host: str | None = None
    gpu: int | None = None
    run_id: str | None = None


@dataclass
class _State:
    since: float
    fired: bool = False
    last_sent: float = 0.0
    check: _Check | None = None


class AlertEngine:
    """Turns rounds into alerts: fire once, clear once, repeat at `repeat_s`."""

    def __init__(self, settings: AlertSettings) -> None:
        self.settings = settings
        self._states: dict[tuple[Any, ...], _State] = {}

    @property
    def active(self) -> list[_Check]:
        """The conditions firing now (for the exporter)."""
        return [s.check for s in self._states.values() if s.fired and s.check is not None]

    def evaluate(self, hosts: Sequence[HostSnapshot], now: float, run: RunFacts | None = None,
                 cloud: CloudFacts | None = None) -> list[Alert]:
        """The alerts this round raises (most rounds: none)."""
        checks = list(self._checks(hosts, now, run, cloud))
        answered = {h.name for h in hosts if h.state.worked}
        out: list[Alert] = []
        seen: set[tuple[Any, ...]] = set()
        for check in checks:
            seen.add(check.key)
            state = self._states.get(check.key)
            if check.holds is None:
                continue  # no reading this round: neither start nor end it
            if check.holds:
                if state is None:
                    state = self._states[check.key] = _State(since=now)
                state.check = check
                if not state.fired and now - state.since >= check.hold_s:
                    state.fired, state.last_sent = True, now
                    out.append(self._alert(check, "firing", now, state.since))
                elif state.fired and self.settings.repeat_s and now - state.last_sent >= self.settings.repeat_s:
                    state.last_sent = now
                    out.append(self._alert(check, "repeat", now, state.since))
            elif state is not None:
                del self._states[check.key]
                if state.fired:
                    out.append(self._alert(check, "cleared", now, state.since))
        for key in [k for k in self._states if k not in seen]:
            state = self._states[key]
            host = key[1] if len(key) > 1 else None
            gone = key[0] in ("gpu_temperature", "gpu_memory", "throttled", "gpu_idle") and host in answered
            if gone or key[0] in ("stalled", "nan_loss", "budget"):  # the GPU, run or cloud table is gone
                del self._states[key]
                if state.fired and state.check is not None:
                    out.append(self._alert(replace(state.check, detail="no longer seen"), "cleared", now, state.since))
        return out

    def _alert(self, check: _Check, state: str, now: float, since: float) -> Alert:
        if state == "cleared":
            message = f"{check.what}: cleared after {units.duration(now - since, 'words')} ({check.detail})"
        elif state == "repeat":
            message = f"{check.what}: still {check.detail}, for {units.duration(now - since, 'words')}"
        else:
            message = f"{check.what}: {check.detail}"
        return Alert(check.rule, state, clean(message, 400), now, since, check.host, check.gpu, check.run_id,
                     check.value, check.threshold)

    def _firing(self, key: tuple[Any, ...]) -> bool:
        state = self._states.get(key)
        return state is not None and state.fired

    def _checks(self, hosts: Sequence[HostSnapshot], now: float, run: RunFacts | None,
                cloud: CloudFacts | None) -> Iterable[_Check]:
        s = self.settings
        for host in hosts:
            if s.unreachable_s is not None:
                yield _Check("unreachable", ("unreachable", host.name), not host.state.worked, s.unreachable_s,
                             f"host {host.name}", host.state.value, s.unreachable_s,
                             f"not answering ({host.state.value}: {clean(host.message or '', 160)})" if not host.state.worked
                             else "answering again", host=host.name)
            if not host.state.worked:
                continue
            for gpu in host.gpus:
                where = f"{host.name} GPU {gpu.index}"
                if s.gpu_temperature_c is not None:
                    key = ("gpu_temperature", host.name, gpu.index)
                    t, limit = gpu.temperature_c, s.gpu_temperature_c
                    line = limit - CLEAR_MARGIN if self._firing(key) else limit
                    yield _Check("gpu_temperature", key, None if t is None else t >= line, 0.0, f"{where} temperature",
                                 t, limit, f"{units.temp(t)} (alert at {units.temp(limit)})", host.name, gpu.index)
                if s.gpu_memory_pct is not None:
                    key = ("gpu_memory", host.name, gpu.index)
                    pct, limit = gpu.mem_pct, s.gpu_memory_pct
                    line = limit - CLEAR_MARGIN if self._firing(key) else limit
                    yield _Check("gpu_memory", key, None if pct is None else pct >= line, 0.0, f"{where} memory",
                                 None if pct is None else round(pct, 1), limit,
                                 f"{units.pct(pct)} used (alert at {units.pct(limit)})",
                                 host.name, gpu.index)
                busy = gpu.util_pct is not None and gpu.util_pct >= s.gpu_idle_pct
                if s.throttled_s is not None:
                    holds = None if gpu.throttle is None else (gpu.throttled and busy)
                    yield _Check("throttled", ("throttled", host.name, gpu.index), holds, s.throttled_s,
                                 f"{where} throttled", throttle_text(gpu.throttle), s.throttled_s,
                                 f"clocks held back by {throttle_text(gpu.throttle)}" if holds
                                 else f"clocks free ({throttle_text(gpu.throttle)})", host.name, gpu.index)
                if s.gpu_idle_s is not None:
                    runs = [p for p in gpu.processes if p.name and RUN_COMMAND.search(p.name)]
                    holds = None if gpu.util_pct is None else bool(runs) and not busy
                    pids = ",".join(str(p.pid) for p in runs) or "-"
                    yield _Check("gpu_idle", ("gpu_idle", host.name, gpu.index), holds, s.gpu_idle_s, f"{where} idle",
                                 gpu.util_pct, s.gpu_idle_pct,
                                 f"{units.pct(gpu.util_pct)} busy while gputui run pid {pids} holds it" if holds
                                 else f"{units.pct(gpu.util_pct)} busy", host.name, gpu.index)
        if run is not None and run.run_id is not None:
            name = f"run {run.run_id}"
            if s.stalled_s is not None:
                last = run.last_step if run.last_step is not None else run.started
                quiet = None if last is None else now - last
                holds = run.active and quiet is not None and quiet >= s.stalled_s
                yield _Check("stalled", ("stalled", run.run_id), holds, 0.0, name, None if quiet is None else round(quiet, 1),
                             s.stalled_s,
                             f"no step event for {units.duration(quiet or 0.0, 'words')}" if holds else "stepping again",
                             run_id=run.run_id)
            if s.nan_loss:
                yield _Check("nan_loss", ("nan_loss", run.run_id), run.non_finite is not None, 0.0, name,
                             run.non_finite, None, f"loss is not finite: {run.non_finite}" if run.non_finite else "loss finite",
                             run_id=run.run_id)
        if cloud is not None and s.budget_pct is not None:
            pct = 100.0 * cloud.fraction
            yield _Check("budget", ("budget", cloud.cluster), pct >= s.budget_pct, 0.0, f"cluster {cloud.cluster} budget",
                         round(pct, 1), s.budget_pct,
                         f"{pct:.0f}% of {units.money(cloud.budget_usd, fixed=True)} spent or committed (alert at {s.budget_pct:g}%)")


# -- delivery ----------------------------------------------------------------------------

def alert_document(alert: Alert) -> dict[str, Any]:
    """What every channel gets: the line `gputui monitor --json` prints."""
    return {"alert": alert.to_dict()}


class Notifier:
    """Delivers alerts to the `command` and the `webhook` in a background thread, in order,
    each bounded by `timeout_s`, so a slow receiver never delays a poll. A failure is one
    line given to `report`."""

    def __init__(self, settings: AlertSettings, report: Callable[[str], None] = lambda line: None) -> None:
        self.settings = settings
        self.report = report
        self._queue: "queue.Queue[Alert | None]" = queue.Queue()
        self._thread: threading.Thread | None = None
        self.delivered = 0  # alerts handed to every channel (successfully or not)
        self._done = threading.Condition()

    @property
    def wanted(self) -> bool:
        return bool(self.settings.command or self.settings.webhook)

    def send(self, alerts: Sequence[Alert]) -> None:
        if not self.wanted:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="gputui-alerts", daemon=True)
            self._thread.start()
        for alert in alerts:
            self._queue.put(alert)

    def wait(self, count: int, timeout: float) -> bool:
        """Until `count` alerts have been delivered (True), or `timeout` seconds (False)."""
        deadline = time.monotonic() + timeout
        with self._done:
            while self.delivered < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._done.wait(left)
        return True

    def close(self, timeout: float = 5.0) -> None:
        """Deliver what is queued (at most `timeout` more seconds), then stop."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        while True:
            alert = self._queue.get()
            if alert is None:
                return
            body = json.dumps(alert_document(alert), allow_nan=False, default=str)
            if self.settings.command:
                self._run_command(alert, body)
            if self.settings.webhook:
                self._post(body)
            with self._done:
                self.delivered += 1
                self._done.notify_all()

    def _run_command(self, alert: Alert, body: str) -> None:
        argv = shlex.split(self.settings.command or "")
        env = dict(os.environ, GPUTUI_ALERT_RULE=alert.rule, GPUTUI_ALERT_STATE=alert.state,
                   GPUTUI_ALERT_MESSAGE=alert.message, GPUTUI_ALERT_HOST=alert.host or "")
        try:
            done = subprocess.run(argv, input=body, text=True, capture_output=True, timeout=self.settings.timeout_s,
                                  env=env, check=False, umask=user_umask())  # the user's program: the user's umask
        except subprocess.TimeoutExpired:
            self.report(f"alert command {argv[0]} took longer than {self.settings.timeout_s:g} s: stopped")
            return
        except OSError as exc:
            self.report(f"alert command {argv[0]} cannot run: {exc.strerror or exc}")
            return
        if done.returncode != 0:
            said = clean((done.stderr or done.stdout or "").strip().splitlines()[-1] if (done.stderr or done.stdout).strip() else "", 160)
            self.report(f"alert command {argv[0]} failed (exit {done.returncode}){': ' + said if said else ''}")

    def _post(self, body: str) -> None:
        import http.client
        import urllib.error
        import urllib.request

        url = self.settings.webhook or ""
        request = urllib.request.Request(url, data=body.encode(), method="POST",
                                         headers={"Content-Type": "application/json", "User-Agent": "gputui-alerts"})
        shown = url_host(url)  # host:port: the URL's user:password and path token are secrets
        try:
            with urllib.request.urlopen(request, timeout=self.settings.timeout_s) as answer:
                answer.read(65536)
        except urllib.error.HTTPError as exc:
            self.report(f"alert webhook {shown}: HTTP {exc.code} {clean(scrub_url(str(exc.reason), url), 80)}")
        except (urllib.error.URLError, OSError, ValueError, http.client.HTTPException) as exc:  # InvalidURL too
            reason = getattr(exc, "reason", None) or exc
            self.report(f"alert webhook {shown}: {clean(scrub_url(str(reason), url), 120)}")
