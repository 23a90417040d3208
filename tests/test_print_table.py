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
