"""Crash-safe file writes (torch-free), shared by run logs, checkpoints and generated programs.

The protocol for a file that readers must only ever see whole: write a temporary file in the same
directory, flush, ``fsync`` it, ``rename`` it over the target, then ``fsync`` the directory so the
rename itself survives a power loss. A reader sees the old file or the new one, never a mix.

``hook`` lets tests crash the process between protocol steps (see ``CRASH_POINTS``); it is called
with the name of the step about to run.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["CRASH_POINTS", "atomic_write_bytes", "atomic_write_text", "fsync_dir", "AppendLog"]

CRASH_POINTS = ("before-write", "before-fsync", "before-rename", "before-dir-fsync", "done")

Hook = Callable[[str], None] | None


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make the entries of ``directory`` (creations, renames) durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes | memoryview, *, hook: Hook = None
) -> None:
    """Replace ``path`` with ``data`` so that a crash at any moment leaves old or new, whole."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if hook:
                hook("before-write")
            handle.write(data)
            handle.flush()
            if hook:
                hook("before-fsync")
            os.fsync(handle.fileno())
        if hook:
            hook("before-rename")
        os.replace(tmp_name, target)
    except BaseException:
        # Never leave a half-written temporary behind on an ordinary error; a hard crash
        # (SIGKILL, os._exit) can, which is why readers ignore dot-prefixed *.tmp files.
        Path(tmp_name).unlink(missing_ok=True)
        raise
    if hook:
        hook("before-dir-fsync")
    fsync_dir(target.parent)
    if hook:
        hook("done")


def atomic_write_text(path: str | os.PathLike[str], text: str, *, hook: Hook = None) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), hook=hook)


class AppendLog:
    """A line-oriented log: each :meth:`append` writes one whole line and flushes it.

    Flushing hands the line to the kernel, so it survives the process being killed (SIGKILL,
    ``os._exit``); a line can only be torn if the process dies inside the ``write`` call itself.
    ``fsync=True`` additionally survives a machine crash, at a cost per record.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle = open(self.path, "ab", buffering=0)  # noqa: SIM115 - closed in close()
        self._fsync = fsync

    def append(self, line: bytes) -> None:
        # Unbuffered: one write() call per record, so no record is ever split across calls.
        self.write_line(line if line.endswith(b"\n") else line + b"\n")

    def write_line(self, line: bytes) -> None:
        """:meth:`append` of a line known to end with its newline (the hot path's shortcut)."""
        self._handle.write(line)
        if self._fsync:
            os.fsync(self._handle.fileno())

    def close(self) -> None:
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> AppendLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
