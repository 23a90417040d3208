"""Record polling rounds as JSON lines, and play such a file back as a source.

One line per round, the same document `gputui monitor --json` prints:
`{"version": 1, "time": ..., "hosts": [HostSnapshot.to_dict(), ...]}`.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Sequence

from gputui.model.errors import UserError, read_user_file
from gputui.model.jsonline import compact
from gputui.model import outside
from gputui.model.telemetry import HostSnapshot, round_from_dict, round_to_dict
from gputui.model.text import clean_tree


class Recorder:
    """Appends rounds to a JSON-lines file, flushed after each round."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self._file: IO[str] | None = open(path, "w", encoding="utf-8")
        except OSError as exc:
            raise UserError(f"--record {path}: cannot write: {exc.strerror or exc}") from None

    def write(self, hosts: Sequence[HostSnapshot], time: float) -> None:
        if self._file is None:
            raise ValueError("recorder is closed")
        self._file.write(compact(round_to_dict(hosts, time)) + "\n")
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_rounds(path: Path) -> list[list[HostSnapshot]]:
    """Every round of a recording; errors name the file and the line."""
    lines = read_user_file(path, "recording").splitlines()
    rounds = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            rounds.append(round_from_dict(clean_tree(outside.parse(line, max_chars=len(line)))))  # a file's names are data
        except (ValueError, KeyError, TypeError) as exc:
            raise UserError(f"{path}:{number}: not a gputui telemetry round: {exc}") from None
    if not rounds:
        raise UserError(f"{path}: the recording holds no round")
    return rounds


class ReplaySource:
    """Plays a recording back, one round per poll; then repeats the last (or loops)."""

    def __init__(self, path: Path, loop: bool = False) -> None:
        self.rounds = read_rounds(path)
        self.loop = loop
        self._next = 0

    @property
    def finished(self) -> bool:
        """True once every round has been played (never when looping)."""
        return not self.loop and self._next >= len(self.rounds)

    def poll(self) -> list[HostSnapshot]:
        if self._next >= len(self.rounds):
            if not self.loop:
                return list(self.rounds[-1])
            self._next = 0
        hosts = self.rounds[self._next]
        self._next += 1
        return list(hosts)

    def close(self) -> None:
        pass
