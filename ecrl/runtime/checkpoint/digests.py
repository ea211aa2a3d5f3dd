"""State digests: one SHA-256 per checkpointed object, at save time and as loaded.

A digest attests what an object's ``state_dict`` held, canonically: the state tree as
:func:`ecrl.runtime.checkpoint.statepack.encode` lays it out (tensors pulled out, the rest JSON),
with each tensor replaced by its dtype, shape and the SHA-256 of its raw bytes, serialised as JSON
with sorted keys. Representation details that a faithful ``load_state_dict`` may change do not
count: the order of dict entries (an optimizer's per-parameter state), tuples versus lists, the
device a tensor lives on, whether it is contiguous. Everything else (every value, dtype, shape,
byte) does.

Two sides compute the same function:

- at save time, :func:`image_digests` reads the checkpoint image itself (the header's tree and
  the tensor bytes already laid out for the file), so nothing is serialised twice; the
  ``overlapped`` strategy does it in the background writer, off the training path;
- after a restore, :func:`live_digest` encodes the live object's ``state_dict`` (and the RNG
  streams as they were set), so that ``restored.json`` attests the state as loaded, not the
  file.

This module is imported by the background writer, which never imports torch: the live side
imports :mod:`ecrl.runtime.checkpoint.statepack` (torch) only when it is called.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ecrl.contract.ckptfile import _PREFIX as _IMAGE_PREFIX  # the file format's own prefix
from ecrl.contract.ckptfile import ALIGN, FORMAT_NAME, MAGIC, CheckpointError

__all__ = ["PREFIX", "digest_tree", "image_digests", "live_digest", "rng_as_loaded",
           "RESTORED_FILE", "RESTORE_FAULT_ENV", "RESTORE_FAULTS", "restore_fault"]

PREFIX = "sha256:"

_TENSOR, _TUPLE, _DICT, _NDARRAY = "$tensor", "$tuple", "$dict", "$ndarray"

RESTORED_FILE = "restored.json"
"""Written by a resumed attempt into its log folder: the digests of the state as loaded."""

RESTORE_FAULT_ENV = "ECRL_TEST_RESTORE_FAULT"
"""TEST ONLY: breaks the restore path on purpose, to prove that ``ecrl-verify`` catches it."""

RESTORE_FAULTS = ("drop_optimizer", "skip_scheduler", "skip_rng", "previous_checkpoint")


def restore_fault() -> str | None:
    """The restore fault a test asked for (``ECRL_TEST_RESTORE_FAULT``), or None.

    TEST ONLY, read here and nowhere else: ``drop_optimizer`` loads the optimizer with its
    per-parameter state emptied, ``skip_scheduler`` never loads the scheduler, ``skip_rng`` never
    sets the saved RNG streams, ``previous_checkpoint`` loads the checkpoint before the one named.
    """
    value = os.environ.get(RESTORE_FAULT_ENV) or None
    if value is not None and value not in RESTORE_FAULTS:
        raise CheckpointError(f"{RESTORE_FAULT_ENV}={value!r}: a test-only fault, one of "
                              f"{', '.join(RESTORE_FAULTS)} (unset it for a real run)")
    return value


TensorBytes = Callable[[int], tuple[Mapping[str, Any], Any]]
"""Tensor index → (its entry: dtype, shape, kind; its raw bytes as a buffer)."""


def _canonical(value: Any, tensor: TensorBytes) -> Any:
    if isinstance(value, list):
        return [_canonical(v, tensor) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (tag, inner), = value.items()
        if tag in (_TENSOR, _NDARRAY):
            entry, raw = tensor(int(inner))
            return {tag: [str(entry["dtype"]), list(entry["shape"]),
                          hashlib.sha256(raw).hexdigest()]}
        if tag == _TUPLE:
            return [_canonical(v, tensor) for v in inner]
        if tag == _DICT:
            pairs = [[_canonical(k, tensor), _canonical(v, tensor)] for k, v in inner]
            pairs.sort(key=lambda kv: json.dumps(kv[0], sort_keys=True))
            return {_DICT: pairs}
    return {k: _canonical(v, tensor) for k, v in value.items()}


def digest_tree(tree: Any, tensor: TensorBytes) -> str:
    """``"sha256:…"`` of an encoded state tree (statepack's form) and its tensors' bytes."""
    text = json.dumps(_canonical(tree, tensor), sort_keys=True, separators=(",", ":"),
                      allow_nan=False)
    return PREFIX + hashlib.sha256(text.encode("utf-8")).hexdigest()


def image_digests(image: memoryview | bytes | bytearray) -> dict[str, str]:
    """Per top-level object of a checkpoint image (the file's bytes, footer optional), its
    digest, read from the header's tree and the tensor bytes in place."""
    view = memoryview(image)
    magic, header_len = _IMAGE_PREFIX.unpack_from(view, 0)
    header = json.loads(bytes(view[_IMAGE_PREFIX.size:_IMAGE_PREFIX.size + header_len]))
    if magic != MAGIC or not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise CheckpointError("not an ECRL checkpoint image: cannot digest it")
    data_start = -(-(_IMAGE_PREFIX.size + header_len) // ALIGN) * ALIGN
    entries: Sequence[Mapping[str, Any]] = header["tensors"]

    def tensor(index: int) -> tuple[Mapping[str, Any], Any]:
        entry = entries[index]
        start = data_start + int(entry["offset"])
        return entry, view[start:start + int(entry["nbytes"])]

    return {name: digest_tree(sub, tensor) for name, sub in header["tree"].items()}


def live_digest(state: Any) -> str:
    """The digest of a live state tree (a ``state_dict``, RNG states), computed as at save time."""
    import torch

    from ecrl.runtime.checkpoint import statepack

    encoded = statepack.encode(state, meta={})

    def tensor(index: int) -> tuple[Mapping[str, Any], Any]:
        t = encoded.tensors[index]
        entry = encoded.entries[index]
        if isinstance(t, torch.Tensor):
            flat = t.detach().to("cpu").contiguous().reshape(-1)
            return entry, flat.view(torch.uint8).numpy().data if flat.numel() else b""
        return entry, t.reshape(-1).view("uint8").data

    return digest_tree(encoded.tree, tensor)


def rng_as_loaded(saved: Mapping[str, Any], live: Sequence[Any | None]) -> Any | None:
    """The RNG entry as this attempt loaded it: the saved ``{"world_size", "ranks"}`` with each
    saved rank that runs now replaced by the streams that rank actually holds after its restore
    (``live[r]``; None where a rank set none). A saved rank beyond today's world size (the job
    shrank) has nothing to load its streams into, so its saved streams stand. None when no rank
    that runs now restored its streams."""
    ranks = list(saved["ranks"])
    restored = False
    for r in range(min(len(ranks), len(live))):
        if live[r] is None:
            return None
        ranks[r] = live[r]
        restored = True
    return {**saved, "ranks": ranks} if restored else None
