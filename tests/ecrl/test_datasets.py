"""Data sets yield (x, y, sample_id); batches by ID equal the items; real on-disk formats."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from dataset_files import pixels, write_cifar10, write_cifar100, write_image_folder

from ecrl.contract.errors import ConfigError
from ecrl.runtime.trainer.datasets import (
    CifarDataset,
    GeneratedDataset,
    ImageFolderDataset,
    build_dataset,
    check_data_dir,
)


def _batch_equals_items(source: object, ids: list[int]) -> None:
    x, y = source.batch(np.array(ids, dtype=np.int64))  # type: ignore[attr-defined]
    for row, i in enumerate(ids):
        xi, yi, sid = source[i]  # type: ignore[index]
        assert sid == i and yi == int(y[row])
        assert torch.equal(xi, x[row]), f"sample {i}: batch and item differ"


def test_generated_samples_depend_on_the_id_alone() -> None:
    a, b = GeneratedDataset(size=1000), GeneratedDataset(size=50_000)
    ids = np.array([0, 5, 999, 5], dtype=np.int64)
    xa, ya = a.batch(ids)
    xb, yb = b.batch(ids)
    assert torch.equal(xa, xb) and torch.equal(ya, yb)  # D does not change sample i
    assert torch.equal(xa[1], xa[3]) and not torch.equal(xa[0], xa[1])
    assert xa.shape == (4, 3, 32, 32) and xa.dtype == torch.float32
    labels = a.labels(np.arange(1000, dtype=np.int64))
    assert set(np.bincount(labels, minlength=10)) and labels.min() >= 0 and labels.max() < 10
    assert np.bincount(labels).min() > 50  # every class is well represented
    _batch_equals_items(a, [3, 1, 4, 1, 5])
    with pytest.raises(IndexError):
        a[1000]


@pytest.mark.parametrize(("name", "writer", "size", "classes"), [
    ("cifar10", write_cifar10, 40, 10), ("cifar100", write_cifar100, 48, 100)])
def test_cifar_through_torchvision(tmp_path: Path, name: str, writer: object, size: int,
                                   classes: int) -> None:
    assert writer(tmp_path) == size  # type: ignore[operator]
    ds = build_dataset(name, data_dir=tmp_path, size=None)
    assert isinstance(ds, CifarDataset) and len(ds) == size and ds.num_classes == classes
    # sample ID i is the i-th training image, in the file's channel-plane layout
    raw = ds.data[13].transpose(2, 0, 1).reshape(-1)
    assert np.array_equal(raw, pixels(13))
    assert ds[13][1] == 13 % classes
    _batch_equals_items(ds, [0, 13, size - 1, 7])
    # the data set's own folder works as --data-dir as well
    folder = next(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(build_dataset(name, data_dir=folder, size=None)) == size


def test_image_folder(tmp_path: Path) -> None:
    assert write_image_folder(tmp_path) == 12
    ds = build_dataset("imagefolder", data_dir=tmp_path, size=None, image_size=16)
    assert isinstance(ds, ImageFolderDataset) and len(ds) == 12 and ds.num_classes == 3
    x, y, sid = ds[5]
    assert x.shape == (3, 16, 16) and y == 1 and sid == 5  # class1 holds images 4..7
    _batch_equals_items(ds, [0, 11, 5])


def test_missing_or_wrong_data_dirs_are_one_line(tmp_path: Path) -> None:
    cases = [("cifar10", None, "needs --data-dir"), ("cifar10", tmp_path / "x", "no such"),
             ("cifar100", tmp_path, "missing train, test, meta"),
             ("imagefolder", tmp_path, "one subfolder per class")]
    for name, path, message in cases:
        with pytest.raises(ConfigError, match=message) as info:
            check_data_dir(name, path)
        assert "\n" not in str(info.value)
    check_data_dir("fake", None)
