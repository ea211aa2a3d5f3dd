"""A small data set in the real CIFAR on-disk format, written by the matrix itself (torch-free).

The runtime reads CIFAR through torchvision's classes over the python-pickle layout and never
downloads anything, so a matrix on a machine without the real data sets still exercises that
path: ``generate = N`` in a ``[datasets.NAME]`` table writes ``N`` training images in the layout
torchvision expects (``cifar-10-batches-py/data_batch_1..5, test_batch, batches.meta`` or
``cifar-100-python/train, test, meta``). Each image is a faint class pattern under uniform noise,
so the models can learn something, and is a function of its index and the class count only, so
the same ``N`` always gives the same bytes.
"""

from __future__ import annotations

import json
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from ecrl.contract.atomicio import fsync_dir

__all__ = ["write_cifar", "cifar_folder"]

_MARKER = ".ecrl-generated.json"
_TEST_IMAGES = 16


def cifar_folder(kind: str) -> str:
    return "cifar-10-batches-py" if kind == "cifar10" else "cifar-100-python"


def _images(start: int, stop: int, classes: int) -> tuple[np.ndarray, list[int]]:
    labels = [i % classes for i in range(start, stop)]
    rng = np.random.default_rng(start)
    noise = rng.integers(0, 192, (stop - start, 3072), dtype=np.int64)
    # A class pattern: a smooth stripe pattern whose phase depends on the label.
    grid = np.arange(3072) % 1024
    data = np.empty((stop - start, 3072), np.uint8)
    for row, label in enumerate(labels):
        pattern = (64 * (1 + np.sin(grid * (label + 1) * 0.37))).astype(np.int64) // 2
        data[row] = np.clip(noise[row] + pattern, 0, 255).astype(np.uint8)
    return data, labels


def _dump(path: Path, obj: Any) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle, protocol=2)


def _write(base: Path, kind: str, images: int) -> None:
    if kind == "cifar10":
        per_batch = -(-images // 5)
        for b in range(5):
            start, stop = b * per_batch, min(images, (b + 1) * per_batch)
            data, labels = _images(start, max(start, stop), 10)
            _dump(base / f"data_batch_{b + 1}", {
                "batch_label": f"training batch {b + 1} of 5", "labels": labels, "data": data,
                "filenames": [f"train_{i}.png" for i in range(start, max(start, stop))]})
        data, labels = _images(images, images + _TEST_IMAGES, 10)
        _dump(base / "test_batch", {"batch_label": "testing batch 1 of 1", "labels": labels,
                                    "data": data,
                                    "filenames": [f"test_{i}.png" for i in range(len(labels))]})
        _dump(base / "batches.meta", {"label_names": [f"class{i}" for i in range(10)],
                                      "num_cases_per_batch": per_batch, "num_vis": 3072})
        return
    for name, start, stop in (("train", 0, images), ("test", images, images + _TEST_IMAGES)):
        data, labels = _images(start, stop, 100)
        _dump(base / name, {"filenames": [f"{name}_{i}.png" for i in range(stop - start)],
                            "batch_label": f"{name} batch", "fine_labels": labels,
                            "coarse_labels": [label // 5 for label in labels], "data": data})
    _dump(base / "meta", {"fine_label_names": [f"fine{i}" for i in range(100)],
                          "coarse_label_names": [f"coarse{i}" for i in range(20)]})


def write_cifar(root: Path, kind: str, images: int) -> Path:
    """``root`` holding ``kind``'s folder with ``images`` training images; kept if already there.

    Written into a temporary folder and renamed into place, so an interrupted matrix never leaves
    a half-written data set that a later run would read.
    """
    marker = root / _MARKER
    wanted = {"kind": kind, "images": images, "format": 1}
    if marker.exists():
        try:
            if json.loads(marker.read_text()) == wanted:
                return root
        except (OSError, ValueError):
            pass
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        base = tmp / cifar_folder(kind)
        base.mkdir()
        _write(base, kind, images)
        (tmp / _MARKER).write_text(json.dumps(wanted))
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(root.parent)
    return root
