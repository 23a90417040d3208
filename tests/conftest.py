"""Shared fixtures: small MNIST-format datasets cut from the bundled copy, an isolated GPUTUI_HOME."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gputui.train.data import load_dataset

REPO = Path(__file__).resolve().parent.parent


def write_idx(path: Path, array: np.ndarray, gz: bool = True) -> None:
    """Write a uint8 array as an IDX file (magic 0x0000 08 ndim, sizes, data)."""
    header = bytes([0, 0, 8, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    raw = header + np.ascontiguousarray(array, dtype=np.uint8).tobytes()
    if gz:
        path = path.with_name(path.name + ".gz")
        path.write_bytes(gzip.compress(raw, compresslevel=1))
    else:
        path.write_bytes(raw)


def make_dataset(directory: Path, n_train: int, n_test: int, gz: bool = True) -> Path:
    """A slice of the bundled MNIST in IDX form under `directory`."""
    full = load_dataset()
    directory.mkdir(parents=True, exist_ok=True)
    write_idx(directory / "train-images-idx3-ubyte", full.train_images[:n_train], gz)
    write_idx(directory / "train-labels-idx1-ubyte", full.train_labels[:n_train].astype(np.uint8), gz)
    write_idx(directory / "t10k-images-idx3-ubyte", full.test_images[:n_test], gz)
    write_idx(directory / "t10k-labels-idx1-ubyte", full.test_labels[:n_test].astype(np.uint8), gz)
    return directory


@pytest.fixture(scope="session")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """512 training and 256 test images: 8 steps an epoch at batch 64."""
    return make_dataset(tmp_path_factory.mktemp("small"), 512, 256)


@pytest.fixture(scope="session")
def medium_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """4096 training and 1000 test images, for runs that must last a few seconds."""
    return make_dataset(tmp_path_factory.mktemp("medium"), 4096, 1000)


@pytest.fixture(autouse=True)
def gputui_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every test gets its own user data directory."""
    home = tmp_path / "home"
    monkeypatch.setenv("GPUTUI_HOME", str(home))
    return home


def cli_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(extra)
    return env


def run_cli(*args: str, timeout: float = 300, **popen: Any) -> subprocess.CompletedProcess[str]:
    """Run `python -m gputui ARGS` and capture its output."""
    return subprocess.run(
        [sys.executable, "-m", "gputui", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(),
        **popen,
    )


def json_lines(text: str) -> list[dict[str, Any]]:
    """Parse stdout that must hold nothing but JSON lines."""
    return [json.loads(line) for line in text.splitlines()]


@pytest.fixture
def ssh_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A HOME of our own: ~/.ssh/config and ~/.ssh/known_hosts are read from here; no ssh-agent."""
    home = tmp_path / "user"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    return home
