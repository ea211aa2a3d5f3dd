"""The resume state on disk: ``resume.ckpt`` and its blobs, owner-only, atomic, checked on read.

Format: ``ECRL-RESUME\\n``, one JSON header line, then the payload (one pickle). The header names
the program (a fingerprint of its source and plan), the region, entry and hint the state belongs
to, the anchors' kinds, the globals the payload may import, the blobs it refers to, and a
SHA-256 over the rest of the header and the payload. Blobs (large arrays, strings, tensor
storages) are files ``blob-<sha256>`` beside it, written once while their content is unchanged,
and checked against their name when read.

Every file is written with :mod:`ecrl.contract.atomicio`'s protocol (temporary file, fsync,
rename, directory fsync): blobs first, then ``resume.ckpt``; blobs no state refers to any more are
removed after. A kill at any moment leaves the previous state or the new one, whole, with its
blobs; temporary files a kill left behind are removed when the program starts again.

Trust: the payload is a pickle. The directory is created owner-only (0700) and the files are
0600; a state file or directory that is not the user's, or that group or others may write, is
refused before anything is read (docs/transform.md, "Trust model").
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ecrl.contract.atomicio import atomic_write_bytes, fsync_dir
from transform.runtime._exit import CheckpointError

__all__ = ["STATE_FILE", "DEFAULT_ROOT", "StoredState", "StateDir", "resolve_directory"]

STATE_FILE = "resume.ckpt"
DEFAULT_ROOT = ".ecrl-ckpt"
_MAGIC = b"ECRL-RESUME\n"
_FORMAT = 2
_BLOB = "blob-"


class StoredState:
    """A resume state read from disk: the header now, the values when the walk needs them."""

    def __init__(self, header: dict[str, Any], data: bytes) -> None:
        self.header = header
        self.data = data
        self.region: str = header["region"]
        self.entry: int = header["entry"]
        self.hint: int = header["hint"]
        self.payload: dict[str, Any] | None = None


def resolve_directory(file: str, configured: str | None) -> Path:
    """Where the program keeps its resume state: absolute, resolved once at start, so a program
    that changes directory reads and writes the same state."""
    env = os.environ.get("ECRL_CKPT_DIR")
    if env:
        where = Path(env)
    elif configured:
        where = Path(configured)
    else:
        where = Path(DEFAULT_ROOT) / Path(file).stem
    return Path(os.path.abspath(where))


def _checksum(header: dict[str, Any], data: bytes) -> str:
    rest = {k: v for k, v in header.items() if k != "sha256"}
    digest = hashlib.sha256(json.dumps(rest, sort_keys=True).encode())
    digest.update(b"\n")
    digest.update(data)
    return digest.hexdigest()


def _check_owner(path: Path, what: str) -> None:
    """Refuse a file or directory someone else could have written (it will be unpickled)."""
    st = path.stat()
    if st.st_uid != os.getuid():
        raise CheckpointError(f"{path} is not owned by you (uid {st.st_uid}): a resume state "
                              f"runs code when loaded, so it is never loaded; remove the {what} "
                              "to start over")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CheckpointError(f"{path} is writable by group or others: anyone could have "
                              f"replaced the resume state, so it is never loaded; remove the "
                              f"{what} to start over, or `chmod go-w {path}` if you trust it")


class StateDir:
    """The directory of one program's resume state."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE
        self.on_disk: set[str] = set()
        """Blobs known to be whole in the directory (written or checked by this process)."""

    # -- reading
    def read(self, fingerprint: str) -> StoredState | None:
        path = self.path
        if not path.exists():
            return None
        _check_owner(self.directory, "directory")
        _check_owner(path, "file")
        raw = path.read_bytes()
        what = f"{path} is not a resume state this program can use"
        if not raw.startswith(_MAGIC):
            raise CheckpointError(f"{what} (unknown format); remove it to start over")
        rest = raw[len(_MAGIC):]
        newline = rest.find(b"\n")
        try:
            header = json.loads(rest[:newline])
        except ValueError:
            raise CheckpointError(f"{what} (damaged header); remove it to start over") from None
        data = rest[newline + 1:]
        if not isinstance(header, dict) or header.get("format") != _FORMAT:
            found = header.get("format") if isinstance(header, dict) else None
            raise CheckpointError(f"{what} (format {found}); remove it to start over")
        if _checksum(header, data) != header.get("sha256"):
            raise CheckpointError(f"{path} is damaged (checksum mismatch): it is never loaded; "
                                  "remove it to start over")
        if header.get("program") != fingerprint:
            raise CheckpointError(f"{path} was written by a different version of this program; "
                                  "remove it to start over (or run the version that wrote it)")
        return StoredState(header, data)

    def blob(self, digest: str) -> bytes:
        """A blob's bytes, checked against its name."""
        path = self.directory / f"{_BLOB}{digest}"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointError(f"{path} is missing: the resume state cannot be loaded; "
                                  "remove the directory to start over") from None
        if hashlib.sha256(data).hexdigest() != digest:
            raise CheckpointError(f"{path} is damaged (checksum mismatch): it is never loaded; "
                                  "remove the directory to start over")
        self.on_disk.add(digest)
        return data

    # -- writing
    def clean(self) -> None:
        """At start: no temporary files of writes a kill interrupted."""
        if self.directory.is_dir():
            for stale in self.directory.glob(".*.tmp"):
                stale.unlink(missing_ok=True)

    def prepare(self) -> None:
        """Before the first save: an owner-only directory."""
        directory = self.directory
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = directory.stat()
        if st.st_uid != os.getuid():
            raise CheckpointError(f"{directory} is not owned by you (uid {st.st_uid}): the "
                                  "resume state is kept in an owner-only directory; set "
                                  "ECRL_CKPT_DIR to one of yours")
        if stat.S_IMODE(st.st_mode) & 0o077:
            directory.chmod(0o700)

    def write(self, header: dict[str, Any], data: bytes, blobs: dict[str, bytes],
              hook: Callable[[str], None] | None = None) -> int:
        """Write a state, its blobs first; the number of bytes written."""
        written = 0
        if not self.directory.is_dir():
            # Removed while the program ran: made again owner-only, and none of the blobs it
            # held can be taken as written.
            self.prepare()
            self.on_disk.clear()
        for digest, content in blobs.items():
            if digest in self.on_disk:
                continue
            target = self.directory / f"{_BLOB}{digest}"
            if not target.exists():
                atomic_write_bytes(target, content)
                written += len(content)
            self.on_disk.add(digest)
        header = {**header, "format": _FORMAT, "blobs": sorted(blobs)}
        header["sha256"] = _checksum(header, data)
        head = json.dumps(header, sort_keys=True).encode()
        state = _MAGIC + head + b"\n" + data
        atomic_write_bytes(self.path, state, hook=hook)
        self._collect(blobs)
        return written + len(state)

    def _collect(self, keep: Iterable[str]) -> None:
        """Blobs the state on disk no longer refers to."""
        wanted = set(keep)
        for path in self.directory.glob(f"{_BLOB}*"):
            digest = path.name[len(_BLOB):]
            if digest not in wanted:
                path.unlink(missing_ok=True)
                self.on_disk.discard(digest)

    def remove(self) -> None:
        """The program ended normally: its resume state is spent."""
        if not self.directory.is_dir():
            return
        if self.path.exists():
            self.path.unlink()
            fsync_dir(self.directory)
        self._collect(())
        for stale in self.directory.glob(".*.tmp"):
            stale.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # only when nothing else lives there
            if self.directory.parent.name == DEFAULT_ROOT:
                self.directory.parent.rmdir()
