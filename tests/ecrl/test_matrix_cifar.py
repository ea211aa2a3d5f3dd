"""The CIFAR-format data sets `ecrl matrix` writes load through the runtime's real CIFAR path."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest

from ecrl.apps.matrix._cifar import cifar_folder, write_cifar


@pytest.mark.parametrize(("kind", "classes"), [("cifar10", 10), ("cifar100", 100)])
def test_written_sets_load_as_cifar(tmp_path: Path, kind: str, classes: int) -> None:
    from ecrl.runtime.trainer.datasets import build_dataset

    root = write_cifar(tmp_path / kind, kind, 123)  # 123: uneven CIFAR-10 batches
    data = build_dataset(kind, data_dir=root, size=None)
    assert len(data) == 123 and data.num_classes == classes
    x, y = data.batch(np.array([0, 1, 122]))
    assert tuple(x.shape) == (3, 3, 32, 32)
    assert y.tolist() == [0, 1, 122 % classes]


def test_the_same_size_gives_the_same_bytes_and_is_reused(tmp_path: Path) -> None:
    a = write_cifar(tmp_path / "a", "cifar10", 50)
    b = write_cifar(tmp_path / "b", "cifar10", 50)
    for name in ("data_batch_1", "data_batch_5", "test_batch", "batches.meta"):
        assert (a / cifar_folder("cifar10") / name).read_bytes() == \
            (b / cifar_folder("cifar10") / name).read_bytes()
    stamp = (a / cifar_folder("cifar10") / "data_batch_1").stat().st_mtime_ns
    write_cifar(tmp_path / "a", "cifar10", 50)
    assert (a / cifar_folder("cifar10") / "data_batch_1").stat().st_mtime_ns == stamp
    write_cifar(tmp_path / "a", "cifar10", 60)  # another size replaces it
    with open(a / cifar_folder("cifar10") / "data_batch_1", "rb") as handle:
        assert len(pickle.load(handle, encoding="latin1")["labels"]) == 12
