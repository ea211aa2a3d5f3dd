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


class _Plant:
    """Unpickled, it creates ``marker``: what a hostile data file could do instead."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, ...]:
        return (open, (str(self.marker), "w"))


@pytest.mark.parametrize("poisoned", ["data_batch_3", "batches.meta"])
def test_a_cifar_file_that_would_run_code_is_refused_and_runs_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], poisoned: str) -> None:
    import pickle

    from ecrl.apps.cli import main

    data = tmp_path / "data"
    write_cifar10(data)
    marker = tmp_path / "marker"
    path = data / "cifar-10-batches-py" / poisoned
    with open(path, "wb") as handle:
        pickle.dump({"data": _Plant(marker), "labels": [], "label_names": _Plant(marker)},
                    handle, protocol=2)
    with pytest.raises(ConfigError, match=r"io\.open") as info:
        build_dataset("cifar10", data_dir=data, size=None)
    assert "\n" not in str(info.value) and poisoned in str(info.value)
    assert not marker.exists()
    # ecrl run reads the data set before it creates anything or launches a rank
    out = tmp_path / "run"
    assert main(["run", "--dataset", "cifar10", "--data-dir", str(data), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is not a CIFAR batch" in err and "io.open" in err
    assert not marker.exists() and not out.exists()


def test_cifar_pickles_spelled_by_numpy_1_and_by_other_protocols_load(tmp_path: Path) -> None:
    import pickle

    # The published files name numpy.core.multiarray (numpy 1); numpy 2 writes numpy._core.
    write_cifar10(tmp_path)
    base = tmp_path / "cifar-10-batches-py"
    first = base / "data_batch_1"
    first.write_bytes(first.read_bytes().replace(b"numpy._core.multiarray",
                                                 b"numpy.core.multiarray"))
    for protocol, name in ((4, "data_batch_2"), (5, "data_batch_3")):
        entry = pickle.loads((base / name).read_bytes())
        (base / name).write_bytes(pickle.dumps(entry, protocol=protocol))
    ds = build_dataset("cifar10", data_dir=tmp_path, size=None)
    assert len(ds) == 40 and np.array_equal(ds.data[0].transpose(2, 0, 1).reshape(-1), pixels(0))
    assert np.array_equal(ds.data[20].transpose(2, 0, 1).reshape(-1), pixels(20))
