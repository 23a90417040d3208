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
    Key("r", "resume", "Resume", "Resume the run on screen (else the last run) from its checkpoint "
        "(gputui run --resume RUN --json)."),
    Key("a", "attach", "Attach", "Attach to a run going on this machine, whoever started it (gputui run in "
        "another terminal, a cluster run, a run kept running at quit): follow it, t stops it."),
    Key("R", "runs", "Runs", "Past runs, as gputui runs lists them: one in detail (Enter), lay runs over the "
        "curves (Space), resume one (r), delete one (x, asks first).", "R"),
    Key("u", "launch_slave", "Slave up", "Launch one more spot slave now. The price and the budget effect go to the "
        "events log; refused with a message if it would break the budget."),
    Key("d", "terminate_selected", "Kill slave", "Terminate the slave selected in the cost panel, now."),
    Key("D", "terminate_all", "Kill all", "Terminate every slave of the cluster (asks first).", "D"),
    Key("P", "processes", "Processes", "Every compute process on every host's GPUs: sort, filter, and send SIGTERM, "
        "SIGINT or SIGKILL to one (asks first).", "P"),
    Key("W", "sweep", "Sweep", "The sweep screen: the trials of the profile's sweep (else the newest) with their "
        "state, value, parameters and slot, the best value so far against time, and which slot runs which trial; "
        "n shows the next sweep.", "W"),
    Key("p", "choose_profile", "Profile", "Choose another profile (training, hosts and cloud follow it)."),
    Key("x", "curves_axis", "Axis", "Curves: the next x axis (step, epoch, samples, training time)."),
    Key("left_square_bracket", "curves_rougher", "Smooth-", "Curves: less smoothing (TensorBoard's debiased "
        "moving average; 0 shows the raw curve alone).", "["),
    Key("right_square_bracket", "curves_smoother", "Smooth+", "Curves: more smoothing (up to 0.99); the raw "
        "curve stays, faint, under the smoothed one.", "]"),
    Key("l", "curves_log", "Log", "Curves: the loss on a log or a linear scale."),
    Key("e", "curves_export", "CSV", "Curves: write the run's curves to curves.csv in its run directory (the "
        "format of `gputui runs export RUN_ID --csv`) and say where."),
    Key("L", "toggle_theme", "Light", "Switch to the light theme (for light terminals) and back; "
        "`gputui --light` starts in it.", "L"),
    Key("question_mark", "help", "Help", "Show this help.", "?"),
    Key("q", "quit", "Quit", "Quit. With a run started here going, asks: keep it running (headless; a attaches "
        "again later), stop it with a checkpoint, or cancel. With slaves running, asks: terminate them, keep "
        "them, or cancel."),
)


# Keys of a run of the user's own program (issue 31): in the footer and the help only while
# such a run is on screen (the app's check_action hides them otherwise).
PROGRAM_KEYS: tuple[Key, ...] = (
    Key("m", "curves_metric", "Metric", "Curves of your program's run: the next metric it reported (loss-like "
        "names first, then accuracy-like ones, then the rest); the overlays, x (step or time), l and e work on it."),
    Key("o", "output", "Output", "Your program's output: the last 200 lines of output.log in its run directory, "
        "followed as it writes (Esc or o closes)."),
)
PROGRAM_AFTER = "runs"  # the program keys follow this key in the footer


# Keys of the process table (gputui.ui.processes_panel), shown in its footer and in the help.
PROCESS_KEYS: tuple[Key, ...] = (
    Key("m", "sort('memory')", "Mem", "Sort by GPU memory (largest first)."),
    Key("s", "sort('sm')", "SM", "Sort by SM % (the process's share of its GPU)."),
    Key("c", "sort('cpu')", "CPU", "Sort by CPU %."),
    Key("i", "sort('pid')", "PID", "Sort by PID."),
    Key("n", "sort('user')", "User", "Sort by user name."),
    Key("r", "reverse", "Reverse", "Reverse the order."),
    Key("slash", "filter", "Filter", "Filter: part of a command, and/or user:NAME; Enter applies, empty clears.", "/"),
    Key("T", "signal('TERM')", "SIGTERM", "Send SIGTERM to the selected process (asks first).", "T"),
    Key("I", "signal('INT')", "SIGINT", "Send SIGINT to the selected process (asks first).", "I"),
    Key("K", "signal('KILL')", "SIGKILL", "Send SIGKILL to the selected process (asks first).", "K"),
    Key("escape", "close", "Back", "Back to the dashboard (P too).", "Esc"),
)


# Keys of the hosts panel's lab view (one line per host, when the GPUs do not fit the panel):
# they act, and show in the footer, while the panel has the focus and shows the lab view.
LAB_KEYS: tuple[Key, ...] = (
    Key("s", "sort", "Sort", "Lab view: the next order of the hosts: as listed, utilisation (busiest first), free "
        "GPUs (most first), GPU memory in use (most first), name; unreachable hosts last but as listed."),
    Key("slash", "filter", "Filter", "Lab view: keep the hosts whose name has these words, user:NAME (that account "
        "runs a process there), free (a free GPU), down (unreachable); Enter applies, empty clears.", "/"),
    Key("enter", "open", "Open", "Lab view: the selected host's GPU lines and its processes (Esc back); the "
        "arrows, PgUp/PgDn, Home/End move the selection.", "Enter"),
    Key("U", "users", "Users", "Who holds what: each account across the fleet, its GPUs, GPU memory, GPU-hours "
        "today, hosts and processes, updated each round (Esc closes). Works from any panel.", "U"),
)
APP_LAB_ACTIONS = frozenset({"users"})  # LAB_KEYS bound on the app too (hidden from its footer)


def lab_bindings() -> list[BindingType]:
    return [Binding(k.key, k.action, k.label, key_display=k.display) for k in LAB_KEYS]


def process_bindings() -> list[BindingType]:
    keys: list[BindingType] = [Binding(k.key, k.action, k.label, key_display=k.display) for k in PROCESS_KEYS]
    return keys + [Binding("P", "close", "Back", show=False)]


def bindings() -> list[BindingType]:
    """The app's bindings (ctrl+q quits through the same question as q)."""
    out: list[BindingType] = []
    for k in KEYS:
        out.append(Binding(k.key, k.action, k.label, key_display=k.display))
        if k.action == PROGRAM_AFTER:
            out += [Binding(p.key, p.action, p.label, key_display=p.display) for p in PROGRAM_KEYS]
    out += [Binding(k.key, k.action, k.label, show=False) for k in LAB_KEYS if k.action in APP_LAB_ACTIONS]
    out.append(Binding("ctrl+q", "quit", "Quit", show=False, priority=True))
    return out
