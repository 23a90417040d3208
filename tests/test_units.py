"""gputui.model.units: the one set of display formats. A table of cases, with the edge of each rule."""

from __future__ import annotations

import math
from typing import Any

import pytest

from gputui.model import units
from gputui.model.units import NA

CASES = [
    # memory in MiB: MiB below 1 GiB, GiB with one decimal below 10 GiB, whole GiB above
    (units.mib, (None,), NA),
    (units.mib, (0,), "0 MiB"),
    (units.mib, (512,), "512 MiB"),
    (units.mib, (1023,), "1023 MiB"),
    (units.mib, (1023.6,), "1.0 GiB"),
    (units.mib, (1024,), "1.0 GiB"),
    (units.mib, (1536,), "1.5 GiB"),
    (units.mib, (10188,), "9.9 GiB"),
    (units.mib, (10230,), "10 GiB"),  # 9.99 GiB: never "10.0"
    (units.mib, (10240,), "10 GiB"),
    (units.mib, (81559,), "80 GiB"),
    (units.mib, (float("nan"),), NA),
    (units.mem, (4096, 81920), "4.0/80 GiB"),
    (units.mem, (621, 81559), "0.6/80 GiB"),
    (units.mem, (0, 24576), "0.0/24 GiB"),
    (units.mem, (1024, 24576), "1.0/24 GiB"),
    (units.mem, (300, 512), "300/512 MiB"),
    (units.mem, (None, 81920), NA),
    (units.mem, (None, None), NA),
    (units.mem, (2048, None), "2.0 GiB"),
    # temperature, power, percent
    (units.temp, (None,), NA),
    (units.temp, (0,), "0°C"),
    (units.temp, (36,), "36°C"),
    (units.temp, (36.6,), "37°C"),
    (units.watts, (None,), NA),
    (units.watts, (0,), "0 W"),
    (units.watts, (57.3,), "57 W"),
    (units.power, (57.3, 400), "57/400 W"),
    (units.power, (0, 700), "0/700 W"),
    (units.power, (None, 400), NA),
    (units.power, (57, None), "57 W"),
    (units.pct, (None,), NA),
    (units.pct, (0,), "0%"),
    (units.pct, (25.4,), "25%"),
    (units.pct, (100,), "100%"),
    (units.pct, (True,), NA),
    # money: $ with enough digits that a small amount is never rounded up to a cent
    (units.money, (None,), NA),
    (units.money, (0,), "$0.00"),
    (units.money, (0.005,), "$0.0050"),
    (units.money, (0.0034,), "$0.0034"),
    (units.money, (0.00012,), "$0.00012"),
    (units.money, (0.0099,), "$0.0099"),
    (units.money, (0.01,), "$0.0100"),
    (units.money, (0.2042,), "$0.2042"),
    (units.money, (0.99999,), "$1.00"),
    (units.money, (1,), "$1.00"),
    (units.money, (12.344,), "$12.34"),
    (units.money, (1234.5,), "$1,234.50"),
    (units.money, (-1.2,), "-$1.20"),
    (units.money, (float("inf"),), NA),
    (units.per_hour, (None,), NA),
    (units.per_hour, (0.2042,), "$0.2042/h"),
    (units.per_hour, (32.7726,), "$32.77/h"),
    # rates and counts
    (units.rate, (None,), NA),
    (units.rate, (0,), "0.0/s"),
    (units.rate, (5.24,), "5.2/s"),
    (units.rate, (9.96,), "10/s"),
    (units.rate, (458,), "458/s"),
    (units.rate, (999.4,), "999/s"),
    (units.rate, (999.6,), "1.0k/s"),
    (units.rate, (1419,), "1.4k/s"),
    (units.rate, (140_000,), "140k/s"),
    (units.rate, (999_600,), "1.0M/s"),
    (units.rate, (2_151_383,), "2.2M/s"),
    (units.count, (None,), NA),
    (units.count, (0,), "0"),
    (units.count, (999,), "999"),
    (units.count, (60000,), "60,000"),
    (units.count, (1234567.6,), "1,234,568"),
    # sizes of files
    (units.size, (None,), NA),
    (units.size, (0,), "0 B"),
    (units.size, (1023,), "1023 B"),
    (units.size, (1024,), "1 KiB"),
    (units.size, (60_000,), "59 KiB"),
    (units.size, (1_048_000,), "1023 KiB"),
    (units.size, (1_048_576,), "1 MiB"),
    (units.size, (1_610_612_736,), "1.5 GiB"),
    # durations
    (units.duration, (None,), NA),
    (units.duration, (0,), "0s"),
    (units.duration, (-3,), "0s"),
    (units.duration, (59.9,), "59s"),
    (units.duration, (60,), "1m00s"),
    (units.duration, (126,), "2m06s"),
    (units.duration, (3599,), "59m59s"),
    (units.duration, (3600,), "1h00m"),
    (units.duration, (7380,), "2h03m"),
    (units.duration, (86400,), "1d00h"),
    (units.duration, (273600,), "3d04h"),
]


@pytest.mark.parametrize(("func", "args", "expected"), CASES, ids=[f"{f.__name__}{a}" for f, a, _ in CASES])
def test_format(func, args, expected) -> None:
    assert func(*args) == expected


@pytest.mark.parametrize("name", ["mem", "mib", "size", "temp", "power", "watts", "pct", "money", "per_hour", "rate", "count",
                                  "duration"])
def test_every_function_reads_none_and_nan_as_na(name: str) -> None:
    func = getattr(units, name)
    arity = 2 if name in ("mem", "power") else 1
    assert func(*[None] * arity) == NA == "n/a"
    assert func(*[math.nan] * arity) == NA


def test_run_progress_shows_samples_per_second_in_units(capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`gputui run`'s progress line: "140k samples/s", not "140,000 samples/s" or "1419/s"."""
    from gputui.views.progress import ProgressView

    monkeypatch.setenv("COLUMNS", "200")
    view = ProgressView()
    view.show({"event": "start", "run_id": "r", "model": "fast", "device": "cuda", "strategy": "single",
               "world_size": 1, "epochs": 2, "total_steps": 936})
    view.show({"event": "step", "epoch": 1, "step": 468, "loss": 0.25, "samples_per_s": 140_000.0, "elapsed_s": 1.0})
    view.close()
    err = capsys.readouterr().err
    assert "140k samples/s" in err, err


@pytest.mark.parametrize("fn, args, expected", [
    (units.money, (1.123, 4), "$1.1230"),  # a price in the cloud tables: four decimals from $1
    (units.money, (0.005, 4), "$0.0050"),  # below $1 the small-amount rule still holds
    (units.money, (0.2, 2, True), "$0.20"),  # fixed: a rough figure in a sentence
    (units.money, (0.05, 2, True), "$0.05"),
    (units.per_hour, (1.123, 4), "$1.1230/h"),
    (units.per_hour, (0.2, 2, True), "$0.20/h"),
    (units.per_hour, (None, 4), NA),
    (units.duration, (42, "clock"), "42s"),  # a process's age, as ps shows it
    (units.duration, (187, "clock"), "3:07"),
    (units.duration, (18187, "clock"), "5:03:07"),
    (units.duration, (190800, "clock"), "2d 05h"),
    (units.duration, (2, "words"), "2 s"),  # in a sentence: "cleared after 2 s"
    (units.duration, (119, "words"), "119 s"),
    (units.duration, (300, "words"), "5 min"),
    (units.duration, (None, "words"), NA),
])
def test_the_named_variants_of_money_and_duration(fn: Any, args: tuple[Any, ...], expected: str) -> None:
    assert fn(*args) == expected
