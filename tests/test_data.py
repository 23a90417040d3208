"""IDX parsing and every bad-data case: each is a one-line UserError (exit 2)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import numpy as np
import pytest

from gputui.model.errors import UserError
from gputui.model.paths import bundled_mnist
from gputui.train import data as data_mod
from gputui.train.data import STEMS, load_dataset, parse_idx

from .conftest import make_dataset, write_idx


def test_bundled_mnist_loads_and_is_md5_checked() -> None:
    ds = load_dataset()
    assert ds.train_images.shape == (60000, 28, 28)
    assert ds.test_images.shape == (10000, 28, 28)
    assert ds.train_labels.dtype == np.int64
    assert ds.num_classes == 10
    assert ds.source == "bundled MNIST"
    assert ds.train_images.flags.writeable


def test_plain_and_gzipped_files_read_the_same(tmp_path: Path) -> None:
    gz = load_dataset(make_dataset(tmp_path / "gz", 100, 50, gz=True))
    raw = load_dataset(make_dataset(tmp_path / "raw", 100, 50, gz=False))
    assert np.array_equal(gz.train_images, raw.train_images)
    assert np.array_equal(gz.test_labels, raw.test_labels)
    assert gz.train_images.shape == (100, 28, 28)


def test_dotted_names_are_accepted(tmp_path: Path) -> None:
    src = make_dataset(tmp_path / "src", 20, 10, gz=False)
    dst = tmp_path / "dotted"
    dst.mkdir()
    for stem in STEMS.values():
        shutil.copy(src / stem, dst / stem.replace("-idx", ".idx"))
    assert len(load_dataset(dst).train_images) == 20


def test_any_number_of_classes_and_image_size(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    d = tmp_path / "three"
    d.mkdir()
    write_idx(d / "train-images-idx3-ubyte", rng.integers(0, 255, (30, 20, 20)))
    write_idx(d / "train-labels-idx1-ubyte", rng.integers(0, 3, 30))
    write_idx(d / "t10k-images-idx3-ubyte", rng.integers(0, 255, (9, 20, 20)))
    write_idx(d / "t10k-labels-idx1-ubyte", np.array([0, 1, 2] * 3))
    ds = load_dataset(d)
    assert ds.num_classes == 3
    assert ds.image_shape == (20, 20)


def test_parse_idx_header() -> None:
    raw = bytes([0, 0, 8, 1]) + (3).to_bytes(4, "big") + bytes([7, 8, 9])
    assert parse_idx(raw, Path("x"), 2049).tolist() == [7, 8, 9]


@pytest.mark.parametrize(
    "raw, message",
    [
        (b"\x00\x00", "truncated"),
        (bytes([0, 0, 8, 1]) + b"\x00\x00", "truncated inside the IDX header"),
        (bytes([0, 0, 8, 1]) + (5).to_bytes(4, "big") + b"\x01\x02", "truncated: 10 bytes, the header announces 13"),
        (bytes([0, 0, 8, 1]) + (1).to_bytes(4, "big") + b"\x01\x02", "1 unexpected bytes"),
        (bytes([0, 0, 8, 3]) + (1).to_bytes(4, "big") * 3 + b"\x01", "wrong magic number 2051"),
    ],
)
def test_bad_idx_bytes(raw: bytes, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_idx(raw, Path("labels"), 2049)


def test_missing_file(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10)
    (d / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(UserError, match="missing t10k-labels-idx1-ubyte"):
        load_dataset(d)


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no such data directory"):
        load_dataset(tmp_path / "nope")


def test_images_swapped_with_labels_is_wrong_magic(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10)
    shutil.copy(d / "train-labels-idx1-ubyte.gz", d / "train-images-idx3-ubyte.gz")
    with pytest.raises(UserError, match="wrong magic number 2049 .expected 2051"):
        load_dataset(d)


def test_truncated_gzip_file(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10)
    path = d / "train-images-idx3-ubyte.gz"
    path.write_bytes(path.read_bytes()[:-30])
    with pytest.raises(UserError, match="broken gzip data"):
        load_dataset(d)


def test_truncated_raw_file(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10, gz=False)
    path = d / "t10k-images-idx3-ubyte"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(UserError, match="truncated"):
        load_dataset(d)


def test_count_mismatch(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10)
    write_idx(d / "train-labels-idx1-ubyte", np.zeros(19, dtype=np.uint8))
    with pytest.raises(UserError, match="20 images but 19 labels"):
        load_dataset(d)


def test_single_class_is_refused(tmp_path: Path) -> None:
    d = make_dataset(tmp_path / "d", 20, 10)
    write_idx(d / "train-labels-idx1-ubyte", np.zeros(20, dtype=np.uint8))
    write_idx(d / "t10k-labels-idx1-ubyte", np.zeros(10, dtype=np.uint8))
    with pytest.raises(UserError, match="single class"):
        load_dataset(d)


def test_bundled_copy_with_wrong_md5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    copy = tmp_path / "mnist"
    shutil.copytree(bundled_mnist(), copy)
    labels = copy / "t10k-labels-idx1-ubyte.gz"
    raw = bytearray(gzip.decompress(labels.read_bytes()))
    raw[100] = (raw[100] + 1) % 10  # one label changed: still a valid IDX file
    labels.chmod(0o644)
    labels.write_bytes(gzip.compress(bytes(raw)))
    monkeypatch.setattr(data_mod, "bundled_mnist", lambda: copy)
    with pytest.raises(UserError, match="does not match MNIST's 27ae3e4e09519cfbb04c329615203637"):
        load_dataset()


def test_bundled_copy_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(data_mod, "bundled_mnist", lambda: tmp_path / "absent")
    with pytest.raises(UserError, match="pass --data DIR"):
        load_dataset()
