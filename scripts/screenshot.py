"""Regenerate assets/dashboard.svg: the `gputui --demo` dashboard at 120x40.

    python scripts/screenshot.py [--out assets/dashboard.svg] [--seconds 40]

Runs the real demo (simulated hosts, GPUs and cloud; real training on this CPU) in a
headless Textual session with its own GPUTUI_HOME, presses t and u twice, waits until
the run has evaluated and the slaves run, saves the screen, then quits terminating them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


async def shoot(out: Path, seconds: float) -> None:
    from gputui.dashboard.setup import Backend, DashboardOptions, resolve_profile
    from gputui.ui.app import create_app

    app = create_app(Backend(DashboardOptions(profile=resolve_profile(None), demo=True)))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(1.0)
        await pilot.press("t", "u")
        await pilot.pause(2.0)
        await pilot.press("u")
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and len(app.training.acc_points) < 3:
            await pilot.pause(0.5)
        await pilot.pause(1.5)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(app.export_screenshot(title="gputui --demo"), encoding="utf-8")
        # q asks about the run started here (s: stop it, with a checkpoint), then about the
        # slaves (t: terminate them): nothing is left running.
        await pilot.press("q", "s")
        await pilot.pause(0.5)
        await pilot.press("t")
        deadline = time.monotonic() + 120
        while app.is_running:
            if time.monotonic() > deadline:
                raise SystemExit("screenshot: the demo did not quit within 120 s of q, s, t")
            await pilot.pause(0.2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "assets" / "dashboard.svg")
    parser.add_argument("--seconds", type=float, default=60.0, help="longest wait for the run's evaluations")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        os.environ["GPUTUI_HOME"] = home
        asyncio.run(shoot(args.out, args.seconds))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
