"""The sharded checkpoint format (torch-free): a ``torch.distributed.checkpoint`` directory plus
ECRL's manifest of checksums.

::

    checkpoints/step-GGGGGGGG.dcp/
        __0_0.distcp, __1_0.distcp, …   DCP's data files, one per writing rank
        .metadata                       DCP's index of every tensor (written by rank 0)
        ecrl-manifest.json              {"format", "version", "meta", "tree", "tensors", "chunks",
                                         "parts"}

The state's tensors are packed into a few byte *chunks* (about one per writing rank), each a DCP
entry ``c{k:03d}`` of dtype uint8: DCP's planner gives each replicated entry to one rank, so the
ranks still write equal shares, and DCP handles a few large entries instead of hundreds of small
ones (each costs it a ``torch.save`` call, a plan item and a metadata record; ResNet-50 has
~480 tensors). ``tree``/``tensors`` are the StatePack tree of the state
(:mod:`ecrl.runtime.checkpoint.statepack`); tensor ``i`` lies in chunk ``tensors[i]["chunk"]`` at
byte ``tensors[i]["offset"]`` (aligned to :data:`ALIGN`), and ``chunks[k]["nbytes"]`` is chunk
``k``'s size (:func:`pack_chunks` plans it). The manifest is written last, after every part and
DCP's metadata are durable; ``parts`` maps every other file of the directory to its size and
SHA-256. The checkpoint's checksum (the one ``latest.json`` records) is the SHA-256 of the
manifest's bytes, so one checksum covers every part. Verifying a checkpoint
(:func:`read_verified_shards`) reads the manifest, checks that checksum, then every part's size
and hash. Nothing is read through a link or from a special file (:mod:`ecrl.contract.safepath`).
DCP's ``.metadata`` is a pickle: :func:`chunk_locations` parses it, once its bytes hash to the
manifest's checksum, with an unpickler that calls nothing: the few DCP metadata classes a format-3
checkpoint names become plain local records (torch is never imported), any other name is refused;
then every chunk's place must be inside a part the manifest covers. Formats 1 and 2 kept
``torch.save``'d data and are refused.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecrl.contract import safepath
from ecrl.contract.ckptfile import (
    CHECKSUM_ALGORITHM,
    CheckpointError,
    check_committed,
    parse_format_document,
)

__all__ = ["SUFFIX", "RECYCLED", "MANIFEST", "FORMAT_NAME", "FORMAT_VERSION", "READABLE_VERSIONS",
           "PICKLED_VERSIONS", "METADATA_FILE", "ALIGN",
           "chunk_key", "pack_chunks", "file_checksum", "encode_manifest", "VerifiedShards",
           "read_verified_shards", "check_part", "chunk_locations", "ChunkPlace"]

SUFFIX = ".dcp"
RECYCLED = ".recycled.dcp"
"""In ``checkpoints/``: the data files of the last sharded checkpoint that retention retired,
without its manifest and DCP's metadata (so never a checkpoint), kept for the next sharded save
to write over instead of creating new files."""
MANIFEST = "ecrl-manifest.json"
METADATA_FILE = ".metadata"
FORMAT_NAME = "ecrl-dcp"
FORMAT_VERSION = 3
"""3: each chunk a DCP byte entry; 2: each chunk a uint8 tensor entry (``torch.save``'d); 1 had
one DCP entry per tensor. Only 3 is read: 1 and 2 hold pickles."""
READABLE_VERSIONS = (3,)
PICKLED_VERSIONS = (1, 2)
"""Formats whose chunks (1: whole tensors) DCP stored with ``torch.save``: refused, never
unpickled."""
ALIGN = 64
"""Byte alignment of every tensor inside its chunk (any dtype's view of the bytes is aligned)."""
_CHUNK = 1 << 22


def chunk_key(index: int) -> str:
    """The DCP key of chunk ``index``."""
    return f"c{index:03d}"


def pack_chunks(sizes: Sequence[int], parts: int, owners: Sequence[int | None] = ()
                ) -> tuple[list[tuple[int, int]], list[int]]:
    """Place tensors of ``sizes`` bytes, in order, into at most ``parts`` chunks of about equal
    size, cutting only between tensors (a tensor is never split, so each is one view of one
    chunk). Returns each tensor's (chunk, offset) and each chunk's size (one chunk at least
    when there is a tensor; only zero-byte tensors make an empty chunk).

    ``owners[i]``, when given and not None, pins tensor ``i`` to chunk ``owners[i]`` (the rank
    that holds it: a shard of a distributed tensor), after the balanced ones."""
    aligned = [-(-max(0, int(n)) // ALIGN) * ALIGN for n in sizes]
    pinned = {i: int(o) for i, o in enumerate(owners) if o is not None}
    if any(not 0 <= o < parts for o in pinned.values()):
        raise ValueError(f"a tensor is pinned to a chunk outside 0..{parts - 1}")
    free = [size for i, size in enumerate(aligned) if i not in pinned]
    total = sum(free)
    balanced: list[tuple[int, int]] = []
    chunks: list[int] = [0] if free else []
    before = 0  # bytes placed in earlier chunks
    for size in free:
        # Close the current chunk when this tensor would end nearer the next share's border
        # than the chunk's own end is to it now.
        border = total * len(chunks) / max(1, parts)
        if len(chunks) < parts and chunks[-1] and \
                abs(before + chunks[-1] + size - border) > abs(before + chunks[-1] - border):
            before += chunks[-1]
            chunks.append(0)
        balanced.append((len(chunks) - 1, chunks[-1]))
        chunks[-1] += size
    chunks.extend([0] * (max(pinned.values(), default=-1) + 1 - len(chunks)))
    places: list[tuple[int, int]] = []
    order = iter(balanced)
    for i, size in enumerate(aligned):
        if i in pinned:
            places.append((pinned[i], chunks[pinned[i]]))
            chunks[pinned[i]] += size
        else:
            places.append(next(order))
    return places, chunks


def file_checksum(path: str | os.PathLike[str]) -> tuple[str, int]:
    """``("sha256:<hex>", size)`` of a file, read in chunks."""
    h = hashlib.sha256()
    size = 0
    with safepath.read_regular(path, error=CheckpointError) as handle:
        while chunk := handle.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
    return f"{CHECKSUM_ALGORITHM}:{h.hexdigest()}", size


def encode_manifest(*, meta: dict[str, Any], tree: Any, tensors: list[dict[str, Any]],
                    chunks: list[int], parts: dict[str, dict[str, Any]]) -> bytes:
    """The manifest's bytes (its SHA-256 is the checkpoint's checksum)."""
    return json.dumps({"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": meta,
                       "tree": tree, "tensors": tensors,
                       "chunks": [{"key": chunk_key(k), "nbytes": n} for k, n in enumerate(chunks)],
                       "parts": parts},
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
    :class:`CheckpointError` naming the file.

    ``check_parts=False`` checks the manifest only: for a loader that hashes every byte it reads
    as it reads it (:func:`ecrl.runtime.checkpoint.sharded.load`), so that what is checked is
    what is loaded, with no second pass."""
    root = Path(path)
    safepath.require_dir(root, error=CheckpointError,
                         missing="sharded checkpoint directory is missing")
    manifest_path = root / MANIFEST
    try:
        with safepath.read_regular(manifest_path, error=CheckpointError) as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise CheckpointError(f"{manifest_path}: manifest is missing (the checkpoint was never "
                              "completed)") from None
    except OSError as exc:
        raise CheckpointError(f"{manifest_path}: cannot read: {exc.strerror}") from None
    actual = f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(raw).hexdigest()}"
    check_committed(manifest_path, actual, expected_checksum)
    _refuse_pickled_chunks(manifest_path, raw)
    manifest = parse_format_document(manifest_path, raw, name=FORMAT_NAME,
                                     version=READABLE_VERSIONS)
    parts = manifest.get("parts")
    if not isinstance(parts, dict) or METADATA_FILE not in parts:
        raise CheckpointError(f"{manifest_path}: lists no DCP metadata among its parts")
    for name, info in parts.items():
        safepath.check_name(name, where=f"{manifest_path}: part", error=CheckpointError)
        if name == MANIFEST or not isinstance(info, dict) \
                or not isinstance(info.get("size"), int) or info["size"] < 0 \
                or not isinstance(info.get("checksum"), str):
            raise CheckpointError(f"{manifest_path}: part {name!r} is not a file of the "
                                  "checkpoint directory with a size and a checksum")
    chunks = manifest.get("chunks")
    if not isinstance(chunks, list) or not all(
            isinstance(c, dict) and c.get("key") == chunk_key(k)
            and isinstance(c.get("nbytes"), int) and c["nbytes"] >= 0
            for k, c in enumerate(chunks)):
        raise CheckpointError(f"{manifest_path}: its chunks are not c000, c001, … with a size "
                              "each")
    if check_parts:
        for name, info in sorted(parts.items()):
            part = root / name
            try:
                checksum, size = file_checksum(part)
            except FileNotFoundError:
                raise CheckpointError(f"{part}: part of the checkpoint is missing") from None
            except OSError as exc:
                raise CheckpointError(f"{part}: cannot read: {exc.strerror}") from None
            check_part(part, info, checksum, size)
        verified = VerifiedShards(path=root, manifest=manifest, checksum=actual)
        chunk_locations(verified)  # where DCP put each chunk: inside the parts just checked
        return verified
    return VerifiedShards(path=root, manifest=manifest, checksum=actual)


def check_part(part: Path, info: dict[str, Any], checksum: str, size: int) -> None:
    """Refuse a part whose size or checksum is not the manifest's ``info``."""
    if size != info.get("size"):
        raise CheckpointError(f"{part}: {size} bytes, the manifest says "
                              f"{info.get('size')}: the part is truncated or damaged")
    if checksum != info.get("checksum"):
        raise CheckpointError(
            f"{part}: checksum mismatch (manifest says {str(info.get('checksum'))[:23]}…, "
            f"content hashes to {checksum[:23]}…): the part is corrupt")


def _refuse_pickled_chunks(manifest_path: Path, raw: bytes) -> None:
    """Format 2 stored each chunk as a ``torch.save``'d tensor entry: loading one means
    unpickling bytes from the run directory, which ECRL never does. Refused with what to do."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return  # parse_format_document says what is wrong
    if isinstance(document, dict) and document.get("format") == FORMAT_NAME \
            and document.get("version") in PICKLED_VERSIONS:
        raise CheckpointError(
            f"{manifest_path}: sharded checkpoint format {document['version']} (written by "
            "ECRL 0.1.0 before commit 9d876b3) keeps its chunks as pickles, which this ECRL "
            f"never loads; continue the run once with --strategy blocking under the ECRL that "
            f"wrote it (or start a new run)")


class _Record:
    """A DCP metadata object as plain data: the attributes its pickle sets, nothing called."""

    def __init__(self, *args: Any) -> None:
        self.args = args


_DCP_CLASSES = {
    ("torch.distributed.checkpoint.metadata", "Metadata"),
    ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
    ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
    ("torch.distributed.checkpoint.metadata", "StorageMeta"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
}
_RECORDS = {name: type(name, (_Record,), {}) for _module, name in _DCP_CLASSES}


class _MetadataUnpickler(pickle.Unpickler):
    """Parses a format-3 ``.metadata`` without calling anything: DCP's metadata dataclasses
    become :class:`_Record` subclasses of the same name, a path its string; every other global
    is refused instead of imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _DCP_CLASSES:
            return _RECORDS[name]
        if module in ("pathlib", "pathlib._local") and name in ("PosixPath", "PurePosixPath"):
            return _path
        raise pickle.UnpicklingError(f"it names {module}.{name}, which is not part of the DCP "
                                     "metadata of a byte-chunk checkpoint")


def _path(*parts: object) -> str:
    """A pickled path (its parts) as a string: DCP records where the checkpoint was written."""
    return "/".join(map(str, parts))


ChunkPlace = tuple[str, int, int]
"""Where a chunk lies: (part's file name, byte offset, length)."""


def _is(obj: object, name: str) -> bool:
    return isinstance(obj, _RECORDS[name])


def chunk_locations(ckpt: VerifiedShards) -> dict[str, ChunkPlace]:
    """Chunk key → where DCP's ``.metadata`` says its bytes lie, refused in one line naming the
    field and the file unless each is the whole chunk inside a part the manifest covers (a plain
    file name: not absolute, no ``..``, not the metadata or the manifest)."""
    path = ckpt.path / METADATA_FILE
    try:
        with safepath.read_regular(path, error=CheckpointError) as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise CheckpointError(f"{path}: part of the checkpoint is missing") from None
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read: {exc.strerror}") from None
    parts: dict[str, Any] = ckpt.manifest["parts"]
    check_part(path, parts[METADATA_FILE],
               f"{CHECKSUM_ALGORITHM}:{hashlib.sha256(raw).hexdigest()}", len(raw))
    try:
        metadata = _MetadataUnpickler(io.BytesIO(raw)).load()
    except Exception as exc:  # a crafted pickle can make the parser raise anything
        raise CheckpointError(f"{path}: refused DCP metadata ({exc})") from None
    entries = getattr(metadata, "state_dict_metadata", None)
    storage = getattr(metadata, "storage_data", None)
    if not _is(metadata, "Metadata") or not isinstance(entries, dict) \
            or not isinstance(storage, dict):
        raise CheckpointError(f"{path}: not DCP metadata (no state_dict_metadata and "
                              "storage_data tables)")
    sizes = {str(c["key"]): int(c["nbytes"]) for c in ckpt.manifest["chunks"]}
    if set(entries) != set(sizes) or not all(_is(e, "BytesStorageMetadata")
                                             for e in entries.values()):
        raise CheckpointError(f"{path}: state_dict_metadata holds {sorted(map(str, entries))}, "
                              f"the manifest's chunks are byte entries {sorted(sizes)}")
    found: dict[str, ChunkPlace] = {}
    for index, info in storage.items():
        key = getattr(index, "fqn", None)
        where = f"{path}: storage_data of chunk {key!r}"
        if not _is(index, "MetadataIndex") or not _is(info, "_StorageInfo") \
                or key not in sizes or key in found or getattr(index, "offset", None) is not None:
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
        found[str(key)] = (str(relative), offset, length)
    if set(found) != set(sizes):
        raise CheckpointError(f"{path}: storage_data does not place chunk(s) "
                              f"{sorted(set(sizes) - set(found))}")
    return found
