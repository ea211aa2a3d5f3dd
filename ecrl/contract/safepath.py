"""Paths inside a run directory that ECRL may read, write, rename or delete (torch-free).

Whoever can write the run directory (a shared file system, a run downloaded from elsewhere) can
plant a symbolic link or a special file where ECRL expects its own files. Following a link would
let them point ECRL's reads at bytes no checksum covers and its writes, renames and deletions at
another directory; opening a FIFO blocks forever. So the checkpoint code never follows a link
and never opens anything but a regular file or a real directory: each path is a plain name (or
relative path without ``..``) under its parent, checked with ``lstat`` before it is used, and
files are opened with ``O_NOFOLLOW`` and checked again with ``fstat`` on the open descriptor
(which is what is then read or written, whatever happens to the name afterwards).

What this cannot stop is an attacker who changes a *directory* while ECRL works inside it (swaps
``checkpoints/.step-….tmp`` for a link between the check and DCP's open of a part): that race
needs descriptor-relative I/O all the way down to DCP's writer. The threat model in
``docs/strategies.md`` says so.

Every refusal is one line naming the path and what was found there; the caller chooses the
exception class (:class:`ecrl.contract.ckptfile.CheckpointError` in the checkpoint code) so that
a refused file is handled like any other damaged checkpoint.
"""

from __future__ import annotations

import errno
import io
import os
import shutil
import stat
from pathlib import Path, PurePosixPath

from ecrl.contract.errors import EcrlError

__all__ = ["UnsafePathError", "check_name", "check_relative", "kind_of", "require_dir",
           "open_regular", "read_regular", "remove_entry"]


class UnsafePathError(EcrlError):
    """A path in a run directory is a link, a special file, or leads outside its directory."""


ErrorType = type[EcrlError]

_SPECIAL = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _describe(path: Path, mode: int) -> str:
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{path}: is a symbolic link (to {target}); refused: ECRL never follows a link " \
               "in a run directory"
    for test, what in _SPECIAL:
        if test(mode):
            return f"{path}: is {what}, not a file; refused"
    return f"{path}: is not a regular file or directory; refused"


def check_name(name: str, *, where: str | os.PathLike[str], error: ErrorType = UnsafePathError
               ) -> str:
    """``name`` when it is one plain path component (no ``/``, not ``.``/``..``, no NUL)."""
    if not isinstance(name, str) or name in ("", ".", "..") or "/" in name or "\0" in name:
        raise error(f"{where}: {name!r} is not a plain file name inside its directory; refused")
    return name


def check_relative(relative: object, *, where: str | os.PathLike[str],
                   error: ErrorType = UnsafePathError) -> PurePosixPath:
    """``relative`` as a path that stays inside the directory it is relative to: not absolute,
    no ``..`` component, no NUL."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        raise error(f"{where}: {relative!r} is not a relative path; refused")
    pure = PurePosixPath(relative)
    if pure.is_absolute():
        raise error(f"{where}: {relative!r} is an absolute path; refused (a path inside the "
                    "directory is expected)")
    if ".." in pure.parts:
        raise error(f"{where}: {relative!r} leads out of its directory (..); refused")
    return pure


def kind_of(path: str | os.PathLike[str], *, error: ErrorType = UnsafePathError) -> str | None:
    """``"file"``, ``"dir"`` or None (nothing there), by ``lstat``; a link or a special file is
    refused."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    raise error(_describe(p, mode))


def require_dir(path: str | os.PathLike[str], *, error: ErrorType = UnsafePathError,
                missing: str = "is missing") -> Path:
    """``path`` when it is a real directory (not a link to one)."""
    p = Path(path)
    kind = kind_of(p, error=error)
    if kind is None:
        raise error(f"{p}: {missing}")
    if kind != "dir":
        raise error(f"{p}: is a file where a directory is expected; refused")
    return p


def open_regular(path: str | os.PathLike[str], *, write: bool = False, create: bool = False,
                 error: ErrorType = UnsafePathError) -> int:
    """A descriptor of the regular file ``path``, opened without following a link and without
    blocking on a FIFO (``write``: read-write; ``create``: created when missing). Raises
    :class:`FileNotFoundError` when it is missing and not created."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_RDWR if write else os.O_RDONLY
    if create:
        flags |= os.O_CREAT
    p = Path(path)
    try:
        fd = os.open(p, flags, 0o644)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO):  # a link; a FIFO (write)
            raise error(_describe(p, os.lstat(p).st_mode)) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise error(_describe(p, mode))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], *, error: ErrorType = UnsafePathError
                 ) -> io.FileIO:
    """The regular file ``path`` opened for reading (unbuffered), link and FIFO refused."""
    return io.FileIO(open_regular(path, error=error), "rb", closefd=True)


def remove_entry(path: str | os.PathLike[str]) -> None:
    """Remove what is at ``path`` itself: a link is unlinked (its target untouched), a real
    directory removed with its contents (``shutil.rmtree`` never follows links inside it), a file
    unlinked; nothing there is fine."""
    p = Path(path)
    try:
        mode = os.lstat(p).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
