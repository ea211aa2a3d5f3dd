"""The resume state on disk: one file, ``resume.ckpt``, written atomically, checked on read.

Format: ``ECRL-RESUME\\n``, one JSON header line (format, program fingerprint, region, entry,
hint, payload kind, SHA-256 of the payload, anchor kinds), then the payload. Written with
:mod:`ecrl.contract.atomicio`'s protocol (temporary file, fsync, rename, directory fsync): a kill
at any moment leaves the previous state or the new one, whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ecrl.contract.atomicio import atomic_write_bytes, fsync_dir
from transform.runtime._exit import CheckpointError

__all__ = ["STATE_FILE", "DEFAULT_ROOT", "StoredState", "StateDir", "resolve_directory"]

STATE_FILE = "resume.ckpt"
DEFAULT_ROOT = ".ecrl-ckpt"
_MAGIC = b"ECRL-RESUME\n"
_FORMAT = 1


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
    """Where the program keeps its resume state."""
    env = os.environ.get("ECRL_CKPT_DIR")
    if env:
        return Path(env)
    if configured:
        return Path(configured)
    return Path(DEFAULT_ROOT) / Path(file).stem


class StateDir:
    """The directory of one program's resume state."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / STATE_FILE

    def read(self, fingerprint: str) -> StoredState | None:
        path = self.path
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
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
        if header.get("format") != _FORMAT:
            raise CheckpointError(f"{what} (format {header.get('format')}); remove it to start "
                                  "over")
        if hashlib.sha256(data).hexdigest() != header.get("sha256"):
            raise CheckpointError(f"{path} is damaged (checksum mismatch): it is never loaded; "
                                  "remove it to start over")
        if header.get("program") != fingerprint:
            raise CheckpointError(f"{path} was written by a different version of this program; "
                                  "remove it to start over (or run the version that wrote it)")
        return StoredState(header, data)

    def write(self, header: dict[str, Any], data: bytes,
              hook: Callable[[str], None] | None = None) -> None:
        header = {**header, "format": _FORMAT, "sha256": hashlib.sha256(data).hexdigest()}
        head = json.dumps(header, sort_keys=True).encode()
        atomic_write_bytes(self.path, _MAGIC + head + b"\n" + data, hook=hook)

    def remove(self) -> None:
        """The program ended normally: its resume state is spent."""
        try:
            self.path.unlink()
        except FileNotFoundError:
            return
        fsync_dir(self.directory)
        for stale in self.directory.glob(f".{STATE_FILE}.*.tmp"):
            stale.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            self.directory.rmdir()  # only when nothing else lives there
            if self.directory.parent.name == DEFAULT_ROOT:
                self.directory.parent.rmdir()
