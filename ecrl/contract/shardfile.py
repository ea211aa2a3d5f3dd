"""The sharded checkpoint format (torch-free): a ``torch.distributed.checkpoint`` directory plus
ECRL's manifest of checksums.

::

    checkpoints/step-GGGGGGGG.dcp/
        __0_0.distcp, __1_0.distcp, …   DCP's data files, one per writing rank
        .metadata                       DCP's index of every tensor (written by rank 0)
        ecrl-manifest.json              {"format", "version", "meta", "tree", "tensors", "parts"}

The manifest is written last, after every part and DCP's metadata are durable; ``parts`` maps
every other file of the directory to its size and SHA-256, ``tree``/``tensors`` are the
StatePack tree of the state (:mod:`ecrl.runtime.statepack`) whose tensor ``i`` is the DCP entry
``t{i:05d}``. The checkpoint's checksum (the one ``latest.json`` records) is the SHA-256 of the
manifest's bytes, so one checksum covers every part. Verifying a checkpoint
(:func:`read_verified_shards`) reads the manifest, checks that checksum, then every part's size
and hash, before DCP touches a byte: DCP's ``.metadata`` is a pickle, and it is only unpickled
(by a restricted unpickler) once it is known to be the one the run wrote.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecrl.contract.ckptfile import (
    CHECKSUM_ALGORITHM,
    CheckpointError,
    check_committed,
    parse_format_document,
)

__all__ = ["SUFFIX", "MANIFEST", "FORMAT_NAME", "FORMAT_VERSION", "METADATA_FILE", "tensor_key",
           "file_checksum", "encode_manifest", "VerifiedShards", "read_verified_shards"]

SUFFIX = ".dcp"
MANIFEST = "ecrl-manifest.json"
METADATA_FILE = ".metadata"
FORMAT_NAME = "ecrl-dcp"
FORMAT_VERSION = 1
_CHUNK = 1 << 22


def tensor_key(index: int) -> str:
    """The DCP key of StatePack tensor ``index``."""
    return f"t{index:05d}"


def file_checksum(path: str | os.PathLike[str]) -> tuple[str, int]:
    """``("sha256:<hex>", size)`` of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with open(path, "rb", buffering=0) as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}", size


def encode_manifest(*, meta: dict[str, Any], tree: Any, tensors: list[dict[str, Any]],
                    parts: dict[str, dict[str, Any]]) -> bytes:
    """The manifest's bytes (its SHA-256 is the checkpoint's checksum)."""
    return json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": meta,
                       "tree": tree, "tensors": tensors, "parts": parts},
                      separators=(",", ":"), allow_nan=False).encode("utf-8")


@dataclass(frozen=True, slots=True)
class VerifiedShards:
    """A sharded checkpoint whose manifest and every part verified."""

    path: Path
    manifest: dict[str, Any]
    checksum: str

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.manifest.get("meta", {}))


def read_verified_shards(path: str | os.PathLike[str], *, expected_checksum: str | None = None,
                         check_parts: bool = True) -> VerifiedShards:
    """Verify the sharded checkpoint directory ``path``; every problem is one-line
    :class:`CheckpointError` naming the file."""
    root = Path(path)
    if not root.is_dir():
        raise CheckpointError(f"{root}: sharded checkpoint directory is missing")
    manifest_path = root / MANIFEST
    try:
        raw = manifest_path.read_bytes()
    except FileNotFoundError:
        raise CheckpointError(f"{manifest_path}: manifest is missing (the checkpoint was never "
                              "completed)") from None
    except OSError as exc:
        raise CheckpointError(f"{manifest_path}: cannot read: {exc.strerror}") from None
    actual = f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(raw).hexdigest()}"
    check_committed(manifest_path, actual, expected_checksum)
    manifest = parse_format_document(manifest_path, raw, name=FORMAT_NAME, version=FORMAT_VERSION)
    parts = manifest.get("parts")
    if not isinstance(parts, dict) or METADATA_FILE not in parts:
        raise CheckpointError(f"{manifest_path}: lists no DCP metadata among its parts")
    for name, info in parts.items():
        if not isinstance(name, str) or "/" in name or name in ("", ".", "..", MANIFEST) \
                or not isinstance(info, dict):
            raise CheckpointError(f"{manifest_path}: part {name!r} is not a file of the "
                                  "checkpoint directory")
    if check_parts:
        for name, info in sorted(parts.items()):
            part = root / name
            try:
                checksum, size = file_checksum(part)
            except FileNotFoundError:
                raise CheckpointError(f"{part}: part of the checkpoint is missing") from None
            except OSError as exc:
                raise CheckpointError(f"{part}: cannot read: {exc.strerror}") from None
            if size != info.get("size"):
                raise CheckpointError(f"{part}: {size} bytes, the manifest says "
                                      f"{info.get('size')}: the part is truncated or damaged")
            if checksum != info.get("checksum"):
                raise CheckpointError(
                    f"{part}: checksum mismatch (manifest says {str(info.get('checksum'))[:23]}…, "
                    f"content hashes to {checksum[:23]}…): the part is corrupt")
    return VerifiedShards(path=root, manifest=manifest, checksum=actual)
