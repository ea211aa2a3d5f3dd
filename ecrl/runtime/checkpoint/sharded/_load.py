"""Loading a verified sharded checkpoint at any world size, running no code: DCP's ``.metadata``
is read by a restricted unpickler, and each chunk's bytes are copied into its tensor."""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.filesystem import (
    FileSystemReader,
)

from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.shardfile import (
    BYTE_CHUNKS_SINCE,
    METADATA_FILE,
    VerifiedShards,
    chunk_key,
)
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.sharded._storage import first_line


class _MetadataUnpickler(pickle.Unpickler):
    """Builds DCP's metadata classes (and torch dtypes, sizes, layouts, paths), nothing else: a
    ``.metadata`` that names any other callable is refused instead of run."""

    _EXACT = frozenset({("torch", "Size"), ("torch.serialization", "_get_layout"),
                        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
                        ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),
                        ("collections", "OrderedDict")})

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name:
            if (module, name) in self._EXACT:
                return super().find_class(module, name)
            if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
                return super().find_class(module, name)
            if module == "torch.distributed.checkpoint.metadata":
                found = super().find_class(module, name)
                if isinstance(found, type) or name == "_MEM_FORMAT_ENCODING":
                    return found
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP's metadata")


class _Reader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = Path(self.path) / METADATA_FILE
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, ValueError) as exc:
            raise CheckpointError(f"{path}: refused DCP metadata ({exc})") from None
        from torch.distributed.checkpoint.metadata import StorageMeta

        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata




class _BytesIntoChunks(DefaultLoadPlanner):
    """DCP's load planner that copies each chunk's byte entry into the chunk's tensor (format 3)
    instead of handing the bytes to ``torch.load`` as DCP's default does."""

    def __init__(self, chunks: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._chunks = chunks

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        name = read_item.dest_index.fqn
        target, data = self._chunks[name], value.getbuffer()
        if data.nbytes != target.numel():
            raise CheckpointError(f"chunk {name} holds {data.nbytes} bytes, the manifest says "
                                  f"{target.numel()}")
        target.numpy()[:] = np.frombuffer(data, dtype=np.uint8)


def load(ckpt: VerifiedShards) -> Any:
    """The state tree of a verified sharded checkpoint (CPU tensors), at any world size."""
    entries: list[dict[str, Any]] = ckpt.manifest["tensors"]
    try:
        buffers = {str(c["key"]): torch.empty(int(c["nbytes"]), dtype=torch.uint8)
                   for c in ckpt.manifest["chunks"]}
        chunks = [buffers[chunk_key(int(e["chunk"]))] for e in entries]
    except (KeyError, TypeError, ValueError):
        raise CheckpointError(f"{ckpt.path}: the manifest does not say where its tensors lie"
                              ) from None
    # Format 2 stored each chunk as a uint8 tensor entry (torch.save'd), format 3 as raw bytes.
    as_bytes = ckpt.manifest["version"] >= BYTE_CHUNKS_SINCE
    targets: dict[str, Any] = {k: io.BytesIO() for k in buffers} if as_bytes else buffers
    try:
        with warnings.catch_warnings():
            # "assuming the intent is to load in a single process": it is (every rank loads all).
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(targets, storage_reader=_Reader(ckpt.path), no_dist=True,
                     planner=_BytesIntoChunks(buffers) if as_bytes else None)
    except CheckpointException as exc:
        raise CheckpointError(f"{ckpt.path}: DCP could not load it ({first_line(exc)})") from None

    def raw(index: int) -> torch.Tensor:
        entry = entries[index]
        return chunks[index].narrow(0, int(entry["offset"]), int(entry["nbytes"]))

    return statepack.rebuild_from_bytes(ckpt.manifest["tree"], entries, raw, where=ckpt.path)
