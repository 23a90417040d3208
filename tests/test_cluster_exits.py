"""How the master reads a node's exit (gputui.cluster.attempts.Attempts._exited), in process: after
an `interrupted` event the group stopping is not a lost node, but a slave whose SSH channel ended
with no exit status at all is (its connection went; seen as a race beside two CPU hogs, where the
master rank's own `interrupted` came before the dropped slave's channel was seen closed)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gputui.cluster.attempts import Attempts
from gputui.cluster.procs import LocalNode, RemoteNode


def attempts_after(last_kind: str) -> tuple[Attempts, list[tuple[str, dict[str, Any]]]]:
    said: list[tuple[str, dict[str, Any]]] = []
    attempts: Any = Attempts.__new__(Attempts)
    attempts.ctx = SimpleNamespace(stops=SimpleNamespace(requested=False),
                                   emit=lambda name, **fields: said.append((name, fields)),
                                   group=SimpleNamespace(stop=lambda: said.append(("group_stop", {}))))
    attempts.relay = SimpleNamespace(last_kind=last_kind, started=True, last_step=7, node_lost=lambda: None)
    attempts.failure = None
    attempts.lost = set()
    return attempts, said


def node(kind: type, name: str = "n0") -> Any:
    proc = kind.__new__(kind)
    proc.tail = ["channel closed"]
    return SimpleNamespace(name=name, proc=proc)


def test_a_slave_whose_channel_ended_without_a_status_is_lost_even_after_interrupted() -> None:
    attempts, said = attempts_after("interrupted")
    attempts._exited(node(RemoteNode), -1)
    assert [name for name, _ in said] == ["node_lost", "group_stop"]
    assert said[0][1]["node"] == "n0" and said[0][1]["step"] == 7 and attempts.lost == {"n0"}


def test_after_interrupted_a_node_that_exits_with_a_status_is_the_group_stopping() -> None:
    for kind, code in ((RemoteNode, 0), (RemoteNode, 143), (LocalNode, -1), (LocalNode, -15)):
        attempts, said = attempts_after("interrupted")
        attempts._exited(node(kind), code)
        assert said == [] and attempts.lost == set(), (kind, code)


def test_after_done_no_exit_is_a_lost_node() -> None:
    attempts, said = attempts_after("done")
    attempts._exited(node(RemoteNode), -1)
    assert said == [] and attempts.lost == set()


def test_while_training_any_exit_is_a_lost_node() -> None:
    attempts, said = attempts_after("step")
    attempts._exited(node(RemoteNode), 0)
    assert [name for name, _ in said] == ["node_lost", "group_stop"]
