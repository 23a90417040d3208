"""MNIST-format datasets: the four IDX files, gzipped or not, read with numpy.

IDX layout (big-endian): two zero bytes, a type byte (0x08 = unsigned byte), the
number of dimensions, one 32-bit size per dimension, then the data. Images have
3 dimensions (count, rows, cols), labels 1 (count). Any number of classes works.
This module does not import torch.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gputui.model.errors import UserError
from gputui.model.paths import bundled_mnist

# Role -> file stem; a file may be named STEM, STEM.gz, or with '.' before 'idx'.
STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
# md5 of the uncompressed canonical files (the sums torchvision checks).
MNIST_MD5 = {
    "train_images": "6bbc9ace898e44ae57da46a324031adb",
    "train_labels": "a25bea736e30d166cdddb491f175f624",
    "test_images": "2646ac647ad5339dbf082846283269ea",
    "test_labels": "27ae3e4e09519cfbb04c329615203637",
}
IMAGE_MAGIC = 2051
LABEL_MAGIC = 2049


@dataclass(frozen=True)
class Dataset:
    """A decoded dataset: uint8 images (N, rows, cols) and int64 labels (N,)."""

    source: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int

    @property
    def image_shape(self) -> tuple[int, int]:
        return (int(self.train_images.shape[1]), int(self.train_images.shape[2]))


def find_file(directory: Path, role: str) -> Path:
    """The file for `role` in `directory`, under any of its accepted names."""
    stem = STEMS[role]
    dotted = stem.replace("-idx", ".idx")
    for name in (stem + ".gz", stem, dotted + ".gz", dotted):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    raise UserError(
        f"{directory}: missing {stem}[.gz]: a data directory needs the four IDX files "
        f"({', '.join(STEMS.values())}), gzipped or not"
    )


def read_bytes(path: Path) -> bytes:
    """The file's content, gunzipped when it is gzip (by its magic, not its name)."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            return gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(f"{path}: broken gzip data ({exc}); replace the file") from None
    return raw


def parse_idx(raw: bytes, path: Path, magic: int) -> np.ndarray:
    """Decode IDX bytes, checking the magic number and that the length matches."""
    kind = "images" if magic == IMAGE_MAGIC else "labels"
    if len(raw) < 4:
        raise UserError(f"{path}: truncated: {len(raw)} bytes is too short for an IDX {kind} file")
    found = int.from_bytes(raw[:4], "big")
    if found != magic:
        raise UserError(
            f"{path}: wrong magic number {found} (expected {magic} for IDX {kind} of unsigned bytes); "
            "is this the right file?"
        )
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise UserError(f"{path}: truncated inside the IDX header")
    dims = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(dims, dtype=np.int64))
    if len(raw) < expected:
        raise UserError(f"{path}: truncated: {len(raw)} bytes, the header announces {expected}")
    if len(raw) > expected:
        raise UserError(f"{path}: {len(raw) - expected} unexpected bytes after the data")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(dims).copy()


def load_dataset(directory: Path | None = None, verify_md5: bool | None = None) -> Dataset:
    """Load a dataset directory (default: the bundled MNIST, whose md5 sums are checked)."""
    bundled = directory is None
    directory = bundled_mnist() if directory is None else Path(directory).expanduser()
    if bundled and not directory.is_dir():
        raise UserError(
            f"bundled MNIST not found at {directory} (installed without the source tree?): "
            "pass --data DIR with the four MNIST IDX files"
        )
    if not directory.is_dir():
        raise UserError(f"{directory}: no such data directory (--data takes a directory of IDX files)")
    check = bundled if verify_md5 is None else verify_md5
    arrays: dict[str, np.ndarray] = {}
    for role in STEMS:
        path = find_file(directory, role)
        raw = read_bytes(path)
        if check:
            digest = hashlib.md5(raw).hexdigest()
            if digest != MNIST_MD5[role]:
                raise UserError(
                    f"{path}: md5 {digest} does not match MNIST's {MNIST_MD5[role]}: the file is damaged; "
                    "restore it (git checkout assets/mnist) or pass --data DIR"
                )
        magic = IMAGE_MAGIC if role.endswith("images") else LABEL_MAGIC
        array = parse_idx(raw, path, magic)
        ndim = 3 if magic == IMAGE_MAGIC else 1
        if array.ndim != ndim:
            raise UserError(f"{path}: {array.ndim} dimensions, expected {ndim}")
        arrays[role] = array
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if len(images) != len(labels):
            raise UserError(f"{directory}: {split} has {len(images)} images but {len(labels)} labels")
        if len(images) == 0:
            raise UserError(f"{directory}: the {split} split is empty")
    if arrays["train_images"].shape[1:] != arrays["test_images"].shape[1:]:
        raise UserError(f"{directory}: train and test images differ in size")
    num_classes = int(max(arrays["train_labels"].max(), arrays["test_labels"].max())) + 1
    if num_classes < 2:
        raise UserError(f"{directory}: the labels hold a single class; need at least two")
    return Dataset(
        source="bundled MNIST" if bundled else str(directory),
        train_images=arrays["train_images"],
        train_labels=arrays["train_labels"].astype(np.int64),
        test_images=arrays["test_images"],
        test_labels=arrays["test_labels"].astype(np.int64),
        num_classes=num_classes,
    )
