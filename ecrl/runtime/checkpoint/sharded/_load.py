"""Loading a sharded checkpoint at any world size, running no code and loading no byte that the
manifest's checksums do not cover.

DCP's own load is not used: its default planner hands byte entries to ``torch.load(...,
weights_only=False)``, which runs whatever a crafted pickle says. Each chunk is a byte entry
(format 3), so loading one is a copy: ECRL reads DCP's ``.metadata`` (hashed as read and
checked against the manifest first) with an unpickler that builds the few DCP metadata
dataclasses of that format and nothing else, checks that each chunk's location names a part the
manifest lists (a plain name, no ``..``, no absolute path) and lies inside it, then reads each
part once, without following a link, hashing it while its chunk bytes go straight into their
buffers; a part whose hash is not the manifest's is refused before anything it held is used.
The tensors are then views of those bytes with the dtype and shape the manifest declares
(:func:`ecrl.runtime.checkpoint.statepack.rebuild_from_bytes`)."""

from __future__ import annotations

import hashlib
import io
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ecrl.contract import safepath
from ecrl.contract.ckptfile import CHECKSUM_ALGORITHM, CheckpointError
from ecrl.contract.shardfile import (
    MANIFEST,
    METADATA_FILE,
    VerifiedShards,
    check_part,
    chunk_key,
)
from ecrl.runtime.checkpoint import statepack

_BLOCK = 1 << 22


class _MetadataUnpickler(pickle.Unpickler):
    """Builds the metadata of a format-3 DCP checkpoint and nothing else: its dataclasses (plain
    attribute holders), a path object, and containers. A ``.metadata`` that names any other
    callable is refused instead of called."""

    _ALLOWED = frozenset({
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
        ("pathlib._local", "PosixPath"), ("pathlib._local", "PurePosixPath"),
        ("collections", "OrderedDict")})

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not part of the DCP "
                                     "metadata of a byte-chunk checkpoint")


def _read_metadata(ckpt: VerifiedShards) -> Any:
    """DCP's metadata, from bytes whose hash is the manifest's."""
    path = ckpt.path / METADATA_FILE
    try:
        with safepath.read_regular(path, error=CheckpointError) as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: part of the checkpoint is missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    check_part(path, ckpt.manifest["parts"][METADATA_FILE],
               f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(raw).hexdigest()}", len(raw))
    try:
        return _MetadataUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # a crafted pickle can raise anything from the classes it builds
        raise CheckpointError(f"{path}: refused DCP metadata ({exc})") from None


def _chunk_locations(ckpt: VerifiedShards, metadata: Any) -> dict[str, tuple[str, int, int]]:
    """Chunk key → (part, offset, length), each checked against the manifest."""
    path = ckpt.path / METADATA_FILE
    parts: dict[str, Any] = ckpt.manifest["parts"]
    sizes = {str(c["key"]): int(c["nbytes"]) for c in ckpt.manifest["chunks"]}
    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not isinstance(entries, dict) or not isinstance(storage, dict):
        raise CheckpointError(f"{path}: not DCP metadata (no state_dict_metadata and "
                              "storage_data tables)")
    if set(entries) != set(sizes):
        raise CheckpointError(f"{path}: state_dict_metadata holds {sorted(map(str, entries))}, "
                              f"the manifest's chunks are {sorted(sizes)}")
    found: dict[str, tuple[str, int, int]] = {}
    for index, info in storage.items():
        key = getattr(index, "fqn", None)
        where = f"{path}: storage_data of chunk {key!r}"
        if key not in sizes or key in found or getattr(index, "offset", None) is not None:
            raise CheckpointError(f"{where}: not one entry per chunk of the manifest")
        relative = getattr(info, "relative_path", None)
        safepath.check_relative(relative, where=f"{where}: relative_path", error=CheckpointError)
        if relative in (METADATA_FILE, MANIFEST) or relative not in parts:
            raise CheckpointError(f"{where}: relative_path {relative!r} is not a part the "
                                  "manifest's checksums cover; refused")
        offset, length = getattr(info, "offset", None), getattr(info, "length", None)
        if getattr(info, "transform_descriptors", None):
            raise CheckpointError(f"{where}: transform_descriptors "
                                  f"{info.transform_descriptors!r}: ECRL writes none; refused")
        if not isinstance(offset, int) or not isinstance(length, int) or offset < 0 \
                or length != sizes[key] or offset + length > int(parts[relative]["size"]):
            raise CheckpointError(
                f"{where}: offset {offset!r}, length {length!r} is not the chunk's "
                f"{sizes[key]} bytes inside {relative} ({parts[relative]['size']} bytes)")
        found[key] = (relative, offset, length)
    if set(found) != set(sizes):
        raise CheckpointError(f"{path}: storage_data does not place chunk(s) "
                              f"{sorted(set(sizes) - set(found))}")
    return found


def _read_part(part: Path, info: dict[str, Any],
               spans: list[tuple[int, torch.Tensor]]) -> None:
    """Read ``part`` once, front to back, hashing every byte; each span's bytes (offset, uint8
    buffer) go straight into its buffer. Refused unless the part is the manifest's."""
    digest = hashlib.sha256()
    scratch = bytearray(_BLOCK)
    size = 0
    try:
        with safepath.read_regular(part, error=CheckpointError) as handle:

            def take(view: memoryview) -> None:
                nonlocal size
                got = 0
                while got < len(view):
                    n = handle.readinto(view[got:])
                    if not n:
                        break
                    got += n
                digest.update(view[:got])
                size += got

            def skip_to(offset: int) -> None:
                while size < offset:
                    before = size
                    take(memoryview(scratch)[:min(_BLOCK, offset - size)])
                    if size == before:
                        return

            for offset, buffer in sorted(spans, key=lambda span: span[0]):
                if offset < size:
                    raise CheckpointError(f"{part}: two chunks overlap at byte {offset}")
                skip_to(offset)
                if buffer.numel():
                    view: Any = buffer.numpy()
                    take(memoryview(view))
            while True:
                before = size
                take(memoryview(scratch))
                if size == before:
                    break
    except FileNotFoundError:
        raise CheckpointError(f"{part}: part of the checkpoint is missing") from None
    except OSError as exc:
        raise CheckpointError(f"{part}: cannot read: {exc.strerror}") from None
    check_part(part, info, f"{CHECKSUM_ALGORITHM}:{digest.hexdigest()}", size)


def _by_part(locations: dict[str, tuple[str, int, int]], buffers: dict[str, torch.Tensor]
             ) -> Iterator[tuple[str, list[tuple[int, torch.Tensor]]]]:
    parts: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for key, (relative, offset, _length) in locations.items():
        parts.setdefault(relative, []).append((offset, buffers[key]))
    yield from sorted(parts.items())


def load(ckpt: VerifiedShards) -> Any:
    """The state tree of a sharded checkpoint (CPU tensors), at any world size.

    ``ckpt``'s manifest must have been verified (:func:`ecrl.contract.shardfile.
    read_verified_shards`, its parts need not have been): the metadata and every part this
    reads are hashed here, as they are read."""
    entries: list[dict[str, Any]] = ckpt.manifest["tensors"]
    sizes = {str(c["key"]): int(c["nbytes"]) for c in ckpt.manifest["chunks"]}
    locations = _chunk_locations(ckpt, _read_metadata(ckpt))
    buffers = {key: torch.empty(n, dtype=torch.uint8) for key, n in sizes.items()}
    for relative, spans in _by_part(locations, buffers):
        _read_part(ckpt.path / relative, ckpt.manifest["parts"][relative], spans)
    try:
        chunks = [buffers[chunk_key(int(e["chunk"]))] for e in entries]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{ckpt.path}: the manifest does not say where its tensors lie"
                              ) from None

    def raw(index: int) -> torch.Tensor:
        entry = entries[index]
        offset, nbytes = int(entry["offset"]), int(entry["nbytes"])
        if offset < 0 or nbytes < 0 or offset + nbytes > chunks[index].numel():
            raise CheckpointError(f"{ckpt.path}: tensor {index} runs past the end of its chunk")
        return chunks[index].narrow(0, offset, nbytes)

    return statepack.rebuild_from_bytes(ckpt.manifest["tree"], entries, raw, where=ckpt.path)
