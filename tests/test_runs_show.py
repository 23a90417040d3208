"""`gputui runs show RUN_ID`: one run in detail, from the ends of its files however long the run,
every text from the run cleaned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gputui.cli import main
from gputui.model.events import make
from gputui.runs import detail
from gputui.runs import store as runs


def write_run(home: Path, run_id: str, events: list[dict[str, Any]], profile: str = "[run]\n") -> Path:
    path = home / run_id
    path.mkdir(parents=True)
    (path / runs.PROFILE).write_text(profile)
    (path / runs.EVENTS).write_text("".join(runs.encode(e) + "\n" for e in events))
    return path


def program_events(values: list[dict[str, float]], end: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    out = [make("start", run_id="r", program="python train.py --lr 0.01", workdir="/w", device="cpu",
                strategy="single", world_size=1, objective="val_acc", direction="maximize",
                git_commit="1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b", git_dirty=True)]
    out += [make("metrics", step=i, values=v, elapsed_s=float(i)) for i, v in enumerate(values)]
    return out + ([end] if end else [])


def test_a_program_run_in_detail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "runs"
    path = write_run(home, "20261207-100000-aaaa", program_events(
        [{"loss": 1.0, "val_acc": 0.5}, {"loss": 0.5}, {"val_acc": 0.8, "\x1b[31mevil": 1.0}],
        make("done", exit_code=0, elapsed_s=3.0)) + [make("metrics", step=9, values={"loss": 9.0}, rank=1,
                                                          elapsed_s=3.0)],
        profile='[run]\ncommand = ["python", "train.py", "--lr", "{lr}"]\nworkdir = "/w"\n'
                'trial = {lr = 0.01, tag = "fixed", note = "\\u001b]0;owned\\u0007x"}\n')
    (path / runs.OUTPUT).write_bytes(b"".join(b"line %d\n" % i for i in range(30))
                                     + b"\rtrain 1/3\rtrain 2/3\rtrain 3/3\n\x1b[2Jcleared?\n")
    ckpt = path / runs.CHECKPOINTS
    (ckpt / "sub").mkdir(parents=True)
    (ckpt / "a.pt").write_bytes(b"x" * 1000)
    (ckpt / "sub" / "b.pt").write_bytes(b"y" * 24)
    d = detail.detail("last", home)
    assert d.summary.state == "done" and d.workdir == "/w"
    assert d.trial == {"lr": 0.01, "tag": "fixed", "note": "x"}  # a string from the run: cleaned
    assert d.step == 2  # rank 1's step 9 is not the run's
    assert list(d.metrics) == ["evil", "val_acc", "loss"] and d.metrics["loss"] == 0.5  # the latest first, cleaned
    assert (d.checkpoint_files, d.checkpoint_bytes) == (2, 1024) and d.checkpoint == str(ckpt)
    assert d.output[-2:] == ["train 3/3", "cleared?"] and len(d.output) == detail.OUTPUT_LINES  # a bar: its last frame
    assert d.next is None  # done: nothing to go on with
    assert main(["runs", "show", "last", "--dir", str(home)]) == 0
    text = capsys.readouterr().out
    assert "\x1b" not in text
    for expected in ("run 20261207-100000-aaaa · done", "  program    python train.py --lr 0.01",
                     "  code       git 1a2b3c4d5e with uncommitted changes", "  trial      lr=0.01 tag='fixed' note='x'",
                     "  objective  val_acc (maximize): best 0.8 · last 0.8",
                     "  latest     step 2 · evil 1 · val_acc 0.8 · loss 0.5",
                     f"  checkpoint {ckpt} (2 files, 1 KiB)", "    train 3/3", "  curves     gputui runs export"):
        assert expected in text, text
    assert "go on" not in text
    assert main(["runs", "show", "20261207-100000-aaaa", "--json", "--dir", str(home)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["summary"]["run_id"] == "20261207-100000-aaaa" and shown["metrics"]["val_acc"] == 0.8
    assert shown["trial"] == {"lr": 0.01, "tag": "fixed", "note": "x"} and shown["next"] is None


def test_an_interrupted_net_run_says_how_to_go_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "runs"
    path = write_run(home, "20261207-110000-bbbb", [
        make("start", run_id="r", model="seed", device="cpu", strategy="ddp", world_size=2, epochs=12),
        make("step", step=10, epoch=1, loss=0.3, samples_per_s=33692.4, lr=0.02, elapsed_s=1.0),
        make("epoch", step=11, epoch=1, train_loss=0.3, test_loss=0.1, test_acc=97.5, elapsed_s=1.2),
        make("interrupted", step=11, epoch=1, reason="SIGTERM", elapsed_s=1.3)])
    (path / runs.CHECKPOINT).write_bytes(b"z" * 2048)
    assert main(["runs", "show", str(path)]) == 0  # a run directory, anywhere
    text = capsys.readouterr().out
    for expected in ("run 20261207-110000-bbbb · interrupted: SIGTERM", "  model      seed · 1/12 epochs · best 97.50%",
                     "  device     cpu · ddp x2", "33,692 samples/s", "test acc 97.50%",
                     f"  checkpoint {path / runs.CHECKPOINT} (2 KiB)", f"  go on      gputui run --resume {path}"):
        assert expected in text, text
    assert "output" not in text


def test_a_cluster_runs_output_is_its_nodes_latest(tmp_path: Path) -> None:
    """A cluster run of a program has no output.log of its own: each node writes nodes/NAME/output.log."""
    import os

    home = tmp_path / "runs"
    path = write_run(home, "20261207-130000-dddd", program_events([{"loss": 1.0}]))
    for name, when in (("slave-1", 1000), ("master", 2000)):
        log = path / "nodes" / name / runs.OUTPUT
        log.parent.mkdir(parents=True)
        log.write_text(f"{name} line\n")
        os.utime(log, (when, when))
    d = detail.detail("last", home)
    assert d.output == ["master line"] and d.output_path == str(path / "nodes" / "master" / runs.OUTPUT)
    assert f"  output     the last 1 line of {d.output_path}:" in detail.text_lines(d)


def test_the_latest_values_come_from_the_end_of_a_long_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "runs"
    values = [{"loss": 1.0 / (i + 1), "only_early": 1.0} if i < 10 else {"loss": 1.0 / (i + 1)} for i in range(20_000)]
    path = write_run(home, "20261207-120000-cccc", program_events(values))
    assert (path / runs.EVENTS).stat().st_size > 4 * detail.EVENTS_TAIL
    starts: list[int] = []
    real = runs.iter_events
    monkeypatch.setattr(runs, "iter_events", lambda path, start=0, end=None: (starts.append((start, end)),
                                                                              real(path, start, end))[1])
    d = detail.detail("20261207-120000-cccc", home)
    size = (path / runs.EVENTS).stat().st_size
    assert starts == [(size - detail.EVENTS_TAIL, size)]  # the tail as it was, however it grows
    assert d.step == 19_999 and d.metrics == {"loss": pytest.approx(1 / 20_000)}  # only the tail is read
    big = path / runs.OUTPUT
    big.write_bytes(b"x" * (3 * detail.OUTPUT_TAIL) + b"\n" + b"".join(b"end %d\n" % i for i in range(3)))
    assert detail.detail("20261207-120000-cccc", home).output == ["end 0", "end 1", "end 2"]  # the cut line left out


def test_an_unknown_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["runs", "show", "nope", "--dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("gputui: error: runs show nope: no such run")
