"""What a newcomer meets in the first minutes: the `error` event of `--json`, a subcommand's own
usage, no internal command in the help, one doctor finding for a machine without a GPU, piped
tables that fit $COLUMNS, plurals."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gputui.jobs import doctor
from gputui.model import units
from gputui.cli import main
from gputui.jobs.doctor import Check

from .conftest import cli_env, run_cli


def test_json_bad_input_writes_an_error_event(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["run", "--json", "--data", str(tmp_path / "nowhere")]) == 2
    out, err = capsys.readouterr()
    (line,) = out.splitlines()
    event = json.loads(line)
    assert event["event"] == "error" and event["exit_code"] == 2 and "nowhere" in event["message"]
    assert err.count("\n") == 1 and err.startswith("gputui: error: ")


def test_an_unknown_flag_shows_the_subcommand_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--bogus"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: gputui run ") and err.rstrip().endswith("gputui run: error: unrecognized arguments: --bogus")
    with pytest.raises(SystemExit):
        main(["runs", "export", "x", "--bad"])
    assert capsys.readouterr().err.startswith("usage: gputui runs export ")


@pytest.mark.parametrize("words, fix", [
    (["run", "python", "train.py", "--lr", "0.1"], "gputui run -- python train.py --lr 0.1"),
    (["--profile", "p.toml", "run", "--threads", "1", "python", "my train.py"],
     "gputui --profile p.toml run --threads 1 -- python 'my train.py'"),
])
def test_a_program_without_its_dashes_is_shown_where_they_go(capsys: pytest.CaptureFixture[str], words: list[str],
                                                              fix: str) -> None:
    """`gputui run python train.py` said only "unrecognized arguments: python train.py" (and took
    the program's --lr for the built-in net's)."""
    with pytest.raises(SystemExit) as exit_:
        main(words)
    assert exit_.value.code == 2
    assert capsys.readouterr().err.rstrip().endswith(f"(your own program goes after --: {fix})")


def test_help_and_version_hide_the_internal_worker() -> None:
    result = run_cli("--help")
    assert result.returncode == 0 and "run" in result.stdout
    assert "worker" not in result.stdout and "SUPPRESS" not in result.stdout
    assert run_cli("worker", "--help").returncode == 0  # hidden, still there for `gputui sweep`
    version = run_cli("--version")
    assert version.returncode == 0 and version.stdout.startswith("gputui ")


def test_no_gpu_is_one_finding_with_the_setup_fix() -> None:
    rows = [Check("local", "torch", "pass", "torch 2.13.0+cpu"),
            Check("local", "cuda", "warn", "no CUDA (a CPU build of torch)", doctor.CUDA_TORCH_FIX),
            Check("local", "nvml", "warn", "no NVIDIA driver: no GPU to watch here", "install the driver")]
    (torch_row, gpu) = doctor.no_gpu(rows)
    assert torch_row.name == "torch" and gpu.status == "warn" and gpu.name == "gpu"
    assert "GPUTUI_TORCH=torch sh scripts/setup.sh" in gpu.fix and "pip" not in gpu.fix
    # a GPU machine with a CPU build of torch keeps its own rows: the driver is there
    with_driver = rows[:2] + [Check("local", "nvml", "pass", "NVML ok"), Check("local", "gpus", "pass", "1 GPU: H100")]
    assert doctor.no_gpu(with_driver) == with_driver


def test_doctor_piped_fits_columns_pads_evenly_and_counts_in_words() -> None:
    result = subprocess.run([sys.executable, "-m", "gputui", "doctor"], capture_output=True, text=True, timeout=120,
                            env=cli_env(COLUMNS="100"))
    lines = result.stdout.splitlines()
    assert lines and all(len(ln) <= 100 for ln in lines), lines
    assert "┃ Host " in lines[1]  # the first column is padded like the others
    counts = re.fullmatch(r"(\d+) passed, (\d+) (warnings?), (\d+) failed", lines[-1])
    assert counts is not None, lines[-1]
    assert (counts[3] == "warning") == (counts[2] == "1")


def test_piped_tables_fit_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    from gputui.views.progress import table_width

    monkeypatch.setenv("COLUMNS", "90")
    assert table_width(250) == 90
    monkeypatch.delenv("COLUMNS")
    assert table_width(250) == 250


@pytest.mark.parametrize(("n", "noun", "said"), [(1, "epoch", "1 epoch"), (2, "epoch", "2 epochs"), (0, "process", "0 processes"),
                                                 (1, "process", "1 process"), (3, "GPU", "3 GPUs"), (2, "warning", "2 warnings")])
def test_plurals(n: int, noun: str, said: str) -> None:
    assert units.plural(n, noun) == said


def test_progress_on_resume_names_the_epoch_keeps_the_accuracy_and_holds_its_width(capsys: pytest.CaptureFixture[str]) -> None:
    from gputui.views.progress import ProgressView

    view = ProgressView()
    view.show({"event": "start", "run_id": "r", "model": "seed", "device": "cpu", "strategy": "single", "world_size": 1,
               "epochs": 12, "steps_per_epoch": 117, "total_steps": 1404, "resumed_from_step": 300, "last_acc": 97.5})
    task = view.progress.tasks[0]
    assert task.description == "epoch  3/12" and task.fields["acc"] == "97.50%"
    widths = []
    for step, epoch, loss, rate in ((301, 3, None, None), (302, 3, 0.1234, 9_900.0), (1200, 11, 0.05, 10_100.0)):
        view.show({"event": "step", "step": step, "epoch": epoch, "loss": loss, "samples_per_s": rate})
        line = "".join(str(col.render(task)) for col in view.progress.columns[2:6])
        widths.append(len(line))
    assert len(set(widths)) == 1, widths
    assert str(view.progress.columns[5].render(task)).endswith(" samples/s")
    view.show({"event": "done", "test_acc": 99.0, "epochs": 12, "elapsed_s": 2.0, "eval_s": 0.1})
    err = capsys.readouterr().err
    assert "(single, 1 process), resumed at step 300" in err and "after 12 epochs," in err


def test_sweep_show_counts_the_trials_asked_for(small_data: Path, tmp_path: Path) -> None:
    """`gputui sweep P --trials 2` over a profile of 16: `sweep show` says 2/2, not 2/16."""
    from dataclasses import replace

    from gputui.sweep import show, study as studies
    from gputui.sweep.space import load_spec

    path = tmp_path / "sweep.toml"
    path.write_text(f'[run]\nmodel = "fast"\nepochs = 1\ndata = "{small_data}"\n\n'
                    '[sweep]\nname = "s"\ntrials = 16\nlr = [1e-3, 1e-1]\n')
    _profile, spec = load_spec(path)
    made = studies.create(replace(spec, trials=2))
    for value in (90.0, 91.0):
        trial = made.ask()
        trial.suggest_float("lr", 1e-3, 1e-1, log=True)
        made.tell(trial, value)
    data = show.report("s")
    assert (data["finished"], data["trials"]) == (2, 2)


def _host(name: str, state: Any, message: str | None, gpus: tuple[Any, ...] = ()) -> Any:
    from gputui.model.telemetry import HostSnapshot

    return HostSnapshot(name, state, 1.0, gpus=gpus, message=message)


def test_monitor_once_without_retry_note_and_without_empty_gpu_columns() -> None:
    from rich.console import Console

    from gputui.cli import build_parser
    from gputui.commands.monitor import _View
    from gputui.model.telemetry import HostState
    from gputui.sources.ssh import RETRY_NOTE

    out = io.StringIO()
    view = _View(build_parser().parse_args(["monitor", "--once"]))
    view._console = Console(file=out, width=200, highlight=False)
    down = "connection refused by 10.0.0.9:22; check the port and that sshd runs there"
    view.show([_host("vm", HostState.NO_DRIVER, "no NVIDIA driver"),
               _host("far", HostState.UNREACHABLE, down + RETRY_NOTE.format(delay=1.0))], 0.0)
    text = out.getvalue()
    assert down in text and "retry in" not in text
    header = text.splitlines()[1]
    assert "Name / reason" in header and "Util" not in header and "Memory" not in header and "Procs" not in header


def test_monitor_live_view_has_a_header() -> None:
    from rich.console import Console

    from gputui.cli import build_parser
    from gputui.commands.monitor import _View
    from gputui.model.telemetry import HostState

    out = io.StringIO()
    view = _View(build_parser().parse_args(["monitor", "--interval", "2"]))
    view._console = Console(file=out, width=120, force_terminal=True, highlight=False)
    view.show([_host("vm", HostState.NO_DRIVER, "no NVIDIA driver")], 0.0)
    view.close()
    assert "gputui monitor" in out.getvalue() and "every 2 s" in out.getvalue() and "Ctrl-C quits" in out.getvalue()


def test_the_simulated_cloud_needs_no_ssh_key_and_says_it_is_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "no-keys"))  # no ~/.ssh/id_ed25519.pub
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # no terminal to ask on
    assert main(["cloud", "up", "--provider", "sim", "--no-guard"]) == 2
    err = capsys.readouterr().err
    assert "launches simulated instances" in err and "paid" not in err
    assert main(["cloud", "up", "--provider", "sim", "--yes", "--no-guard"]) == 0
    assert main(["cloud", "down", "--all", "--yes", "--provider", "sim"]) == 0
    assert "public key not found" not in capsys.readouterr().err


def test_curve_ticks_use_one_precision_per_axis() -> None:
    from gputui.runs.curves import axis_labels, log_ticks, x_labels

    assert axis_labels([1.0, 0.1]) == ["1.0", "0.1"]
    assert axis_labels(log_ticks(0.01, 2.0, 4)) == [f"{v:.2f}" for v in log_ticks(0.01, 2.0, 4)]
    assert x_labels("epoch", [0.5, 1.0, 1.5, 2.0]) == ["0.5", "1.0", "1.5", "2.0"]
    assert x_labels("step", [500.0, 1000.0]) == ["500", "1000"]
    assert axis_labels([95.0, 97.5, 100.0], step=2.5, percent=True) == ["95.0%", "97.5%", "100.0%"]


def test_no_message_counts_with_s_in_brackets() -> None:
    """Every count in a message goes through units.plural: an AST scan of gputui's string
    constants (docstrings aside) fails on 'epoch(s)', 'process(es)' and their kind."""
    import ast

    from .conftest import REPO

    found = []
    for path in sorted((REPO / "gputui").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docs = {id(node.body[0].value) for node in ast.walk(tree)
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
                    and re.search(r"[A-Za-z]\((?:e?s)\)", node.value)):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: {node.value[:60]!r}")
    assert found == []


@pytest.mark.parametrize(("value", "noun", "said"), [(3, "process", "3 processes"), ("[/]", "process", "n/a processes"),
                                                     (None, "epoch", "n/a epochs"), (True, "node", "n/a nodes")])
def test_plural_of_a_count_from_outside(value: Any, noun: str, said: str) -> None:
    assert units.plural_of(value, noun) == said


def test_doctor_says_where_runs_are_kept_and_whether_they_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    free = {"bytes": 50 << 30}
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(100 << 30, 0, free["bytes"]))
    home = tmp_path / "data" / "gputui"  # not made yet: its nearest parent that is, is looked at
    (tmp_path / "data").mkdir()
    check = doctor.storage_check(home)
    assert (check.status, check.detail) == ("pass", f"{home}: 50 GiB free")
    assert not home.exists()  # nothing is created
    free["bytes"] = 300 << 20
    check = doctor.storage_check(home)
    assert check.status == "warn" and check.detail.startswith(f"{home}: 300 MiB free: runs keep checkpoints")
    assert "GPUTUI_HOME" in check.fix
    monkeypatch.setattr(doctor.os, "access", lambda path, mode: False)  # (root may write anywhere: a stub)
    check = doctor.storage_check(home)
    assert check.status == "fail" and check.detail == f"{home}: {tmp_path / 'data'}, where it would be made, " \
                                                      "cannot be written by this account"

    def broken(path: object) -> object:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(shutil, "disk_usage", broken)
    check = doctor.storage_check(home)
    assert (check.status, check.detail) == ("fail", f"{home}: Permission denied")
    assert "storage" in {c.name for c in doctor.local_checks()}
