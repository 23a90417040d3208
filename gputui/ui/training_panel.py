"""Training: the run's state in three lines and a live chart of loss and test accuracy."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget

from gputui.dashboard.training import TrainingState
from gputui.model.telemetry import fmt
from gputui.model.text import clean
from gputui.ui.chart import training_chart
from gputui.ui.draw import bar, duration

STATUS_CLASS = {"running": "ok", "starting": "ok", "stopping": "warn", "done": "ok", "interrupted": "warn",
                "failed": "bad", "stopped": "warn", "idle": "dim"}


class TrainingSummary(Widget):
    COMPONENT_CLASSES = {"training--ok", "training--warn", "training--bad", "training--dim", "training--bar"}
    state: reactive[TrainingState] = reactive(TrainingState)
    profile: reactive[str] = reactive("")

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    def render(self) -> Text:
        s = self.state
        if s.status == "idle":
            return Text.assemble(("no run yet", self._style("training--dim")),
                                 f"\npress t to train ({clean(self.profile)}), r to resume the last run")
        head = Text(f"● {s.status}", self._style("training--" + STATUS_CLASS.get(s.status, "dim")))
        head.append(clean(f"  {s.run_id or 'n/a'}  {s.model or 'n/a'} · {s.device or 'n/a'} · {s.strategy or 'n/a'}")
                    + (f" x{s.world_size}" if s.world_size and s.world_size > 1 else ""))
        width = max(20, self.size.width)
        frac = s.fraction
        progress = Text(f"epoch {s.epoch or 0}/{s.epochs or '?'}  step {s.step or 0}/{s.total_steps or '?'} ")
        if width >= 70:
            progress.append(bar(frac, max(4, min(20, width - 64))) + " ", self._style("training--bar"))
        progress.append(f"{fmt(None if frac is None else frac * 100, '%')}  "
                        f"{fmt(s.samples_per_s and round(s.samples_per_s), '/s')}  ETA {duration(s.eta_s)}")
        third = Text(f"loss {fmt(s.loss, '', 4)}  acc {fmt(s.test_acc, '%', 2)}  best {fmt(s.best_acc, '%', 2)}"
                     f"  {duration(s.elapsed_s)} trained")
        if s.status == "failed" and s.error:
            third = Text(clean(s.error), self._style("training--bad"))
        lines = [head, progress, third]
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return Text("\n").join(lines)


class TrainingChart(Widget):
    COMPONENT_CLASSES = {"chart--loss", "chart--acc", "chart--axis"}
    state: reactive[TrainingState] = reactive(TrainingState)

    def render(self) -> Text:
        s = self.state
        loss, acc, axis = (self.get_component_rich_style(name, partial=True)
                           for name in ("chart--loss", "chart--acc", "chart--axis"))
        return training_chart(s.loss_points, s.acc_points, self.size.width, self.size.height, s.total_steps,
                              s.steps_per_epoch, loss, acc, axis)


class TrainingPanel(Vertical):
    """The panel: summary above, chart below. `show()` hands both the new state."""

    def compose(self) -> ComposeResult:
        yield TrainingSummary(id="training-summary")
        yield TrainingChart(id="training-chart")

    def show(self, state: TrainingState, profile: str) -> None:
        summary = self.query_one(TrainingSummary)
        summary.profile = profile
        summary.state = state
        self.query_one(TrainingChart).state = state
