"""Every key of the dashboard, declared once: the footer and the help screen read this list."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding, BindingType


@dataclass(frozen=True)
class Key:
    key: str
    action: str
    label: str  # in the footer
    help: str  # in the help screen
    display: str | None = None


KEYS: tuple[Key, ...] = (
    Key("t", "toggle_training", "Train/stop", "Start the profile's training run (gputui run --json); again: stop it "
        "(it checkpoints and exits, resumable with r)."),
    Key("r", "resume", "Resume", "Resume the last run from its checkpoint (gputui run --resume last --json)."),
    Key("u", "launch_slave", "Slave up", "Launch one more spot slave now. The price and the budget effect go to the "
        "events log; refused with a message if it would break the budget."),
    Key("d", "terminate_selected", "Kill slave", "Terminate the slave selected in the cost panel, now."),
    Key("D", "terminate_all", "Kill all", "Terminate every slave of the cluster (asks first).", "D"),
    Key("p", "choose_profile", "Profile", "Choose another profile (training, hosts and cloud follow it)."),
    Key("question_mark", "help", "Help", "Show this help.", "?"),
    Key("q", "quit", "Quit", "Quit. With slaves running, asks: terminate them, keep them, or cancel. "
        "A running training is stopped with a checkpoint first."),
)


def bindings() -> list[BindingType]:
    """The app's bindings (ctrl+q quits through the same question as q)."""
    out: list[BindingType] = [Binding(k.key, k.action, k.label, key_display=k.display) for k in KEYS]
    out.append(Binding("ctrl+q", "quit", "Quit", show=False, priority=True))
    return out
