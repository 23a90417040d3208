"""Training: the run's state in three lines and its curves (gputui.ui.curves_panel)."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widget import Widget

from gputui.model import units
from gputui.dashboard.training import TrainingState
from gputui.model.text import clean
from gputui.ui.curves_panel import CurvesPanel
from gputui.ui.draw import bar

PROGRAM_ROOM = 40  # columns of a program's command the first line makes room for
STATUS_CLASS = {"running": "ok", "starting": "ok", "stopping": "warn", "done": "ok", "interrupted": "warn",
                "failed": "bad", "stopped": "warn", "idle": "dim"}


class TrainingSummary(Widget):
    """Three lines: who the run is; where it is (progress, recent rate, ETA) or, once it has
    ended, how it ended; its loss and accuracy. Every number is formatted by gputui.model.units."""

    COMPONENT_CLASSES = {"training--ok", "training--warn", "training--bad", "training--dim", "training--bar"}
    state: reactive[TrainingState] = reactive(TrainingState)
    profile: reactive[str] = reactive("")

    def _style(self, name: str) -> Style:
        return self.get_component_rich_style(name, partial=True)

    _shown: Text | None = None  # what the last show() would draw: no refresh while it stays the same

    def show(self, state: TrainingState) -> None:
        """Take a new state; refresh only when the text it draws changed (a run streaming
        events changes its state often, its three lines less often)."""
        text = self._text(state)
        self.set_reactive(TrainingSummary.state, state)  # no compare of the whole state, no refresh by itself
        if self._shown is None or text != self._shown:
            self._shown = text
            self.refresh()

    def render(self) -> Text:
        return self._text(self.state)

    def _text(self, s: TrainingState) -> Text:
        if s.status == "idle":
            return Text.assemble(("no run yet", self._style("training--dim")),
                                 f"\npress t to train ({clean(self.profile)}), r to resume the last run, "
                                 "a to attach to a running one")
        width = max(20, self.size.width)
        if s.program is not None:
            return self._program_text(s, width)
        if s.status == "starting" and s.step is None:  # the process is up, its first event is to come
            return Text.assemble(self._head(s, width), "\n",
                                 ("starting (loading torch and the data)", self._style("training--dim")))
        lines = [self._head(s, width), self._final(s, width) if s.ended else self._progress(s, width),
                 self._numbers(s, width)]
        for line in lines:
            line.truncate(width, overflow="ellipsis")  # only a line with no shorter form left
        return Text("\n").join(lines)

    # Each line drops detail in a fixed order to fit the panel's width, never cutting a number:
    # the head drops "(attached)", then the strategy and device; the progress drops the bar, then
    # the steps, then the percentage, then the rate (the epoch and the ETA stay); the numbers drop
    # "trained", then the best accuracy, then the time.

    def _head(self, s: TrainingState, width: int) -> Text:
        style = self._style("training--" + STATUS_CLASS.get(s.status, "dim"))
        named = [x for x in (s.model, s.device, s.strategy) if x]  # only what the run said
        scale = f" x{s.world_size}" if s.world_size and s.world_size > 1 else ""
        tails = [" · ".join(named) + scale if named else "", " · ".join(named[:1]), ""]
        for what in dict.fromkeys(tails):
            for attached in ((True, False) if s.attached else (False,)):
                who = "  ".join(x for x in (s.run_id, what) if x)
                if not who and s.ended:
                    who = "before the run had started"
                head = Text(f"● {s.status}", style)
                head.append(clean(f"  {who}" if who else ""))  # names from the run's events: data
                if attached:
                    head.append("  (attached)", self._style("training--dim"))
                if head.cell_len <= width:
                    return head
        return head

    def _progress(self, s: TrainingState, width: int) -> Text:
        frac = s.fraction
        epoch = f"epoch {s.epoch or 0}/{s.epochs or '?'}"
        steps = f"step {units.count(s.step or 0)}/{units.count(s.total_steps) if s.total_steps else '?'}"
        pct = units.pct(None if frac is None else frac * 100)
        rate = units.rate(s.samples_per_s)
        eta = f"ETA {units.duration(s.eta_s)}"
        full = f"{epoch}  {steps}  {pct}  {rate}  {eta}"
        room = width - len(full) - 1
        if room >= 6:  # the bar goes between the steps and the percentage
            text = Text(f"{epoch}  {steps} ")
            text.append(bar(frac, min(20, room)), self._style("training--bar"))
            text.append(f" {pct}  {rate}  {eta}")
            return text
        return Text(self._fit(width, full, f"{epoch}  {pct}  {rate}  {eta}", f"{epoch}  {rate}  {eta}",
                              f"{epoch}  {eta}"))

    @staticmethod
    def _fit(width: int, *forms: str) -> str:
        """The first (most detailed) form that fits, else the shortest."""
        return next((form for form in forms if len(form) <= width), forms[-1])

    def _final(self, s: TrainingState, width: int) -> Text:
        """How the run ended, in place of the progress and the ETA."""
        where = (f"epoch {s.epoch}/{s.epochs or '?'}, step {units.count(s.step)}" if s.step
                 else "before its first step")
        after = f" after {units.duration(s.elapsed_s)}" if s.elapsed_s is not None else ""
        if s.status == "done":
            epochs = s.epochs if s.epochs is not None else s.epoch
            said = units.plural_of(epochs, "epoch")
            return Text(self._fit(width, f"done: {said}, {units.count(s.step)} steps in "
                                         f"{units.duration(s.elapsed_s)}",
                                  f"done: {said} in {units.duration(s.elapsed_s)}"),
                        self._style("training--ok"))
        if s.status == "failed":
            return Text(clean(f"failed: {s.error or 'the run failed'}"), self._style("training--bad"))
        why = f" ({clean(s.reason)})" if s.reason else ""
        hint = "; r resumes it" if s.status == "interrupted" else ""
        return Text(self._fit(width, f"{s.status}{why} at {where}{after}{hint}", f"{s.status}{why} at {where}{hint}",
                              f"{s.status}{why} at {where}", f"{s.status} at {where}"),
                    self._style("training--warn"))

    def _numbers(self, s: TrainingState, width: int) -> Text:
        if s.status == "failed" and not s.step:
            where = f"exit code {s.exit_code}" if s.exit_code is not None else "no step was trained"
            return Text(where, self._style("training--dim"))
        loss = f"loss {units.NA if s.loss is None else f'{s.loss:.4f}'}"
        acc = f"acc {units.NA if s.test_acc is None else f'{s.test_acc:.2f}%'}"
        best = f"best {units.NA if s.best_acc is None else f'{s.best_acc:.2f}%'}"
        took = units.duration(s.elapsed_s)
        prefix = f"at epoch {s.epoch}/{s.epochs or '?'}, step {units.count(s.step)}:  " if s.status == "failed" else ""
        return Text(self._fit(width, f"{prefix}{loss}  {acc}  {best}  {took} trained",
                              f"{prefix}{loss}  {acc}  {best}  {took}", f"{prefix}{loss}  {acc}  {took}",
                              f"{prefix}{loss}  {acc}", f"{loss}  {acc}"))


    # A run of the user's own program (issue 31): who it is (its command, device, the GPUs it
    # holds); where it is (step, epoch, time, steps/s) or how it ended; its latest metrics, as many
    # as fit, loss-like names first. The command and the names are the program's: data, cleaned.

    def _program_text(self, s: TrainingState, width: int) -> Text:
        lines = [self._program_head(s, width),
                 self._program_final(s, width) if s.ended else self._program_progress(s, width),
                 self._program_metrics(s, width)]
        for line in lines:
            line.truncate(width, overflow="ellipsis")
        return Text("\n").join(lines)

    def _program_head(self, s: TrainingState, width: int) -> Text:
        """"● running  RUN_ID  cuda · single · GPU 0 · python train.py …": the command keeps up to
        PROGRAM_ROOM columns; to make room the device and the strategy go first, then the run id
        (the events log names it), and the GPUs it holds last."""
        style = self._style("training--" + STATUS_CLASS.get(s.status, "dim"))
        held = f"GPU {','.join(str(g) for g in s.gpus)}" if s.gpus else ""
        scale = f" x{s.world_size}" if s.world_size and s.world_size > 1 else ""
        where = [x for x in (s.device, (s.strategy or "") + scale if s.strategy else "", held) if x]
        program = clean(s.program or "", 200)
        need = min(len(program), PROGRAM_ROOM)
        for named, shown in ((True, where), (True, where[-1:]), (False, where[-1:]), (False, [])):
            head = Text(f"● {s.status}", style)
            head.append(clean(f"  {s.run_id}" if named and s.run_id else "", 80) + "  "
                        + "".join(x + " · " for x in shown))
            if head.cell_len + need <= width:
                break
        head.append(program)
        head.truncate(width, overflow="ellipsis")
        return head

    @staticmethod
    def _position(s: TrainingState) -> str:
        step = f"step {units.count(s.step)}" if s.step is not None else "no step yet"
        epoch = f"  epoch {s.epoch:g}" if s.epoch is not None else ""
        return step + epoch

    def _program_progress(self, s: TrainingState, width: int) -> Text:
        if s.status == "starting" and not s.metrics:
            return Text("starting the program", self._style("training--dim"))
        position = self._position(s)
        took = units.duration(s.elapsed_s)
        rate = f"{units.NA if s.step_rate is None else f'{s.step_rate:.3g}'} steps/s"
        return Text(self._fit(width, f"{position}  {took}  {rate}", f"{position}  {took}", position))

    def _program_final(self, s: TrainingState, width: int) -> Text:
        position = self._position(s) if s.step is not None or s.epoch is not None else "before its first report"
        after = f" after {units.duration(s.elapsed_s)}" if s.elapsed_s is not None else ""
        if s.status == "done":
            return Text(self._fit(width, f"done: exit 0 at {position}{after}", f"done at {position}", "done"),
                        self._style("training--ok"))
        if s.status == "failed":
            return Text(clean(f"failed: {s.error or 'the run failed'}"), self._style("training--bad"))
        why = f" ({clean(s.reason)})" if s.reason else ""
        hint = "; r resumes it" if s.status == "interrupted" else ""
        return Text(self._fit(width, f"{s.status}{why} at {position}{after}{hint}", f"{s.status}{why} at {position}{hint}",
                              f"{s.status} at {position}"), self._style("training--warn"))

    def _program_metrics(self, s: TrainingState, width: int) -> Text:
        if not s.metrics:
            said = "no metrics yet (gputui.report.log, or [run] metrics_regex)" if s.active else "no metrics reported"
            return Text(said, self._style("training--dim"))
        text = Text()
        for index, (name, value) in enumerate(s.metrics):
            part = f"{clean(name, 40)} = {metric_value(value)}"
            left = len(s.metrics) - index - 1
            more = f"  +{left} more" if left else ""
            gap = "  " if index else ""
            if text.cell_len + len(gap) + len(part) + len(more) > width and index:
                text.append(f"  +{len(s.metrics) - index} more", self._style("training--dim"))
                break
            text.append(gap + part)
        return text


def metric_value(value: float) -> str:
    """A reported number: an int as it is, a float with 4 significant digits (1e-05, 0.9812, 1234)."""
    if isinstance(value, int):
        return units.count(value)
    return f"{value:.4g}"


class TrainingPanel(Vertical):
    """The panel: summary above, chart below. `show()` hands both the new state."""

    def compose(self) -> ComposeResult:
        yield TrainingSummary(id="training-summary")
        yield CurvesPanel(id="training-chart")

    def show(self, state: TrainingState, profile: str) -> None:
        summary = self.query_one(TrainingSummary)
        summary.profile = profile
        summary.show(state)
        self.query_one(CurvesPanel).state = state
