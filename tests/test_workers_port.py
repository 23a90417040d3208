"""The workers' store port (gputui.train.rdzv.workers_port): drawn below the ephemeral range, so
no connection on the machine takes it between the draw and rank 0's bind seconds later."""

from __future__ import annotations

import socket

import pytest

from gputui.train import rdzv


@pytest.mark.parametrize(("text", "expected"), [
    ("32768\t60999\n", (10000, 32768)),
    ("40000 60999", (10000, 40000)),
    ("10500 60999", rdzv.QUIET_PORTS),  # too few ports below it: the default range
    ("", rdzv.QUIET_PORTS),
    ("garbage", rdzv.QUIET_PORTS),
])
def test_the_quiet_ports_end_where_the_ephemeral_range_begins(text: str, expected: tuple[int, int]) -> None:
    assert rdzv.quiet_ports(text) == expected


def test_a_port_is_drawn_from_the_quiet_ports_and_a_taken_one_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    taken = rdzv.listen_socket(rdzv.LOOPBACK, 0)  # someone listens on the first port drawn
    try:
        low, high = rdzv.quiet_ports()
        busy = taken.getsockname()[1]
        free = next(p for p in range(low, high) if _free(p))
        draws = iter([busy, free])
        monkeypatch.setattr("random.randrange", lambda a, b: next(draws))
        assert rdzv.workers_port(rdzv.LOOPBACK) == free
        monkeypatch.setattr("random.randrange", lambda a, b: busy)
        assert rdzv.workers_port(rdzv.LOOPBACK, tries=3) == 0  # none free: torch picks, as before
    finally:
        taken.close()
    low, high = rdzv.quiet_ports()
    monkeypatch.undo()
    port = rdzv.workers_port(rdzv.LOOPBACK)
    assert low <= port < high and _free(port)


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind((rdzv.LOOPBACK, port))
        except OSError:
            return False
    return True
