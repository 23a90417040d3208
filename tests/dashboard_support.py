"""Helpers for the dashboard tests: an app on simulated sources, waiting, the screen as text."""

from __future__ import annotations

import asyncio
import io
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from rich.console import Console

from gputui.cloud.sim import SimProvider, SimScript
from gputui.dashboard.setup import Backend, DashboardOptions, resolve_profile
from gputui.model.telemetry import HostSnapshot
from gputui.sources.sim import SimSource


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
