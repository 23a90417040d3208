"""A run streaming events into the dashboard: the worker folds the events of one read of the
run's events file together and posts one TrainingUpdate for them (not one per event: each
message wakes the app's event loop), with the events log's lines kept, in order. No Textual
app is started: the worker's own code runs on a stand-in that collects what it posts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from textual.message import Message

from gputui.runs import store as runs
from gputui.runs.follow import Follower
from gputui.model.events import make
from gputui.ui.messages import TrainingLine, TrainingUpdate
from gputui.ui.training_actions import TrainingActions, post_events


def start() -> dict[str, Any]:
    return make("start", run_id="r-burst", run_dir="/nonexistent/r-burst", model="seed", device="cpu",
                strategy="single", world_size=1, epochs=10, batch_size=64, steps_per_epoch=100, total_steps=1000,
                train_samples=6400, test_samples=1000, num_classes=10, params=3285, seed=0, resumed_from_step=None)


def burst(n: int, steps_per_epoch: int = 100) -> list[dict[str, Any]]:
    """The start event, then `n` step/epoch events (an epoch event ends every `steps_per_epoch` steps)."""
    out = [start()]
    for step in range(1, n + 1):
        loss = 0.1 + math.exp(-step / 300)
        if step % steps_per_epoch == 0:
            out.append(make("epoch", epoch=step // steps_per_epoch, step=step, elapsed_s=step * 0.001,
                            train_loss=loss, test_loss=loss, test_acc=90.0, eval_s=0.01))
        else:
            out.append(make("step", epoch=step // steps_per_epoch + 1, step=step, elapsed_s=step * 0.001, loss=loss,
                            samples_per_s=64_000.0, lr=1e-3))
    return out


class Worker:
    """What TrainingActions' follow worker needs of the app: its generation, run_facts and post_message."""

    generation = 1
    run_facts = None
    _watched = TrainingActions._watched

    def __init__(self) -> None:
        self.posted: list[Message] = []

    def post_message(self, message: Message) -> bool:
        self.posted.append(message)
        return True


def test_a_burst_of_1000_events_in_one_read_posts_one_update_and_every_log_line(tmp_path: Path) -> None:
    path = tmp_path / runs.EVENTS
    path.write_bytes(b"")
    follower = Follower(path, alive=lambda: False)  # the run has ended: the follower reads to the end and stops
    events = burst(1000)
    path.write_text("".join(runs.encode(e) + "\n" for e in events), encoding="utf-8")  # one read holds them all

    worker = Worker()
    TrainingActions._follow(worker, follower, 1)  # type: ignore[arg-type]  # the worker thread's body, run here

    updates = [m for m in worker.posted if isinstance(m, TrainingUpdate)]
    lines = [m.text for m in worker.posted if isinstance(m, TrainingLine)]
    assert 1 <= len(updates) <= 3, f"{len(updates)} TrainingUpdate messages for one read of 1,001 events"
    final = updates[-1].state
    assert final.step == 1000 and final.run_id == "r-burst"
    assert final.loss_points and final.loss_points[-1][0] == 999  # the curves hold the last step event
    # the log: the start, then the 10 epochs in order (under the cap, so all of them)
    assert lines[0].startswith("run r-burst started")
    assert [line.split(":")[0] for line in lines[1:]] == [f"epoch {k}" for k in range(1, 11)]
    assert worker.run_facts is not None  # the alerts' facts were folded on the way


def test_more_log_lines_in_one_batch_than_the_cap_end_with_how_many_more() -> None:
    from gputui.ui.training_actions import LINES_PER_BATCH

    events = burst(100 * (LINES_PER_BATCH + 5), steps_per_epoch=100)  # the start + cap + 5 epoch lines
    posted: list[Message] = []
    state = post_events([events], posted.append, 1)
    lines = [m.text for m in posted if isinstance(m, TrainingLine)]
    assert sum(isinstance(m, TrainingUpdate) for m in posted) == 1
    assert state.step == 100 * (LINES_PER_BATCH + 5)
    assert len(lines) == LINES_PER_BATCH
    assert lines[0].startswith("run r-burst started") and lines[1].startswith("epoch 1:")
    assert lines[-1] == f"… {LINES_PER_BATCH + 5 + 1 - (LINES_PER_BATCH - 1)} more events"


def test_events_posted_one_by_one_still_post_one_update_each() -> None:
    events = burst(5)
    posted: list[Message] = []
    post_events(events, posted.append, 1)
    assert [m.state.step for m in posted if isinstance(m, TrainingUpdate)] == [0, 1, 2, 3, 4, 5]
