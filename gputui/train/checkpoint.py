"""Checkpoints: written atomically (temp file, fsync, rename), read with weights_only=True."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from gputui.errors import GputuiError, UserError

CHECKPOINT = "ckpt.pt"
FORMAT = 1


def save(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as fh:
            torch.save({"format": FORMAT, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise GputuiError(
            f"cannot write checkpoint {path}: {exc.strerror or exc}; free space or fix permissions, "
            "then resume from the previous checkpoint"
        ) from None


def load(path: Path) -> dict[str, Any]:
    """Read a checkpoint safely (no arbitrary pickles); a damaged file is a UserError."""
    if not path.is_file():
        raise UserError(f"{path}: no checkpoint here (the run stopped before its first one?)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: corrupt checkpoint ({first[:160]}); start a new run") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"{path}: not a gputui checkpoint (format {FORMAT}); start a new run")
    return state


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
