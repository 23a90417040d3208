"""Helpers for the dashboard tests: an app on simulated sources, waiting, the screen as text."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

import pytest
from rich.console import Console

from gputui.cloud.sim import SimProvider, SimScript
from gputui.dashboard.setup import Backend, DashboardOptions, resolve_profile
from gputui.model.telemetry import HostSnapshot, round_from_dict
from gputui.sources.sim import SimSource


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch, gputui_home: Any) -> Any:
    """The screen's clock in UTC (an autouse fixture of the modules that import it)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.delenv("TZ")
    time.tzset()


class Clock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1_767_225_600.0) -> None:  # 2026-01-01 00:00 UTC
        self.now = now

    def __call__(self) -> float:
        return self.now


def sim_provider(clock: Callable[[], float] = time.time, **script: Any) -> SimProvider:
    script.setdefault("launch_delay_s", 0.0)
    script.setdefault("shutdown_delay_s", 0.0)
    return SimProvider(script=SimScript(**script), clock=clock)


def make_backend(profile: Path | None = None, *, demo: bool = True, source: Any = None, provider: Any = None,
                 clock: Callable[[], float] = time.time, train_args: Sequence[str] = (), interval: float = 0.2,
                 sim_hosts: int = 2, sim_gpus: int = 2) -> Backend:
    options = DashboardOptions(profile=resolve_profile(profile), demo=demo, sim_hosts=sim_hosts, sim_gpus=sim_gpus,
                               host_interval_s=interval, cloud_interval_s=interval, train_args=tuple(train_args))
    return Backend(options, clock=clock, host_source=source, provider=provider)


async def wait_for(pilot: Any, predicate: Callable[[], Any], timeout: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what or predicate}")
        await pilot.pause(0.05)


def screen_text(app: Any) -> str:
    """What the terminal shows now, as plain text."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, color_system=None,
                      record=True, legacy_windows=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text(styles=False)


def drive(app: Any, scenario: Callable[[Any], Any], size: tuple[int, int] = (120, 40), **run_test: Any) -> Any:
    """Run `app` headless at `size` and `await scenario(pilot)`; return what it returns."""

    async def main() -> Any:
        async with app.run_test(size=size, **run_test) as pilot:
            return await scenario(pilot)

    return asyncio.run(main())


class HangingSource:
    """A telemetry source whose polls hang until released (a dead host behind a slow API)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.sim = SimSource(1, 1, clock=clock)
        self.release = threading.Event()
        self.started = threading.Event()

    def poll(self) -> list[HostSnapshot]:
        self.started.set()
        self.release.wait(60)
        return self.sim.poll()

    def close(self) -> None:
        self.release.set()


class HangingProvider(SimProvider):
    """The simulated cloud whose launches hang until released."""

    def __init__(self) -> None:
        super().__init__(script=SimScript(launch_delay_s=0.0, shutdown_delay_s=0.0))
        self.release = threading.Event()
        self.launching = threading.Event()

    def launch(self, request: Any) -> Any:
        self.launching.set()
        self.release.wait(60)
        return super().launch(request)


# The H100 fixtures (tests/fixtures/h100, copies of what a real H100 printed): a `gputui monitor
# --once --json` round taken while training, and the JSON events of a 40-epoch run on it.
H100 = Path(__file__).resolve().parent / "fixtures" / "h100"


def h100_events() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (H100 / "run-seed-40-epochs.jsonl").read_text().splitlines() if line.strip()]


class RecordedSource:
    """A telemetry source that answers every poll with the H100's recorded round (hosts named in
    `names`: one copy of the recorded host each), stamped with the test's clock."""

    def __init__(self, clock: Callable[[], float] = time.time, names: Sequence[str] = ("vm",)) -> None:
        doc = json.loads((H100 / "monitor-once-training.json").read_text())
        self.host = round_from_dict(doc)[0]
        self.names = tuple(names)
        self.clock = clock

    def poll(self) -> list[HostSnapshot]:
        return [replace(self.host, name=name, time=self.clock()) for name in self.names]

    def close(self) -> None:
        pass


def svg_text(svg: str) -> str:
    """A snapshot SVG's screen as text, each run of text placed at its column (what a reader
    of the SVG sees, with the spaces between differently styled runs kept)."""
    import html
    import re

    rows: dict[float, list[tuple[float, str]]] = {}
    for match in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)" textLength="[\d.]+"[^>]*>([^<]*)</text>', svg):
        rows.setdefault(float(match.group(2)), []).append((float(match.group(1)), html.unescape(match.group(3))))
    lines = []
    for y in sorted(rows):
        line = ""
        for x, text in sorted(rows[y]):
            line = line.ljust(round(x / 12.2)) + text.replace("\xa0", " ")
        lines.append(line.rstrip())
    return "\n".join(lines)


def screen_diff(expected_svg: str, actual_svg: str, name: str = "snapshot") -> str:
    """What differs between two snapshot SVGs, as a unified diff of their screens' text (the
    snapshot comparison only says that something did)."""
    import difflib

    diff = difflib.unified_diff(svg_text(expected_svg).splitlines(), svg_text(actual_svg).splitlines(),
                                f"{name} (expected)", f"{name} (now)", lineterm="")
    return "\n".join(diff) or "(the screens' text is the same: colours or styles differ)"


async def settled(pilot: Any, ready: Callable[[], Any] = lambda: True, what: str = "the screen to settle",
                  timeout: float = 30.0) -> str:
    """Wait until `ready()` holds and the screen's text is the same over two more frames; the
    text. (Instead of a fixed pause: the frame a snapshot takes is the one the app settled on.)"""
    app = pilot.app
    deadline = time.monotonic() + timeout
    before: str | None = None
    while True:
        await pilot.pause()
        await app.animator.wait_until_complete()  # nothing moving
        now = screen_text(app) if ready() else None
        if now is not None and now == before:
            return now
        before = now
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")


def svg_picture(svg: str) -> tuple[dict[tuple[str, int], str], dict[tuple[str, int], tuple[str, str]]]:
    """What a snapshot SVG shows, cell by cell: each cell's background and each character with
    its style (the CSS of its class, not the class's generated name). Two SVGs of the same screen
    can split a row's runs differently (two blank cells as one rect or two); their pictures match."""
    import html
    import re

    cell = 12.2  # the width of one terminal cell in textual's SVGs
    styles = dict(re.findall(r"\.([\w-]+-r\d+) \{ ([^}]*) \}", svg))
    backgrounds: dict[tuple[str, int], str] = {}
    for fill, x, y, width in re.findall(r'<rect fill="([^"]*)" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"', svg):
        start = round(float(x) / cell)
        for i in range(round(float(width) / cell)):
            backgrounds[(y, start + i)] = fill
    chars: dict[tuple[str, int], tuple[str, str]] = {}
    for cls, x, y, text in re.findall(r'<text class="([^"]*)" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        start = round(float(x) / cell)
        for i, ch in enumerate(html.unescape(text)):
            chars[(y, start + i)] = (ch, styles.get(cls, cls))
    return backgrounds, chars
