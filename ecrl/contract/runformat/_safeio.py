"""Opening a run directory's files when someone else may be able to write the directory.

A run directory is data, and whoever can write it can plant anything there: a symlink from a
rank log to ``/etc/passwd`` or ``/dev/zero``, ``logs/`` as a link to another directory, a FIFO
that blocks the first ``open`` for good, a line of gigabytes. Every reader of the run format
therefore opens files through :func:`ecrl.contract.safepath.open_regular`:

- each directory component below the run root is opened with ``O_NOFOLLOW | O_DIRECTORY``
  relative to its parent's descriptor (``openat``), so no link is followed on the way and no
  component can be swapped between a check and the open;
- the file itself is opened with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO opens at once instead of
  waiting for a writer) and ``fstat`` must say it is a regular file (not a FIFO, device, socket);
- a path that is not lexically inside the root is refused.

The root itself is what the user named (a link there is their choice and is followed). Nothing is
read before these checks pass, so a refusal never shows a byte of another file. Reads are bounded
by the callers: whole-file records by :data:`MAX_RECORD_BYTES`, lines of JSON-lines files by
:data:`MAX_LINE_BYTES` (``docs/run-format.md``), in chunks of :data:`CHUNK_BYTES`.
"""

from __future__ import annotations

import errno
import os

from ecrl.contract import safepath
from ecrl.contract.safepath import check_entry

__all__ = ["MAX_LINE_BYTES", "MAX_RECORD_BYTES", "CHUNK_BYTES", "open_regular",
           "read_small_file", "check_entry"]

MAX_LINE_BYTES = 1 << 20
"""Longest line (without its newline) a JSON-lines file of the run format may hold: 1 MiB. A step
record of 4096 logged IDs is about 40 KiB; a longer line was not written by ECRL."""

MAX_RECORD_BYTES = 16 << 20
"""Largest whole-file JSON record (``run.json``, ``supervisor.json``, ``latest.json``, …)."""

CHUNK_BYTES = 64 << 10
"""Bytes read per call by the bounded readers."""


def open_regular(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
                 ) -> int:
    """:func:`ecrl.contract.safepath.open_regular` for reading, its refusals an :class:`OSError`
    (one line in ``strerror``) like any file the readers cannot read."""
    return safepath.open_regular(path, root=root, error=None)


def read_small_file(path: str | os.PathLike[str], *, limit: int,
                    root: str | os.PathLike[str] | None = None) -> bytes:
    """The bytes of a small regular file of the run directory (:func:`open_regular`: no link
    followed, below ``root`` none on the way either; no FIFO or device waited on), at most
    ``limit`` of them: a larger file is an :class:`OSError` (``EFBIG``) after reading at most
    ``limit + 1`` bytes."""
    fd = open_regular(path, root=root)
    try:
        chunks: list[bytes] = []
        got = 0
        while got <= limit:
            chunk = os.read(fd, min(CHUNK_BYTES, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes, not read", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)
