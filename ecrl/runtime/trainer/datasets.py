"""Data sets that yield ``(x, y, sample_id)``, and batches fetched by sample ID.

The trainer never iterates a data loader: each step it asks for exactly the IDs of its shard
(:mod:`ecrl.runtime.sampling.batch_sampler`), so :meth:`SampleSource.batch` takes an array of IDs.
``source[i]`` gives the same sample one at a time, as ``(x, y, i)``; both paths produce
bit-identical tensors.

- ``fake``: generated data, the embedded default. Sample ``i`` is a pure function of ``i`` (a
  class template plus noise, both drawn from :func:`ecrl.contract.semantics.mix64` of the ID), so
  any sample can be produced at any time, by any rank, without files and without touching an RNG.
- ``fake`` with ``--model tiny-gpt``: generated token sequences (:class:`GeneratedTokens`), each
  a pure function of its ID as well.
- ``cifar10`` / ``cifar100``: torchvision's own data set classes over the standard python-pickle
  layout (``cifar-10-batches-py/`` or ``cifar-100-python/`` under ``--data-dir``). Nothing is
  downloaded. The published MD5 sums are not enforced, so subsets and re-packed copies in the
  same format load. Because nothing vouches for the files, they are never handed to
  ``pickle.load``: the subclasses here override torchvision's loading (its ``__init__`` and
  ``_load_meta``, which call ``pickle.load``) with :class:`_CifarUnpickler`, which builds only
  what a CIFAR batch holds (dicts, lists, strings, numbers and numpy arrays) and refuses any other
  global a pickle names, so a hostile data directory cannot run code. Each file is read once,
  by the restricted reader (no check-then-load race); the rest (file names, label keys, the
  HWC layout, ``__getitem__``) stays torchvision's.
- ``imagefolder``: torchvision's ``ImageFolder`` (one folder per class); sample IDs follow its
  sorted order; images are resized to ``image_size`` square.
"""

from __future__ import annotations

import codecs
import functools
import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt
import torch

from ecrl.contract.errors import ConfigError
from ecrl.contract.semantics import mix64
from ecrl.runtime.runconfig import DATASETS
from ecrl.runtime.settings import FAKE_CLASSES, TINY_GPT

__all__ = [
    "DATASETS",
    "SampleSource",
    "GeneratedDataset",
    "GeneratedTokens",
    "CifarDataset",
    "ImageFolderDataset",
    "check_data_dir",
    "build_dataset",
]

_CIFAR = {
    "cifar10": ("cifar-10-batches-py",
                ["data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5",
                 "test_batch", "batches.meta"]),
    "cifar100": ("cifar-100-python", ["train", "test", "meta"]),
}
# Per-channel statistics of the CIFAR-10 training set and of ImageNet (for image folders).
_CIFAR_MEAN, _CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
_IMAGENET_MEAN, _IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class SampleSource(Protocol):
    """What the trainer needs from a data set."""

    @property
    def name(self) -> str: ...

    @property
    def num_classes(self) -> int: ...

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]: ...

    def batch(self, ids: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor]: ...


def _unit(z: npt.NDArray[np.uint64]) -> npt.NDArray[np.float64]:
    """uint64 → [-1, 1) from the top 53 bits."""
    return (z >> np.uint64(11)).astype(np.float64) * (2.0 / 2**53) - 1.0


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratedDataset:
    """Deterministic generated images: sample ``i`` is a function of ``i`` alone."""

    size: int
    """Number of samples (IDs 0..size-1)."""
    num_classes: int = FAKE_CLASSES
    channels: int = 3
    side: int = 32
    name: str = "fake"

    SIGNAL = 0.1
    """Template amplitude against uniform noise in [-1, 1): learnable, but not in a few steps."""
    _LABEL_SALT = 0x6C6162656C73
    _NOISE_SALT = 0x6E6F697365
    _TEMPLATE_SALT = 0x74656D706C

    def __len__(self) -> int:
        return self.size

    def labels(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        z = mix64(ids.astype(np.uint64) ^ np.uint64(self._LABEL_SALT))
        return (z % np.uint64(self.num_classes)).astype(np.int64)

    def _templates(self) -> npt.NDArray[np.float32]:
        # Coarse 8x8 patterns scaled up, so that a small CNN with pooling can separate classes.
        coarse = max(1, self.side // 4)
        cells = self.channels * coarse * coarse
        z = mix64(np.arange(self.num_classes * cells, dtype=np.uint64)
                  + np.uint64(self._TEMPLATE_SALT))
        t = _unit(z).reshape(self.num_classes, self.channels, coarse, coarse)
        reps = -(-self.side // coarse)
        t = t.repeat(reps, axis=2).repeat(reps, axis=3)[:, :, : self.side, : self.side]
        return t.astype(np.float32)

    def images(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float32]:
        pixels = self.channels * self.side * self.side
        grid = (ids.astype(np.uint64)[:, None] * np.uint64(pixels)
                + np.arange(pixels, dtype=np.uint64)[None, :] + np.uint64(self._NOISE_SALT))
        noise = _unit(mix64(grid)).astype(np.float32)
        noise = noise.reshape(len(ids), self.channels, self.side, self.side)
        return self.SIGNAL * self._templates()[self.labels(ids)] + noise

    def batch(self, ids: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor]:
        ids = np.asarray(ids, dtype=np.int64)
        return torch.from_numpy(self.images(ids)), torch.from_numpy(self.labels(ids))

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        x, y = self.batch(np.array([index], dtype=np.int64))
        return x[0], int(y[0]), index


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratedTokens:
    """Deterministic token sequences for a language model: sample ``i`` is a function of ``i``.

    Each sequence is ``seq_len + 1`` tokens of an affine walk ``t' = (a * t + c) mod vocab``
    whose start and step ``c`` come from :func:`ecrl.contract.semantics.mix64` of the ID, with
    one token in eight replaced by noise: learnable from the context (the step shows after two
    tokens), never exactly. ``batch`` gives the inputs (the first ``seq_len`` tokens) and the
    targets (the same shifted by one)."""

    size: int
    """Number of samples (IDs 0..size-1)."""
    vocab: int = TINY_GPT["vocab"]
    seq_len: int = TINY_GPT["seq_len"]
    name: str = "fake"

    _MULTIPLIER = 5
    _START_SALT = 0x746F6B656E
    _STEP_SALT = 0x73746570
    _NOISE_SALT = 0x6E6F6973

    @property
    def num_classes(self) -> int:
        return self.vocab

    def __len__(self) -> int:
        return self.size

    def tokens(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        u = ids.astype(np.uint64)
        v = np.uint64(self.vocab)
        token = mix64(u ^ np.uint64(self._START_SALT)) % v
        step = mix64(u ^ np.uint64(self._STEP_SALT)) % v
        positions = np.arange(self.seq_len + 1, dtype=np.uint64)
        noise = mix64(u[:, None] * np.uint64(self.seq_len + 1) + positions[None, :]
                      + np.uint64(self._NOISE_SALT))
        out = np.empty((len(ids), self.seq_len + 1), dtype=np.uint64)
        for k in range(self.seq_len + 1):
            out[:, k] = token
            token = (np.uint64(self._MULTIPLIER) * token + step) % v
        noisy = (noise & np.uint64(7)) == 0
        out[noisy] = (noise[noisy] >> np.uint64(3)) % v
        return out.astype(np.int64)

    def batch(self, ids: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor]:
        seq = torch.from_numpy(self.tokens(np.asarray(ids, dtype=np.int64)))
        return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        x, _ = self.batch(np.array([index], dtype=np.int64))
        return x[0], int(self.tokens(np.array([index], dtype=np.int64))[0, -1]), index


def _normalise(x: torch.Tensor, mean: tuple[float, ...], std: tuple[float, ...]) -> torch.Tensor:
    shape = (1, len(mean), 1, 1) if x.dim() == 4 else (len(mean), 1, 1)
    return (x - torch.tensor(mean).view(shape)) / torch.tensor(std).view(shape)


@functools.cache
def _cifar_globals() -> dict[tuple[str, str], Any]:
    """The globals a CIFAR batch's pickle may name, and what each resolves to: numpy's array
    reconstructors (under numpy 1's and numpy 2's module names, as old and new pickles spell
    them), ``ndarray``, ``dtype``, and ``_codecs.encode`` (how a protocol-2 pickle written by
    Python 3 spells bytes, restricted to latin-1)."""
    try:
        from numpy._core import multiarray, numeric
    except ImportError:  # pragma: no cover - numpy 1
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]

    def encode(text: str, encoding: str = "utf-8") -> bytes:
        if encoding not in ("latin1", "latin-1"):
            raise pickle.UnpicklingError(f"it encodes bytes as {encoding!r}, not latin-1")
        return codecs.encode(text, encoding)

    reconstruct = multiarray._reconstruct
    frombuffer = numeric._frombuffer  # type: ignore[attr-defined]
    return {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
            ("numpy.core.multiarray", "_reconstruct"): reconstruct,
            ("numpy._core.multiarray", "_reconstruct"): reconstruct,
            ("numpy.core.numeric", "_frombuffer"): frombuffer,
            ("numpy._core.numeric", "_frombuffer"): frombuffer,
            ("_codecs", "encode"): encode}


class _CifarUnpickler(pickle.Unpickler):
    """A pickle reader that builds only what a CIFAR batch holds and never runs code: every
    global outside :func:`_cifar_globals` (``os.system``, ``builtins.eval``, any class) is
    refused before it is looked up, so no constructor or reducer of the file's choosing runs."""

    def find_class(self, module: str, name: str) -> Any:
        allowed = _cifar_globals().get((module, name))
        if allowed is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which a CIFAR batch never "
                                         "holds (ECRL never runs code from a data file)")
        return allowed

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to outside objects (persistent IDs)")


def _load_cifar_file(path: str) -> dict[str, Any]:
    """One CIFAR pickle (a batch or the meta file), read by :class:`_CifarUnpickler`; a one-line
    :class:`ConfigError` naming the file when it is not one."""
    try:
        with open(path, "rb") as handle:
            entry = _CifarUnpickler(handle, encoding="latin1").load()
    except pickle.UnpicklingError as exc:
        raise ConfigError(f"{path} is not a CIFAR batch: {exc}") from None
    except (OSError, EOFError, ValueError, TypeError, AttributeError, IndexError,
            KeyError, MemoryError) as exc:
        raise ConfigError(f"{path} is not a CIFAR batch: {' '.join(str(exc).split())}") from None
    if not isinstance(entry, dict):
        raise ConfigError(f"{path} is not a CIFAR batch: it holds a {type(entry).__name__}, not "
                          "a dict")
    data = entry.get("data")
    if data is not None and not (isinstance(data, np.ndarray) and data.dtype == np.uint8):
        raise ConfigError(f"{path} is not a CIFAR batch: its data is not an array of bytes")
    return entry


def _cifar_classes() -> dict[str, Any]:
    from torchvision.datasets import CIFAR10, CIFAR100
    from torchvision.datasets.vision import VisionDataset

    def restricted(base: type) -> type:
        # torchvision insists on the published MD5 sums (presence is checked instead) and reads
        # the files with pickle.load: keep its file names, keys, layout and __getitem__, and
        # read each file once with the restricted unpickler.
        def __init__(self: Any, root: str, train: bool = True) -> None:
            VisionDataset.__init__(self, root)
            self.train = train
            if not self._check_integrity():
                raise RuntimeError("Dataset not found")
            data, targets = [], []
            for file_name, _ in self.train_list if train else self.test_list:
                entry = _load_cifar_file(os.path.join(self.root, self.base_folder, file_name))
                data.append(entry["data"])
                targets.extend(entry["labels"] if "labels" in entry else entry["fine_labels"])
            self.data = np.vstack(data).reshape(-1, 3, 32, 32).transpose((0, 2, 3, 1))
            self.targets = targets
            self._load_meta()

        def _load_meta(self: Any) -> None:
            entry = _load_cifar_file(os.path.join(self.root, self.base_folder,
                                                  self.meta["filename"]))
            self.classes = entry[self.meta["key"]]
            self.class_to_idx = {c: i for i, c in enumerate(self.classes)}

        return type(f"{base.__name__}Files", (base,), {
            "train_list": [[name, None] for name, _ in base.train_list],  # type: ignore[attr-defined]
            "test_list": [[name, None] for name, _ in base.test_list],  # type: ignore[attr-defined]
            "meta": {**base.meta, "md5": None},  # type: ignore[attr-defined]
            "__init__": __init__, "_load_meta": _load_meta,
        })

    return {"cifar10": restricted(CIFAR10), "cifar100": restricted(CIFAR100)}


class CifarDataset:
    """CIFAR-10 or CIFAR-100 (training split) through torchvision's loader."""

    def __init__(self, name: str, root: Path) -> None:
        check_data_dir(name, root)
        root = _cifar_root(name, root)
        try:
            self._ds = _cifar_classes()[name](root=str(root), train=True)
        except ConfigError as exc:
            raise ConfigError(f"--data-dir {root}: cannot read {name}: {exc}") from None
        except Exception as exc:  # a batch of the wrong shape, labels missing, …
            raise ConfigError(f"--data-dir {root}: cannot read {name}: "
                              f"{type(exc).__name__}: {' '.join(str(exc).split())}") from None
        self.name = name
        self.data: npt.NDArray[np.uint8] = np.ascontiguousarray(self._ds.data)
        self.targets = np.asarray(self._ds.targets, dtype=np.int64)
        self.num_classes = len(self._ds.classes)

    def __len__(self) -> int:
        return len(self.targets)

    def batch(self, ids: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(self.data[ids]).permute(0, 3, 1, 2).contiguous()
        x = _normalise(x.to(torch.float32).div(255), _CIFAR_MEAN, _CIFAR_STD)
        return x, torch.from_numpy(self.targets[ids])

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        from torchvision.transforms import ToTensor

        image, label = self._ds[index]
        x = _normalise(ToTensor()(image), _CIFAR_MEAN, _CIFAR_STD)
        return x, int(label), index


class ImageFolderDataset:
    """A folder of class folders of images, through torchvision's ``ImageFolder``."""

    def __init__(self, root: Path, *, image_size: int) -> None:
        check_data_dir("imagefolder", root)
        from torchvision import transforms
        from torchvision.datasets import ImageFolder

        transform = transforms.Compose([transforms.Resize((image_size, image_size)),
                                        transforms.ToTensor()])
        try:
            self._ds = ImageFolder(str(root), transform=transform)
        except (FileNotFoundError, RuntimeError) as exc:
            raise ConfigError(f"--data-dir {root}: {exc}") from None
        self.name = "imagefolder"
        self.num_classes = len(self._ds.classes)

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int, int]:
        image, label = self._ds[index]
        return _normalise(image, _IMAGENET_MEAN, _IMAGENET_STD), int(label), index

    def batch(self, ids: npt.NDArray[np.int64]) -> tuple[torch.Tensor, torch.Tensor]:
        items = [self[int(i)] for i in ids]
        return (torch.stack([x for x, _, _ in items]),
                torch.tensor([y for _, y, _ in items], dtype=torch.int64))


def _cifar_root(name: str, data_dir: Path) -> Path:
    folder, _ = _CIFAR[name]
    return data_dir.parent if data_dir.name == folder else data_dir


def check_data_dir(name: str, data_dir: Path | None) -> None:
    """Raise a one-line ConfigError unless ``data_dir`` holds ``name`` (torch-free check)."""
    if name == "fake":
        return
    if data_dir is None:
        raise ConfigError(f"--dataset {name} needs --data-dir (ECRL never downloads data)")
    if not data_dir.is_dir():
        raise ConfigError(f"--data-dir {data_dir}: no such directory")
    if name in _CIFAR:
        folder, files = _CIFAR[name]
        base = _cifar_root(name, data_dir) / folder
        missing = [f for f in files if not (base / f).is_file()]
        if missing:
            raise ConfigError(
                f"--data-dir {data_dir}: expected the python version of {name} in {base}/ "
                f"(missing {', '.join(missing)}); ECRL never downloads data"
            )
    elif name == "imagefolder" and not any(p.is_dir() for p in data_dir.iterdir()):
        raise ConfigError(f"--data-dir {data_dir}: an image folder needs one subfolder per class")


def build_dataset(name: str, *, data_dir: Path | None, size: int | None,
                  image_size: int = 32, model: str | None = None) -> SampleSource:
    """The data set a run names (``size`` is the fake data set's D; under ``model`` tiny-gpt
    the fake data set is token sequences)."""
    if name == "fake":
        if size is None:
            raise ConfigError("--dataset fake needs --dataset-size")
        if model == "tiny-gpt":
            return GeneratedTokens(size=size)
        return GeneratedDataset(size=size, side=image_size)
    if name in _CIFAR:
        assert data_dir is not None
        return CifarDataset(name, data_dir)
    if name == "imagefolder":
        assert data_dir is not None
        return ImageFolderDataset(data_dir, image_size=image_size)
    raise ConfigError(f"unknown --dataset {name!r}: choose one of {', '.join(DATASETS)}")
