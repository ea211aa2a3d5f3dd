"""The checkpoint file format (torch-free): a JSON header, raw tensor bytes, a SHA-256 footer.

::

    offset 0     b"ECRLCKP1"                       magic and format version
    offset 8     header length H (u64, little endian)
    offset 16    header: UTF-8 JSON, H bytes       {"format", "version", "meta", "tensors", "tree"}
    ...          zero padding to a multiple of 64
    data_start   tensor bytes, each entry 64-byte aligned, at header["tensors"][i]["offset"]
    size - 40    b"ECRLSHA2" + SHA-256 of every byte before the footer

Why not ``torch.save``: the training process must stop for as short a time as possible. Here
"serialising" a state is one ``memcpy`` per tensor into a buffer laid out exactly like the file
(see :mod:`ecrl.runtime.checkpoint.statepack`), so the background writer only has to hash and write
bytes, and can do so without importing torch. Loading never unpickles anything: the header is JSON,
so a tampered file cannot run code, and the footer's checksum is verified before a byte is trusted.

The image a writer receives is the file minus its footer plus :data:`FOOTER_SIZE` spare bytes;
:func:`seal` fills them in.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecrl.contract import safepath
from ecrl.contract.errors import EcrlError

__all__ = [
    "MAGIC",
    "FOOTER_SIZE",
    "ALIGN",
    "CHECKSUM_ALGORITHM",
    "CheckpointError",
    "Layout",
    "plan_layout",
    "encode_prefix",
    "seal",
    "checksum_of",
    "VerifiedCheckpoint",
    "read_verified",
    "check_committed",
    "parse_format_document",
]

MAGIC = b"ECRLCKP1"
FOOTER_TAG = b"ECRLSHA2"
DIGEST_SIZE = 32
FOOTER_SIZE = len(FOOTER_TAG) + DIGEST_SIZE
ALIGN = 64
CHECKSUM_ALGORITHM = "sha256"
FORMAT_NAME = "ecrl-statepack"
FORMAT_VERSION = 1
_PREFIX = struct.Struct("<8sQ")


class CheckpointError(EcrlError):
    """A checkpoint is missing, corrupt, or does not belong to this run."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True, kw_only=True, slots=True)
class Layout:
    """Where everything goes in a checkpoint image."""

    header: bytes
    """The encoded JSON header."""
    data_start: int
    """Offset of the first tensor byte (a multiple of :data:`ALIGN`)."""
    size: int
    """Bytes of the file before the footer."""

    @property
    def file_size(self) -> int:
        return self.size + FOOTER_SIZE


def plan_layout(*, meta: Mapping[str, Any], tensors: list[dict[str, Any]], tree: Any) -> Layout:
    """Assign each tensor entry (``dtype``, ``shape``, ``nbytes``, ``kind``) an aligned offset.

    Offsets are relative to ``data_start`` so that the header's length does not depend on them.
    """
    offset = 0
    for entry in tensors:
        entry["offset"] = offset
        offset = _align(offset + int(entry["nbytes"]))
    header = json.dumps(
        {"format": FORMAT_NAME, "version": FORMAT_VERSION, "meta": dict(meta),
         "tensors": tensors, "tree": tree},
        separators=(",", ":"), allow_nan=False,
    ).encode("utf-8")
    data_start = _align(_PREFIX.size + len(header))
    return Layout(header=header, data_start=data_start, size=data_start + offset)


def encode_prefix(layout: Layout, image: memoryview) -> None:
    """Write magic, header length, header and padding into the start of ``image``."""
    end = _PREFIX.size + len(layout.header)
    image[: _PREFIX.size] = _PREFIX.pack(MAGIC, len(layout.header))
    image[_PREFIX.size : end] = layout.header
    image[end : layout.data_start] = bytes(layout.data_start - end)


def seal(image: memoryview, size: int) -> str:
    """Hash ``image[:size]``, write the footer after it and return ``"sha256:<hex>"``.

    ``image`` must have :data:`FOOTER_SIZE` bytes to spare after ``size``.
    """
    digest = hashlib.sha256(image[:size]).digest()
    image[size : size + FOOTER_SIZE] = FOOTER_TAG + digest
    return f"{CHECKSUM_ALGORITHM}:{digest.hex()}"


def checksum_of(path: str | os.PathLike[str]) -> str:
    """The checksum a sealed checkpoint file claims in its footer (not verified)."""
    with safepath.read_regular(path, error=CheckpointError) as handle:
        handle.seek(-FOOTER_SIZE, os.SEEK_END)
        footer = handle.read(FOOTER_SIZE)
    if len(footer) != FOOTER_SIZE or not footer.startswith(FOOTER_TAG):
        raise CheckpointError(f"{path}: not a sealed ECRL checkpoint (no checksum footer)")
    return f"{CHECKSUM_ALGORITHM}:{footer[len(FOOTER_TAG):].hex()}"


def check_committed(path: Path, actual: str, expected: str | None) -> None:
    """Refuse a checkpoint whose checksum is not the one ``latest.json`` recorded for it."""
    if expected is not None and expected != actual:
        raise CheckpointError(
            f"{path}: checksum {actual[:23]}… differs from the {expected[:23]}… recorded "
            "in latest.json: the checkpoint was replaced or damaged after it was committed"
        )


def parse_format_document(path: Path, raw: bytes, *, name: str, version: int | tuple[int, ...]
                          ) -> dict[str, Any]:
    """The JSON object that describes a checkpoint (a file's header, a sharded checkpoint's
    manifest), refused in one line unless it names format ``name`` at ``version`` (or at one of
    several)."""
    versions = version if isinstance(version, tuple) else (version,)
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: header is not valid JSON ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != name:
        raise CheckpointError(f"{path}: header does not describe an {name} checkpoint")
    if document.get("version") not in versions:
        raise CheckpointError(
            f"{path}: checkpoint format version {document.get('version')!r}, this ECRL reads "
            f"{' and '.join(map(str, versions))}: resume with the ECRL version that wrote it"
        )
    return document


@dataclass(frozen=True, slots=True)
class VerifiedCheckpoint:
    """A checkpoint read whole and checked; ``data`` holds the file bytes (writable)."""

    path: Path
    header: dict[str, Any]
    data: bytearray
    data_start: int
    checksum: str

    @property
    def meta(self) -> dict[str, Any]:
        return dict(self.header.get("meta", {}))


def read_verified(path: str | os.PathLike[str], *, expected_checksum: str | None = None
                  ) -> VerifiedCheckpoint:
    """Read ``path`` whole, verify its footer (and ``expected_checksum``), parse its header.

    Every failure is a :class:`CheckpointError` naming the file and what is wrong with it.
    """
    p = Path(path)
    try:
        # Never through a link, never a FIFO: the bytes checked are those of this very file.
        with safepath.read_regular(p, error=CheckpointError) as handle:
            size = os.fstat(handle.fileno()).st_size
            data = bytearray(size)
            view = memoryview(data)
            got = 0
            while got < size:
                n = handle.readinto(view[got:])
                if not n:
                    break
                got += n
    except FileNotFoundError:
        raise CheckpointError(f"{p}: checkpoint file is missing") from None
    except OSError as exc:
        raise CheckpointError(f"{p}: cannot read checkpoint: {exc.strerror}") from None
    if got != size or size < _PREFIX.size + FOOTER_SIZE:
        raise CheckpointError(f"{p}: checkpoint is truncated ({got} bytes)")
    body = size - FOOTER_SIZE
    magic, header_len = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise CheckpointError(f"{p}: not an ECRL checkpoint (bad magic {magic!r})")
    footer = bytes(data[body:])
    if not footer.startswith(FOOTER_TAG):
        raise CheckpointError(f"{p}: checkpoint has no checksum footer (truncated or damaged)")
    digest = hashlib.sha256(memoryview(data)[:body]).digest()
    claimed = footer[len(FOOTER_TAG):]
    actual = f"{CHECKSUM_ALGORITHM}:{digest.hex()}"
    if digest != claimed:
        raise CheckpointError(
            f"{p}: checksum mismatch (footer says {CHECKSUM_ALGORITHM}:{claimed.hex()[:16]}…, "
            f"content hashes to {digest.hex()[:16]}…): the checkpoint is corrupt"
        )
    check_committed(p, actual, expected_checksum)
    if _PREFIX.size + header_len > body:
        raise CheckpointError(f"{p}: header length {header_len} runs past the end of the file")
    header = parse_format_document(p, bytes(data[_PREFIX.size : _PREFIX.size + header_len]),
                                   name=FORMAT_NAME, version=FORMAT_VERSION)
    data_start = _align(_PREFIX.size + header_len)
    for entry in header.get("tensors", []):
        if data_start + int(entry["offset"]) + int(entry["nbytes"]) > body:
            raise CheckpointError(f"{p}: a tensor runs past the end of the data section")
    return VerifiedCheckpoint(path=p, header=header, data=data, data_start=data_start,
                              checksum=actual)
