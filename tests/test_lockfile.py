"""gputui.model.lockfile: one holder at a time, a private file, and a refusal that names the holder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gputui.model.lockfile import exclusive


def test_a_second_taker_is_refused_and_told_the_holders_pid(tmp_path: Path) -> None:
    path = tmp_path / "locks" / "s.lock"
    with exclusive(path) as first:
        with exclusive(path) as second:  # another open file description: refused, in one process too
            assert first.mine and not second.mine and second.holder == os.getpid()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    with exclusive(path) as again:
        assert again.mine
