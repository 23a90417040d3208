"""gputui.views.cloud.print_table, the one printer of the CLI's tables (runs, cloud, sweeps):
the title and the caption are whole lines whatever the table's width, and no line ends in
padding (a script that greps the output, or a diff of it, sees what was said)."""

from __future__ import annotations

import pytest

from gputui.views.cloud import print_table


def test_a_narrow_table_keeps_its_title_and_caption_on_one_line_each(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table("Runs in /home/someone/.local/share/gputui/runs", ["id"], [["a"]],
                caption="see a run's curves: gputui runs export ID --csv [FILE]")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "Runs in /home/someone/.local/share/gputui/runs", lines
    assert lines[-1] == "see a run's curves: gputui runs export ID --csv [FILE]", lines
    assert any("a" in line and "\u2502" in line for line in lines[1:-1]), lines


def test_no_line_of_a_wide_table_ends_in_spaces(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    print_table("t", ["id", "note"], [["x" * 20, "y" * 150]], caption="c")
    out = capsys.readouterr().out
    assert out.endswith("c\n") and all(line == line.rstrip() for line in out.splitlines()), out


def test_without_a_caption_the_table_is_the_last_line(capsys: pytest.CaptureFixture[str]) -> None:
    print_table("t", ["id"], [["a"]])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "t" and lines[-1].startswith("\u2514"), lines


def test_a_long_note_in_the_last_column_is_cut_and_squeezes_no_other(capsys: pytest.CaptureFixture[str],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed run's note of 300 characters once left `gputui runs` with its id, model and
    state columns squeezed to nothing; now the note gives way, cut with an ellipsis."""
    from rich.cells import cell_len

    monkeypatch.delenv("COLUMNS", raising=False)
    columns = ["id", "started", "model", "device", "state", "note"]
    rows = [["20261207-060303-4897", "2026-12-07 06:03", "python", "cpu", "failed", "TypeError: " + "x" * 300],
            ["20261207-061428-9934", "2026-12-07 06:14", "fast", "cpu", "interrupted", "output closed"]]
    print_table("Runs", columns, rows)
    lines = capsys.readouterr().out.splitlines()
    body = [line for line in lines if line.startswith("\u2502")]
    assert [[cell.strip() for cell in line.split("\u2502")[1:6]] for line in body] == [row[:5] for row in rows], lines
    assert body[0].rstrip("\u2502 ").endswith("\u2026") and "output closed" in body[1]
    assert max(cell_len(line) for line in lines) <= 250


RUNS = [["20261207-060303-4897", "2026-12-07 06:03", "nonexistent.py", "cpu", "single", "n/a", "n/a", "n/a", "0s",
         "$0.00", "failed", "python exited with code 2: python: can't open file '/nonexistent.py'"],
        ["20261207-061428-9934", "2026-12-07 06:14", "fast", "cpu", "single", "0/1", "n/a", "n/a", "0s", "$0.00",
         "interrupted", "output closed"]]


@pytest.mark.parametrize("width, left_out", [
    (250, []),
    (140, ["started"]),
    (120, ["started", "strategy", "device"]),
    (80, ["started", "strategy", "device", "note", "cost", "best acc", "time"]),
])
def test_gputui_runs_on_a_narrow_terminal_leaves_columns_out_in_its_order_and_says_so(
        width: int, left_out: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """At 120 columns every column used to be squeezed to a few characters ("dev…", "$…"); now the
    columns gputui runs can spare go first, whole columns stay whole, and a line names what went."""
    from rich.cells import cell_len

    from gputui.runs.history import COLUMNS, HIDE_FIRST

    monkeypatch.setenv("COLUMNS", str(width))
    print_table("Runs", list(COLUMNS), RUNS, hide_first=HIDE_FIRST)
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("\u2503"))
    shown = [cell.strip() for cell in header.strip("\u2503").split("\u2503")]
    assert shown == [c for c in COLUMNS if c not in left_out], lines
    table = [line for line in lines if line[:1] in "\u250f\u2503\u2521\u2502\u2514"]
    assert max(cell_len(line) for line in table) <= width, lines
    body = [[cell.strip() for cell in line.strip("\u2502").split("\u2502")] for line in table if line.startswith("\u2502")]
    assert len(body) == len(RUNS)
    for row, full in zip(body, RUNS):
        kept = [value for column, value in zip(COLUMNS, full) if column not in left_out]
        whole = len(kept) if "note" in left_out else len(kept) - 1  # only a note may be cut
        assert row[:whole] == kept[:whole], row
    text = "\n".join(lines)
    said = (f"left out to fit {width} columns: {', '.join(left_out)} (a wider terminal shows "
            f"{'them' if len(left_out) > 1 else 'it'})")
    assert (said in text) == bool(left_out) and ("left out" in text) == bool(left_out), lines
