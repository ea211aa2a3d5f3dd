"""Loading a sharded checkpoint at any world size, running no code and loading no byte that the
manifest's checksums do not cover.

DCP's own load is not used: its default planner hands byte entries to ``torch.load(...,
weights_only=False)``, which runs whatever a crafted pickle says. Each chunk is a byte entry
(format 3), so loading one is a copy: ECRL reads where each chunk lies from DCP's ``.metadata``
(:func:`ecrl.contract.shardfile.chunk_locations`: hashed and checked against the manifest, parsed
into plain records without calling anything, each place a part the manifest lists — a plain name,
no ``..``, no absolute path — and inside it), then reads each part once, without following a
link, hashing it while its chunk bytes go straight into their
buffers; a part whose hash is not the manifest's is refused before anything it held is used.
The tensors are then views of those bytes with the dtype and shape the manifest declares
(:func:`ecrl.runtime.checkpoint.statepack.rebuild_from_bytes`)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from ecrl.contract import safepath
from ecrl.contract.ckptfile import CHECKSUM_ALGORITHM, CheckpointError
from ecrl.contract.shardfile import (
    ChunkPlace,
    VerifiedShards,
    check_part,
    chunk_key,
    chunk_locations,
)
from ecrl.runtime.checkpoint import statepack

_BLOCK = 1 << 22


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


def _by_part(locations: dict[str, ChunkPlace], buffers: dict[str, torch.Tensor]
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
    locations = chunk_locations(ckpt)
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
