"""Security invariants that hold for the whole package: nothing unpickles bytes that crossed
a network, and a checkpoint (it may come from a slave) is bounded and checked before use."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from gputui.model.errors import UserError
from gputui.train import checkpoint, nets

from .conftest import REPO

# Collectives that pickle (all_gather_object & co.), raw unpicklers, and torch.load without weights_only.
RISKY = re.compile(r"\b(all_gather_object|gather_object|broadcast_object_list|scatter_object_list|"
                   r"send_object_list|recv_object_list)\s*\(|\bpickle\.loads?\s*\(|\bmarshal\.loads?\s*\(")


def test_no_pickle_crosses_the_network() -> None:
    found = []
    for path in sorted((REPO / "gputui").rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RISKY.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
            if "torch.load(" in line and "weights_only=True" not in line:
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert found == []


def test_the_grep_sees_a_pickling_collective() -> None:
    assert RISKY.search("    tdist.all_gather_object(gathered, (mine, restart))")
    assert RISKY.search("x = pickle.loads(data)")
    assert not RISKY.search("tdist.all_gather(gathered, tensor)")


def full_state(step: int = 8) -> dict[str, object]:
    """What a trainer of the seed network checkpoints (structure only: the weights are fresh)."""
    torch.manual_seed(0)
    model = nets.build("seed", (28, 28), 10)
    return {"model": model.state_dict(), "optimizer": {}, "epoch": 1, "batch": 0, "step": step, "steps_per_epoch": 8,
            "elapsed_s": 1.0, "eval_s": 0.1, "best_acc": 90.0, "last_acc": 90.0, "epoch_loss_sum": 0.0,
            "epoch_loss_count": 0, "num_classes": 10, "torch_rng": torch.get_rng_state()}


def shapes() -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in nets.build("seed", (28, 28), 10).state_dict().items()}


def test_a_good_checkpoint_loads_with_its_shapes(tmp_path: Path) -> None:
    checkpoint.save(tmp_path / "ckpt.pt", full_state())
    assert checkpoint.load(tmp_path / "ckpt.pt", shapes())["step"] == 8


def test_an_oversized_checkpoint_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint.save(tmp_path / "ckpt.pt", full_state())
    monkeypatch.setattr(checkpoint, "MAX_BYTES", (tmp_path / "ckpt.pt").stat().st_size - 1)
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("read an oversized file"))
    with pytest.raises(UserError, match="too large for a gputui checkpoint"):
        checkpoint.load(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("damage, words", [
    (lambda s: s.pop("optimizer"), "missing optimizer"),
    (lambda s: s.__setitem__("model", {"w": [1, 2]}), "its model is not a set of tensors"),
    (lambda s: s.__setitem__("step", -3), "its step is not a whole number"),
    (lambda s: s["model"].pop("fc2.bias"), "its model has other layers (fc2.bias)"),
    (lambda s: s["model"].__setitem__("fc2.bias", torch.zeros(11)), "fc2.bias is (11,), expected (10,)"),
])
def test_a_foreign_checkpoint_is_one_clear_error(tmp_path: Path, damage: object, words: str) -> None:
    state = full_state()
    damage(state)  # type: ignore[operator]
    checkpoint.save(tmp_path / "ckpt.pt", state)
    with pytest.raises(UserError) as info:
        checkpoint.load(tmp_path / "ckpt.pt", shapes())
    assert words in str(info.value) and "start a new run" in str(info.value)


def test_any_damaged_bytes_are_one_clear_error(tmp_path: Path) -> None:
    import random

    checkpoint.save(tmp_path / "good.pt", full_state())
    good = (tmp_path / "good.pt").read_bytes()
    rng = random.Random(1234)
    path = tmp_path / "ckpt.pt"
    for i in range(400):  # random bytes, and a real checkpoint with random bytes flipped or cut
        if i % 2:
            path.write_bytes(rng.randbytes(rng.randint(0, 4096)))
        else:
            data = bytearray(good)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            path.write_bytes(bytes(data[: rng.randint(1, len(data))]))
        try:
            checkpoint.load(path, shapes())
        except UserError as exc:
            assert "checkpoint" in str(exc)


# -- remote shell commands: every interpolated value goes through one quoting helper -------
QUOTERS = {"sh", "quote_path", "shlex.quote"}
SHELL_CALLS = {"check", "open", "exec_command"}  # SlaveConnection.check/open, paramiko's exec_command
SHELL_NAMES = {"script", "command"}


def _name(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_name(node.value)}.{node.attr}"
    return ""


def _unquoted(expr: ast.AST) -> list[str]:
    """Interpolations in the f-strings of `expr` that no quoting helper wraps."""
    bad = []
    for node in ast.walk(expr):
        if isinstance(node, ast.JoinedStr):
            for value in node.values:
                if isinstance(value, ast.FormattedValue):
                    inner = value.value
                    if not (isinstance(inner, ast.Call) and _name(inner.func) in QUOTERS):
                        bad.append(ast.unparse(inner))
    return bad


def unquoted_shell_values(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in SHELL_CALLS \
                and node.args:
            found += _unquoted(node.args[0])
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in SHELL_NAMES for t in node.targets):
            found += _unquoted(node.value)
    return found


def test_remote_commands_quote_every_value() -> None:
    found = []
    for path in [*sorted((REPO / "gputui" / "cluster").glob("*.py")), REPO / "gputui" / "sources" / "ssh.py",
                 REPO / "gputui" / "cloud" / "remote.py"]:
        found += [f"{path.relative_to(REPO)}: {{{v}}}" for v in unquoted_shell_values(path.read_text(encoding="utf-8"))]
    assert found == []


def test_the_quoting_check_sees_hand_made_quotes() -> None:
    assert unquoted_shell_values("conn.check(f\"mkdir -p '{run_dir}'\")") == ["run_dir"]
    assert unquoted_shell_values("command = f'cd {cwd} && ' + sh(x)") == ["cwd"]
    assert unquoted_shell_values("conn.check(f'mkdir -p {sh(run_dir)} {quote_path(d)}')") == []


def test_a_hostile_remote_dir_stays_one_word(tmp_path: Path) -> None:
    import subprocess

    from gputui.cluster.sshnode import quote_path, sh

    evil = f"{tmp_path}/x';touch {tmp_path}/pwned;'"
    subprocess.run(["sh", "-c", f"mkdir -p {quote_path(evil)} && cd {sh(evil)}"], check=True)
    assert not (tmp_path / "pwned").exists() and Path(evil).is_dir()


def test_ssh_user_cannot_become_an_ssh_option(tmp_path: Path) -> None:
    from gputui.cloud.remote import ssh_command
    from gputui.cloud.settings import load_cloud_settings

    profile = tmp_path / "p.toml"
    profile.write_text('[cloud]\nbudget_usd = 1.0\nssh_user = "-oProxyCommand=touch /tmp/x"\n')
    with pytest.raises(UserError, match=r"p.toml:3: \[cloud\] ssh_user: expected a user name"):
        load_cloud_settings(profile)
    command = ssh_command("ubuntu", "203.0.113.9", known_hosts=[tmp_path / "k"])
    assert command[-5:-1] == ["-l", "ubuntu", "--", "203.0.113.9"]
