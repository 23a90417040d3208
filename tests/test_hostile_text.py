"""Text from outside the process is data (STYLE habit 12, issue 17 section 5).

A hostile fixture (Rich markup, OSC 52 / OSC 8 / CSI escapes, C1 and bidi controls, BEL,
newlines, 10 kB names) goes through `gputui monitor` (table and JSON, over a real sshd whose
nvidia-smi answers it, and from a replayed recording), `gputui doctor`, `gputui run`'s console
views and the dashboard. Nothing raises, the markup shows as the literal text it is, no
control character reaches the output, rows keep their layout and a huge name ends in "…".
The parsers (nvidia-smi's answers, NVML, recordings, a run's events) strip control characters;
the views render every such value as Text, never markup, so a source that did not clean still
draws safely (the dashboard tests feed one).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest
from rich.cells import cell_len
from textual.widgets._toast import Toast

from gputui.cli import main
from gputui.views.cloud import print_table, say
from gputui.views.progress import JsonView, ProgressView
from gputui.dashboard.child import TrainingChild
from gputui.dashboard.cost import CostFrame, SlaveLine
from gputui.model.errors import UserError
from gputui.model.cloud import BudgetStatus, CloudEvent
from gputui.model.telemetry import GpuProcess, GpuSample, HostSnapshot, HostState
from gputui.model.text import MAX_CHARS, clean, clean_tree
from gputui.sources.nvml import NvmlSource
from gputui.ui.app import create_app
from gputui.ui.cost_panel import SlavesTable
from gputui.ui.events_panel import EventsLog
from gputui.ui.hosts_panel import HostsView
from gputui.ui.messages import CloudEventPosted, CloudNote, CostPolled, TrainingExited
from gputui.ui.screens import ChoiceScreen, ProfileScreen
from gputui.ui.training_actions import earlier_events, post_events
from tests.dashboard_support import drive, make_backend, wait_for
from tests.fake_pynvml import FakeDevice, make_pynvml
from tests.sshd_fixture import Sshd, SshdFactory, sshd_factory  # noqa: F401

MARKUP = "[/] [link=https://evil.example/]click[/link] [bold]"  # MarkupError, a hyperlink, a style
OSC52 = "\x1b]52;c;aGFja2VkIQ==\x07"  # writes "hacked!" to the terminal's clipboard
CSI = "\x1b[2J\x1b[31;1m"  # clears the screen, red bold
OSC8 = "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"  # a terminal hyperlink
TITLE = "\x1b]0;pwned\x1b\\"  # sets the window title, ended by ST
EVIL = f"{MARKUP}{OSC52}{CSI}{OSC8}{TITLE}x\x07\x08\x7f\u009b2J\u202e\r\n\t"
HUGE = "[/]" + "W" * 10240  # a 10 kB name
# What must never reach a terminal: C0 (but the line feeds between lines), DEL, C1, bidi overrides.
CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]")


def assert_inert(text: str) -> None:
    """Nothing in `text` that a terminal would act on."""
    found = sorted(set(CONTROL.findall(text)))
    assert not found, f"control characters reach the output: {found}"


def strings(value: Any) -> Iterator[str]:
    """Every string in a parsed JSON value."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield k
            yield from strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from strings(v)


def table_rows(out: str) -> list[str]:
    """The lines of a Rich box table (they all start with a box character)."""
    return [line for line in out.splitlines() if line[:1] in "┏┃┡│└"]


def column(out: str, n: int) -> list[str]:
    """Column `n` (1 = the first) of each body line of a Rich box table, stripped."""
    return [line.split("│")[n].strip() for line in out.splitlines() if line.startswith("│")]


def squeezed(text: str) -> str:
    return re.sub(r"\s", "", text)


# -- the one cleaner ---------------------------------------------------------------------------

@pytest.mark.parametrize("raw, shown", [
    (f"a{OSC52}b", "ab"),  # OSC ended by BEL, dropped whole (the payload too)
    (f"a{TITLE}b", "ab"),  # OSC ended by ST
    (f"a{OSC8}b", "aclickb"),  # a hyperlink: its text stays, the link goes
    (f"a{CSI}b\x1b[0m", "ab"),
    ("a\x1bPq#0;2;0;0;0\x1b\\b", "ab"),  # DCS (sixel)
    ("a\u009b2Jb\u009d0;t\u009cc", "abc"),  # 8-bit CSI and OSC
    ("a\x07\x08\x7f\x00b\u202ec\u2066d", "abcd"),  # BEL, BS, DEL, NUL, bidi override and isolate
    ("one\ntwo\r\nthree\tfour\u2028five", "one two  three four five"),  # line breaks become spaces
    (MARKUP, MARKUP),  # markup is text: clean leaves it, the views never parse it
    ("NVIDIA H100 80GB HBM3 · é 中文", "NVIDIA H100 80GB HBM3 · é 中文"),
    ("cut\x1b", "cut"), ("cut\x1b]52;c;aGk=", "cut"),  # a sequence cut short by the end of the value
])
def test_clean_makes_one_printable_line(raw: str, shown: str) -> None:
    assert clean(raw) == shown


def test_clean_cuts_a_huge_value_and_leaves_none() -> None:
    assert clean(None) is None
    cut = clean(HUGE)
    assert len(cut) == MAX_CHARS and cut.startswith("[/]WWW") and cut.endswith("…")
    assert clean("x" * 300, limit=10) == "x" * 9 + "…"
    assert clean_tree({"a\n": [f"b{OSC52}", 1, None, {"c": "d\x07"}]}) == {"a ": ["b", 1, None, {"c": "d"}]}


# -- gputui monitor and gputui doctor over a real sshd ------------------------------------------

@pytest.fixture(scope="module")
def hostile(sshd_factory: SshdFactory) -> Sshd:
    """nvidia-smi answers hostile GPU names, uuids, pstates, driver and process names."""
    return sshd_factory("hostile")


@pytest.fixture(scope="module")
def hostile_fail(sshd_factory: SshdFactory) -> Sshd:
    """nvidia-smi fails with a hostile message (the host's message)."""
    return sshd_factory("hostile-fail")


@pytest.fixture
def remote_args(hostile: Sshd, hostile_fail: Sshd, sshd_factory: SshdFactory, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """--host arguments for both servers, whose host keys are known."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "known_hosts").write_text(hostile.known_hosts_line() + hostile_fail.known_hosts_line())
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return ["--no-local", "-i", str(sshd_factory.user_key),
            "--host", f"root@127.0.0.1:{hostile.port}", "--host", f"root@127.0.0.1:{hostile_fail.port}"]


def test_monitor_table_shows_hostile_remote_text_as_text(remote_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", *remote_args]) == 0  # the MarkupError of `[/]` once ended it for every host
    out = capsys.readouterr().out
    assert_inert(out)
    names = column(out, 7)
    assert column(out, 6)[:3] == ["0", "1", ""], out  # one line per GPU
    assert names[0] == "NVIDIA [/] [link=https://evil.example/]…"  # literal, cut at the name's width
    assert names[1] == "[/]" + "W" * 36 + "…"  # the 10 kB name: one cut cell
    assert column(out, 15)[:2] == ["P2[/]", "P8"]  # the pstate, cleaned
    assert squeezed("".join(names[2:])) == squeezed(f"nvidia-smi failed (exit 3): {MARKUP}GPU is on fire")  # folded
    assert len({cell_len(r) for r in table_rows(out)}) == 1, out  # every line as wide: the table holds


def test_monitor_json_holds_the_parsed_text_clean(remote_args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--json", *remote_args]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    doc = json.loads(out)
    assert not [s for s in strings(doc) if CONTROL.search(s)], "control characters survive the parser"
    ok, failed = doc["hosts"]
    first, second = ok["gpus"]
    assert first["name"] == f"NVIDIA {MARKUP}xgpu" and first["pstate"] == "P2[/]" and first["uuid"] == "GPU-hostile-[/]-0"
    assert ok["driver"] == "550.90.07"
    assert first["processes"][0]["name"] == "python [/] train.py click"
    assert len(second["name"]) == MAX_CHARS and second["name"].startswith("[/]WWW") and second["name"].endswith("…")
    assert failed["state"] == "error"
    assert failed["message"] == f"nvidia-smi failed (exit 3): {MARKUP}GPU is on fire"


def test_doctor_shows_hostile_answers_as_text(remote_args: list[str], hostile: Sshd, capsys: pytest.CaptureFixture[str]) -> None:
    python3 = hostile.root / "bin" / "python3"  # the remote python3 answers the probe with hostile text
    python3.write_text("#!/bin/sh\n"
                       "printf 'python 3.12.1\\033]52;c;aGFja2VkIQ==\\007[/]\\n'\n"
                       "printf 'torch 2.5[link=https://evil.example/]\\033[2J cuda 8\\n'\n")
    python3.chmod(0o755)
    try:
        assert main(["doctor", *remote_args]) == 1  # the failing nvidia-smi fails it
        out = capsys.readouterr().out
        assert main(["doctor", "--json", *remote_args]) == 1
        doc = json.loads(capsys.readouterr().out)
    finally:
        python3.unlink()
    assert_inert(out)
    assert "Python 3.12.1[/]" in out and "torch 2.5[link=https://evil.example/], CUDA, 8" in out
    assert "GPUs: NVIDIA [/] [link=https://evil.example/]click[/link]" in out
    rows = table_rows(out)
    assert len({cell_len(r) for r in rows}) == 1, out
    assert not [s for s in strings(doc) if CONTROL.search(s)]
    details = {(c["host"].split(":")[-1], c["name"]): c["detail"] for c in doc["checks"]}
    assert details[(str(hostile.port), "python")] == "Python 3.12.1[/]"
    assert details[(str(hostile.port), "gpus")].startswith(f"2 GPUs: NVIDIA {MARKUP}xgpu, [/]WWW")


# -- the local GPUs (NVML) ----------------------------------------------------------------------

def test_nvml_names_and_local_commands_are_read_clean() -> None:
    """What the driver and /proc say is data too: a GPU name, the driver version, a command line."""
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", f"x{OSC52}{MARKUP}\ny"],
                            stdin=subprocess.PIPE)
    try:
        device = FakeDevice(name=f"{MARKUP}{OSC52}\n{HUGE}", uuid=f"GPU-{CSI}a", processes=[(proc.pid, None)])
        snap = NvmlSource(name="box", module=make_pynvml([device], driver=f"550{TITLE}.90")).poll()[0]  # type: ignore[arg-type]
    finally:
        proc.communicate(b"", timeout=30)
    gpu = snap.gpus[0]
    assert gpu.name is not None and gpu.name.startswith(f"{MARKUP} [/]WWW") and len(gpu.name) == MAX_CHARS
    assert (gpu.uuid, snap.driver) == ("GPU-a", "550.90")
    assert gpu.processes[0].name is not None and gpu.processes[0].name.endswith(f" x{MARKUP} y")


# -- gputui monitor from a replayed recording ---------------------------------------------------

def hostile_round() -> list[HostSnapshot]:
    """Snapshots as a hostile recording (or a source that does not clean) holds them."""
    gpus = (GpuSample(0, name=f"two\nlines {EVIL}", pstate=f"P0{CSI}", util_pct=50.0, mem_used_mib=1024.0,
                      mem_total_mib=8192.0, processes=(GpuProcess(7, name=EVIL, user=f"root{OSC52}"),)),
            GpuSample(1, name=HUGE, util_pct=10.0))
    return [
        HostSnapshot(f"rig{OSC52}\n[/]", HostState.OK, 1.0, kind="replay", gpus=gpus, message=f"{CSI}note {EVIL}"),
        HostSnapshot("Z" * 10240, HostState.ERROR, 1.0, kind="replay", message=f"down: {EVIL} {HUGE}"),
    ]


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    path = tmp_path / "hostile.jsonl"
    doc = {"version": 1, "time": 1.0, "hosts": [h.to_dict() for h in hostile_round()]}
    doc["hosts"][0]["gpus"][1]["temperature_c"] = f"[/]{CSI}"  # text where a number belongs: shown as text
    path.write_text(json.dumps(doc) + "\n", encoding="utf-8")
    return path


def test_monitor_replays_a_hostile_recording_as_text(recording: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["monitor", "--once", "--replay", str(recording)]) == 0
    out = capsys.readouterr().out
    assert_inert(out)
    hosts, names = column(out, 1), column(out, 7)
    assert column(out, 6)[:3] == ["0", "1", ""], out  # one line per GPU: the newlines in the name split no row
    assert hosts[0] == "rig [/]" and names[0].startswith("two lines [/] [link=") and names[0].endswith("…")
    assert names[1].startswith("[/]WWW") and names[1].endswith("…") and column(out, 11)[1] == "[/]"
    assert hosts[2].startswith("ZZZZZZZZZZ") and hosts[2].endswith("…")  # a 10 kB host name: one cut cell
    assert squeezed("".join(names[2:])).startswith(squeezed(f"down: {MARKUP}clickx [/]WWW"))
    assert names[-1].endswith("…")  # the message folds, up to a bound
    assert len({cell_len(r) for r in table_rows(out)}) == 1, out
    assert main(["monitor", "--once", "--json", "--replay", str(recording)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert not [s for s in strings(doc) if CONTROL.search(s)], "control characters survive the replay's parser"
    assert doc["hosts"][0]["gpus"][0]["name"] == f"two lines {MARKUP}clickx   "  # the OSC 8 link's text stays


# -- gputui run's console views -----------------------------------------------------------------

def hostile_run() -> list[dict[str, Any]]:
    """A run's events as a compromised slave could relay them."""
    return [
        {"event": "start", "run_id": f"r{OSC52}{MARKUP}", "model": EVIL, "device": f"cuda{OSC52}", "strategy": "ddp\n\nfake line",
         "world_size": "[/]", "epochs": 2, "total_steps": 4, "resumed_from_step": None},
        {"event": "step", "epoch": 1, "step": 1, "loss": "[/]", "samples_per_s": f"{OSC52}", "elapsed_s": 0.1},
        {"event": "step", "epoch": 1.5, "step": 2, "loss": 0.5, "samples_per_s": 1000.0, "elapsed_s": 0.2},
        {"event": "epoch", "epoch": 1, "step": 2, "train_loss": 0.5, "test_loss": "[/]", "test_acc": 90.0, "elapsed_s": 0.2},
        {"event": "interrupted", "reason": EVIL, "step": "[/]"},
        {"event": "done", "test_acc": HUGE, "epochs": 2, "elapsed_s": 1.0, "eval_s": 0.1},
    ]


def test_progress_view_shows_relayed_text_as_text(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")  # one line per print
    view = ProgressView()
    for event in hostile_run():
        view.show(event)  # once: MarkupError at `[/]`, ValueError at a loss that is not a number
    view.close()
    err = capsys.readouterr().err
    assert_inert(err)
    assert f"run r{MARKUP}: model {MARKUP}click" in err
    assert "(ddp  fake line, n/a processes)" in err
    assert "test loss n/a" in err and f"interrupted ({MARKUP}click" in err and "done: test acc n/a" in err


def test_json_view_keeps_the_data_and_escapes_it(capsys: pytest.CaptureFixture[str]) -> None:
    view = JsonView()
    for event in hostile_run():
        view.show(event)
    out = capsys.readouterr().out
    assert_inert(out)
    assert [json.loads(line) for line in out.splitlines()] == hostile_run()  # for machines: exact, escaped


# -- gputui cloud and gputui cost ---------------------------------------------------------------

def test_cloud_tables_and_lines_show_what_the_cloud_says_as_text(capsys: pytest.CaptureFixture[str]) -> None:
    print_table(f"instances in {MARKUP}{CSI}", ["id", "zone"],
                [[f"i-{MARKUP}{OSC52}", f"us-east-1a{CSI}\n"], ["[/]" + "W" * 60, "b"]], caption=f"note {OSC52}[/]")
    say(f"launch refused ({EVIL})\nsecond line{CSI}")
    out, err = capsys.readouterr()
    assert_inert(out)
    assert_inert(err)
    assert f"instances in {MARKUP}" in out and "note [/]" in out
    assert column(out, 1) == [f"i-{MARKUP}", "[/]" + "W" * 60] and column(out, 2) == ["us-east-1a", "b"]
    assert len({cell_len(r) for r in table_rows(out)}) == 1, out
    assert err == f"launch refused ({MARKUP}clickx   ) second line\n"  # one line


# -- the dashboard ------------------------------------------------------------------------------

def test_the_dashboard_reads_a_runs_events_clean(tmp_path: Path) -> None:
    """Where the dashboard parses events (the child's stdout and stderr, a run's events.jsonl)."""
    events = [{"event": "start", "run_id": f"r{OSC52}", "model": EVIL}, {"event": "interrupted", "reason": [CSI, 1]}]
    script = (f"import json, sys\nfor e in {events!r}: print(json.dumps(e))\n"
              f"print({f'gputui: error: {OSC52}{MARKUP}'!r}, file=sys.stderr)")
    child = TrainingChild([sys.executable, "-c", script])
    child.start()
    got = list(child.events())
    assert child.wait() == 0
    assert got == [{"event": "start", "run_id": "r", "model": f"{MARKUP}clickx   "}, {"event": "interrupted", "reason": ["", 1]}]
    assert child.last_error() == f"gputui: error: {MARKUP}"
    (tmp_path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events + [{"event": "start"}]))
    assert earlier_events(str(tmp_path)) == got


class HostileSource:
    """A telemetry source that hands the panels hostile text as it is (no parser cleaned it)."""

    def poll(self) -> list[HostSnapshot]:
        return hostile_round()

    def close(self) -> None:
        pass


class HostileCloud:
    """A provider whose every call fails with a hostile message."""

    name, region = "sim", "us-east-1"

    def __getattr__(self, _name: str) -> Any:
        def fail(*_args: Any, **_kwargs: Any) -> Any:
            raise UserError(f"cloud says {CSI}{EVIL}")

        return fail


def hostile_frame() -> CostFrame:
    slave = SlaveLine(f"i-{MARKUP}{OSC52}", f"g5{CSI}", "us-east-1a\n", f"running{TITLE}", "spot", 0.0, 1.0, 0.5)
    return CostFrame(1.0, f"c{MARKUP}{OSC52}", "sim", "us-east-1", "g5", BudgetStatus(10.0, 1.0, 0.0), 1.0, (slave,))


def screen_segments(app: Any) -> str:
    """Every character the app would write to the terminal now, less its own cursor moves."""
    update = app.screen._compositor.render_update(full=True, screen_stack=app._background_screens)
    return "\n".join("".join(seg.text for strip in line for seg in strip if not seg.control) for line in update.strips)


def test_dashboard_panels_draw_hostile_text_as_text() -> None:
    app = create_app(make_backend(source=HostileSource(), provider=HostileCloud(), interval=0.1))

    async def scenario(pilot: Any) -> None:
        events = app.query_one(EventsLog)
        await wait_for(pilot, lambda: app.hosts_polls >= 2 and app.cloud_polls >= 1, what="hostile polls")
        post_events(hostile_run(), app.post_message, app.generation)
        app.post_message(TrainingExited(1, f"gputui: error: {CSI}{EVIL}", app.generation))  # a toast too
        app.post_message(CloudEventPosted(CloudEvent(1.0, "interrupted", f"slave {EVIL}", f"i-{MARKUP}")))
        app.post_message(CloudNote(f"note {EVIL}", "warning", notify=True))
        app.post_message(CostPolled(hostile_frame()))
        await wait_for(pilot, lambda: app.query_one(SlavesTable).row_count == 1 and app.training.status == "failed"
                       and any("note [/]" in line for line in events.lines_written), what="every hostile message")
        await wait_for(pilot, lambda: len(app.screen.query(Toast)) == 2, what="the two toasts")
        await pilot.pause()
        shown = screen_segments(app)
        assert_inert(shown)
        lines = shown.split("\n")
        assert len(lines) == 40 and {cell_len(line) for line in lines} == {200}, shown  # nothing broke the layout
        hosts = [app.query_one(HostsView).render_line(y).text for y in range(5)]
        assert hosts[0].startswith("● rig [/] · two lines [/] [") and "· cpu n/a" in hosts[0], hosts  # GPU model
        assert hosts[1].startswith(f"    note {MARKUP}clickx"), hosts  # the host's message, on its own line
        assert hosts[2].startswith(" 0 two lines [/] [l… ") and hosts[3].startswith(" 1 [/]WWWWWWWWWWWWW… "), hosts
        assert hosts[4].startswith("✖ ZZZZZZZZZZ") and hosts[4].rstrip().endswith("Z…")  # the 10 kB name, cut
        assert "● failed  r[/] [link=https://evil.example/]" in shown  # the training panel
        assert "│ failed: gputui: error: [/] [link=https://evil.example/]" in shown  # its one error line
        assert " i-[/] [link=https://evil.example/]click[/link] [bold] g5 " in shown  # the slave's row
        assert " slave [/] [link=https://evil.example/]" in shown  # the log (toasts cover its right side)
        assert f"slave {MARKUP}clickx   " in events.lines_written
        assert all(not CONTROL.search(line) for line in events.lines_written)
        toasts = sorted(str(t.render()) for t in app.screen.query(Toast))
        assert toasts == [f"note {MARKUP}clickx   ", f"run failed (exit 1): gputui: error: {MARKUP}clickx"], toasts  # one line, stripped
        await pilot.press("q")

    drive(app, scenario, size=(200, 40), notifications=True)  # wide: the hosts panel shows GPU names


def test_dashboard_dialogs_show_hostile_names_as_text(tmp_path: Path) -> None:
    profile = tmp_path / f"[link=x]{CSI}rig[bold].toml"  # a profile's file name is shown too
    profile.write_text((Path(__file__).resolve().parent.parent / "profiles" / "local.toml").read_text())
    app = create_app(make_backend(profile, source=HostileSource(), provider=HostileCloud(), interval=0.1))

    async def scenario(pilot: Any) -> None:
        await wait_for(pilot, lambda: app.cloud_polls >= 1, what="a cloud poll")
        app.post_message(CostPolled(hostile_frame()))
        await wait_for(pilot, lambda: app.cost_frame is not None, what="the hostile cost frame")
        assert "gputui · profile [link=x]rig[bold].toml" in screen_segments(app)  # the status line
        await pilot.press("D")  # the question names the cluster
        await wait_for(pilot, lambda: isinstance(app.screen, ChoiceScreen), what="the question")
        await pilot.pause()
        question = screen_segments(app)
        assert_inert(question)
        assert f"Terminate all slaves of cluster c{MARKUP}" in question
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ChoiceScreen), what="the question to close")
        await pilot.press("p")  # the profiles, this one first
        await wait_for(pilot, lambda: isinstance(app.screen, ProfileScreen), what="the profiles")
        await pilot.pause()
        choices = screen_segments(app)
        assert_inert(choices)
        assert "● [link=x]rig[bold].toml" in choices
        await pilot.press("escape")
        await pilot.press("q")

    drive(app, scenario)
