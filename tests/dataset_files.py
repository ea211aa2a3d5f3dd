"""Tiny data sets in the real on-disk formats (CIFAR python pickles, image folders of PNGs).

Pixel values are a function of the sample index, so tests can check that sample ID ``i`` is the
``i``-th image of the training split.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np


def pixels(index: int) -> np.ndarray:
    """The 3072 bytes (R plane, G plane, B plane of 32x32) of training image ``index``."""
    rng = np.random.default_rng(index)
    return rng.integers(0, 256, 3072, dtype=np.uint8)


def _dump(path: Path, obj: object) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)


def write_cifar10(root: Path, *, per_batch: int = 8, test: int = 4) -> int:
    """``root/cifar-10-batches-py/`` with 5 training batches; returns the training size."""
    base = root / "cifar-10-batches-py"
    base.mkdir(parents=True, exist_ok=True)
    for b in range(5):
        idx = range(b * per_batch, (b + 1) * per_batch)
        _dump(base / f"data_batch_{b + 1}", {
            "batch_label": f"training batch {b + 1} of 5",
            "labels": [i % 10 for i in idx],
            "data": np.stack([pixels(i) for i in idx]),
            "filenames": [f"img_{i}.png" for i in idx],
        })
    _dump(base / "test_batch", {"batch_label": "testing batch 1 of 1",
                                "labels": [i % 10 for i in range(test)],
                                "data": np.zeros((test, 3072), np.uint8),
                                "filenames": [f"t_{i}.png" for i in range(test)]})
    _dump(base / "batches.meta", {"label_names": [f"class{i}" for i in range(10)],
                                  "num_cases_per_batch": per_batch, "num_vis": 3072})
    return 5 * per_batch


def write_cifar100(root: Path, *, train: int = 48, test: int = 4) -> int:
    """``root/cifar-100-python/`` (train, test, meta); returns the training size."""
    base = root / "cifar-100-python"
    base.mkdir(parents=True, exist_ok=True)
    for name, n, data in (("train", train, np.stack([pixels(i) for i in range(train)])),
                          ("test", test, np.zeros((test, 3072), np.uint8))):
        _dump(base / name, {"filenames": [f"{name}_{i}.png" for i in range(n)],
                            "batch_label": f"{name} batch", "fine_labels": [i % 100 for i in
                                                                           range(n)],
                            "coarse_labels": [i % 20 for i in range(n)], "data": data})
    _dump(base / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                          "coarse_label_names": [f"coarse{i}" for i in range(20)]})
    return train


def write_image_folder(root: Path, *, classes: int = 3, per_class: int = 4) -> int:
    """``root/classK/NN.png`` of varied sizes; returns the number of images."""
    from PIL import Image

    for c in range(classes):
        folder = root / f"class{c}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            rng = np.random.default_rng(c * 100 + i)
            h, w = 20 + i, 24 + c
            Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(
                folder / f"{i:02d}.png")
    return classes * per_class
