"""Where gputui keeps its files: data, cache and log homes, and the one-time move out of the data home."""

from __future__ import annotations

from pathlib import Path

import platformdirs
import pytest

from gputui.model import paths
from gputui.cloud import guardian, pricing
from gputui.cluster import wheel

from .test_cloud_budget import make_context


def fake_platformdirs(monkeypatch: pytest.MonkeyPatch, root: Path) -> None:
    monkeypatch.delenv("GPUTUI_HOME", raising=False)
    for kind in ("data", "cache", "log"):
        monkeypatch.setattr(platformdirs, f"user_{kind}_dir",
                            lambda app, appauthor=None, _k=kind: str(root / _k / app))


def test_without_gputui_home_each_home_is_platformdirs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_platformdirs(monkeypatch, tmp_path)
    assert paths.data_home() == tmp_path / "data" / "gputui"
    assert paths.cache_home() == tmp_path / "cache" / "gputui"
    assert paths.log_home() == tmp_path / "log" / "gputui"
    assert pricing.cache_home() == paths.cache_home()


def test_gputui_home_holds_cache_and_logs_too(gputui_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for kind in ("data", "cache", "log"):  # GPUTUI_HOME wins: platformdirs is not asked
        monkeypatch.setattr(platformdirs, f"user_{kind}_dir", lambda *a, **k: str(tmp_path / "elsewhere"))
    assert paths.data_home() == gputui_home
    assert paths.cache_home() == gputui_home / "cache"
    assert paths.log_home() == gputui_home / "logs"
    assert pricing.price_cache_path() == gputui_home / "cache" / "on-demand-prices.json"


def test_guard_logs_move_from_the_data_home_on_first_use(gputui_home: Path, tmp_path: Path) -> None:
    ctx, _ = make_context(tmp_path, 5.0)
    old = gputui_home / "guards"
    old.mkdir(parents=True)
    (old / "sim-us-east-1-c1.log").write_text("guarding cluster c1\n")
    (old / "sim-us-east-1-c1.lock").write_text("123")
    (old / "aws-eu-west-1-other.log").write_text("another cluster\n")
    log = guardian.log_path(ctx)
    assert log == gputui_home / "logs" / "guards" / "sim-us-east-1-c1.log"
    assert log.read_text() == "guarding cluster c1\n"
    assert (log.parent / "aws-eu-west-1-other.log").read_text() == "another cluster\n"
    assert (log.parent / "sim-us-east-1-c1.lock").is_file()
    assert not old.exists()
    with guardian.exclusive(ctx) as free:  # the moved lock file still works
        assert free and (log.parent / "sim-us-east-1-c1.lock").read_text().isdigit()
    ctx.ledger.close()


def test_the_wheel_cache_moves_to_the_cache_home_and_is_used_there(gputui_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUTUI_WHEEL", raising=False)
    digest = wheel.source_hash()
    old = gputui_home / "wheels" / digest / "gputui-0.1.0-py3-none-any.whl"
    old.parent.mkdir(parents=True)
    old.write_bytes(b"cached")
    found = wheel.build_wheel()  # found in the cache: nothing is built
    assert found.path == gputui_home / "cache" / "wheels" / digest / old.name
    assert found.path.read_bytes() == b"cached" and found.source_hash == digest
    assert not (gputui_home / "wheels").exists()


def test_a_move_that_cannot_happen_leaves_the_files_and_raises_nothing(tmp_path: Path) -> None:
    old, new = tmp_path / "old", tmp_path / "new"
    old.mkdir()
    (old / "a.log").write_text("old a")
    (old / "b.log").write_text("old b")
    new.mkdir()
    (new / "a.log").write_text("new a")  # already there: the new one is kept, the old one left
    assert paths.moved_once(old, new) == new
    assert (new / "a.log").read_text() == "new a" and (new / "b.log").read_text() == "old b"
    assert (old / "a.log").read_text() == "old a"
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    assert paths.moved_once(old, blocked / "new") == blocked / "new"  # cannot create it: no error
    assert (old / "a.log").read_text() == "old a"
