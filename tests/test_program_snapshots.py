"""A snapshot of the dashboard following a run of the user's own program (issue 31) at 120x40:
the training panel's metrics line, the loss-like metric's curve, the GPU the run holds marked
on the recorded local host. Fed from a synthetic run (tests/test_dashboard_program.py's
events), with a frozen clock and polls only when the test asks, so each frame is the same.

Update after a deliberate change of the look:
`python -m pytest tests/test_program_snapshots.py --snapshot-update`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.dashboard_support import screen_diff, screen_text, svg_picture
from tests.dashboard_support import utc  # noqa: F401 - an autouse fixture: the screen's clock in UTC
from tests.test_dashboard_program import program_app, program_events, replay

SNAPSHOTS = Path(__file__).parent / "__snapshots__" / "test_program_snapshots"


@pytest.fixture
def snap_compare(snap_compare: Any, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    """pytest-textual-snapshot's comparison; a failure prints a text diff of the screen, and two
    SVGs of the same picture (runs split otherwise) match (as in test_dashboard_snapshots)."""
    import textual._doc as doc

    taken: list[str] = []
    take = doc.take_svg_screenshot

    def taking(*args: Any, **kwargs: Any) -> str:
        taken.append(take(*args, **kwargs))
        return taken[-1]

    monkeypatch.setattr(doc, "take_svg_screenshot", taking)

    def compare(app: Any, **kwargs: Any) -> bool:
        if snap_compare(app, **kwargs) or request.config.getoption("--snapshot-update", False):
            return True
        stored = SNAPSHOTS / f"{request.node.name}.svg"
        if not stored.is_file():
            raise AssertionError(f"no stored snapshot {stored} (make it with --snapshot-update)")
        if svg_picture(stored.read_text(encoding="utf-8")) == svg_picture(taken[-1]):
            return True
        raise AssertionError(f"the screen differs from {stored.name}:\n"
                             + screen_diff(stored.read_text(encoding="utf-8"), taken[-1], request.node.name))

    return compare


async def settle_program(pilot: Any) -> None:
    await replay(pilot, program_events(60))


def test_a_program_run(snap_compare: Any) -> None:
    assert snap_compare(program_app(), terminal_size=(120, 40), run_before=settle_program)


def test_a_program_runs_screen_says_its_metrics_curve_and_gpu() -> None:
    """Beside the snapshot, what it must show, in words (a failure names what is missing)."""
    from tests.dashboard_support import drive

    app = program_app()

    async def scenario(pilot: Any) -> str:
        await settle_program(pilot)
        return screen_text(app)

    text = drive(app, scenario, size=(120, 40))
    wanted = {"the head": "● running  GPU 0 · python train.py --lr 0.01", "the position": "step 600  epoch 4  30s",
              "the metrics": "train_loss = 0.0921  val_acc = 0.8824  lr = 0.01",
              "the legend": "━ train_loss  metric 1/3 (m: next)", "the y axis": "train_loss (log)",
              "the held GPU": "│ ▸0 ", "the keys": "m Metric  o Output"}
    missing = {what: value for what, value in wanted.items() if value not in text}
    assert not missing, f"the screen lacks {missing}:\n{text}"
