"""Checkpoints: written atomically (temp file, fsync, rename), read with weights_only=True."""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import torch

from gputui.model.errors import GputuiError, UserError
from gputui.runs.store import MAX_CHECKPOINT
from gputui.model.paths import private_opener

CHECKPOINT = "ckpt.pt"
FORMAT = 1
# A file far larger than any checkpoint of ours is refused before it is read (it may come from a
# slave: a remote answer is data); the same bound caps the copy from a slave or a sweep host.
MAX_BYTES = MAX_CHECKPOINT
KEYS = ("model", "optimizer", "epoch", "batch", "step", "steps_per_epoch", "elapsed_s", "eval_s", "best_acc",
        "last_acc", "epoch_loss_sum", "epoch_loss_count", "num_classes", "torch_rng")


def save(path: Path, state: dict[str, Any]) -> None:
    """Write `state` to `path` so that a crash leaves either the old or the new file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb", opener=private_opener) as fh:  # 0600 (the CLI's umask does it too)
            torch.save({"format": FORMAT, **state}, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
        _fsync_dir(path.parent)
    except (OSError, RuntimeError) as exc:
        # torch.save's zip writer turns a refused write (full disk, quota, file-size limit) into a
        # RuntimeError ("unexpected pos ...") with the OSError only as its context.
        cause = exc if isinstance(exc, OSError) else exc.__context__
        if not isinstance(cause, OSError):
            raise
        tmp.unlink(missing_ok=True)
        raise GputuiError(
            f"cannot write checkpoint {path}: {cause.strerror or cause}; free space or fix permissions, "
            "then resume from the previous checkpoint"
        ) from None


def load(path: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Read a checkpoint safely (no arbitrary pickles, bounded size, gputui's keys, and the
    model's tensor shapes when `shapes` is given); a damaged or foreign file is a UserError."""
    if not path.is_file():
        raise UserError(f"{path}: no checkpoint here (the run stopped before its first one?)")
    size = path.stat().st_size
    if size > MAX_BYTES:
        raise UserError(f"{path}: {size} bytes is too large for a gputui checkpoint (at most {MAX_BYTES}); "
                        "start a new run")
    try:
        with warnings.catch_warnings():  # e.g. "Detected pickle protocol 187": noise about a broken file
            warnings.simplefilter("ignore")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - damaged bytes raise anything from the unpickler (IndexError, KeyError...)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"{path}: corrupt checkpoint ({first[:160]}); start a new run") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"{path}: not a gputui checkpoint (format {FORMAT}); start a new run")
    problem = _problem(state, shapes)
    if problem:
        raise UserError(f"{path}: not a usable gputui checkpoint ({problem}); start a new run")
    return state


def _problem(state: dict[str, Any], shapes: dict[str, tuple[int, ...]] | None) -> str | None:
    """What is wrong with a loaded checkpoint's structure, or None."""
    missing = [k for k in KEYS if k not in state]
    if missing:
        return f"missing {', '.join(missing)}"
    model = state["model"]
    if not isinstance(model, dict) or not all(isinstance(v, torch.Tensor) for v in model.values()):
        return "its model is not a set of tensors"
    if not isinstance(state["step"], int) or state["step"] < 0:
        return "its step is not a whole number >= 0"
    if shapes is not None:
        if set(model) != set(shapes):
            return f"its model has other layers ({', '.join(sorted(set(model) ^ set(shapes))[:4])})"
        for name, shape in shapes.items():
            if tuple(model[name].shape) != tuple(shape):
                return f"{name} is {tuple(model[name].shape)}, expected {tuple(shape)}"
    return None


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
