"""Paths inside a run directory that ECRL may read, write, rename or delete (torch-free).

Whoever can write the run directory (a shared file system, a run downloaded from elsewhere) can
plant a symbolic link or a special file where ECRL expects its own files. Following a link would
let them point ECRL's reads at bytes no checksum covers and its writes, renames and deletions at
another directory; opening a FIFO blocks forever. So the checkpoint code never follows a link
and never opens anything but a regular file or a real directory: each path is a plain name (or
relative path without ``..``) under its parent, checked with ``lstat`` before it is used, and
files are opened with ``O_NOFOLLOW`` and checked again with ``fstat`` on the open descriptor
(which is what is then read or written, whatever happens to the name afterwards). The run
format's readers (:mod:`ecrl.contract.runformat`) open their files with the same
:func:`open_regular`, below the run root.

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

__all__ = ["UnsafePathError", "UnsafeFileError", "check_name", "check_relative", "kind_name",
           "kind_of", "check_entry", "require_dir", "open_regular", "read_regular",
           "remove_entry"]


class UnsafePathError(EcrlError):
    """A path in a run directory is a link, a special file, or leads outside its directory."""


class UnsafeFileError(OSError):
    """What :func:`open_regular` found instead of a regular file (``strerror``: one line)."""

    def __init__(self, path: str, kind: str, message: str) -> None:
        super().__init__(errno.EINVAL, message, path)
        self.kind = kind


ErrorType = type[EcrlError]

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def kind_name(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words (``a FIFO``, ``a symbolic link``, …)."""
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _describe(path: Path, mode: int) -> str:
    """The checkpoint code's one line for what is at ``path`` instead of its file."""
    if stat.S_ISLNK(mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        return f"{path}: is a symbolic link (to {target}); refused: ECRL never follows a link " \
               "in a run directory"
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return f"{path}: is {kind_name(mode)}, not a file; refused"
    return f"{path}: is not a regular file or directory; refused"


def _unsafe(path: str, mode: int, error: ErrorType | None) -> Exception:
    if error is not None:
        return error(_describe(Path(path), mode))
    kind = kind_name(mode)
    return UnsafeFileError(path, kind, f"{kind}, not a regular file (a run directory's files are "
                                       "never followed through links or read from special files)")


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


def _lstat_mode(path: str | os.PathLike[str]) -> int | None:
    try:
        return os.lstat(path).st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None


def check_entry(path: str | os.PathLike[str], *, directory: bool = False) -> str | None:
    """Why ``path`` (not followed) is not a regular file (or, with ``directory``, a directory),
    in words; None when it is, or when nothing is there."""
    mode = _lstat_mode(path)
    if mode is None:
        return None
    ok = stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)
    return None if ok else kind_name(mode)


def kind_of(path: str | os.PathLike[str], *, error: ErrorType = UnsafePathError) -> str | None:
    """``"file"``, ``"dir"`` or None (nothing there), by ``lstat``; a link or a special file is
    refused."""
    mode = _lstat_mode(path)
    if mode is None:
        return None
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    raise error(_describe(Path(path), mode))


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


def _inside(path: str, root: str) -> list[str]:
    rel = os.path.relpath(os.path.abspath(path), os.path.abspath(root))
    if rel in (os.curdir, os.pardir) or rel.startswith(os.pardir + os.sep) or os.path.isabs(rel):
        raise OSError(errno.EXDEV, "outside the run directory, not read", path)
    return rel.split(os.sep)


def _open_folders(root: str, folders: list[str], path: str) -> int:
    """A descriptor of ``root/folders…``, each component opened relative to its parent without
    following a link (no component can be swapped for a link between a check and the open)."""
    dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    where = root
    try:
        for part in folders:
            where = os.path.join(where, part)
            try:
                nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
            except OSError as exc:
                if exc.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                kind = kind_name(os.lstat(part, dir_fd=dirfd).st_mode)
                raise UnsafeFileError(path, kind, (
                    f"its folder {os.path.relpath(where, root)} is {kind}, not a directory "
                    "(links are never followed in a run directory)")) from None
            os.close(dirfd)
            dirfd = nxt
    except BaseException:
        os.close(dirfd)
        raise
    return dirfd


def open_regular(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None,
                 write: bool = False, create: bool = False,
                 error: ErrorType | None = UnsafePathError) -> int:
    """A (blocking) descriptor of the regular file ``path``, opened without following a link and
    without waiting on a FIFO; ``write``: read-write, ``create``: created when missing.

    ``root``: the run directory; ``path`` must lie inside it and every folder on the way is
    opened without following a link too (the root itself is the user's choice and is followed).
    Anything but a regular file is refused before a byte is read: ``error`` with the checkpoint
    code's line, or with ``error=None`` an :class:`UnsafeFileError` (an :class:`OSError`, which
    the run format's readers report like any unreadable file). A missing file not created is
    :class:`FileNotFoundError`."""
    p = os.fspath(path)
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= os.O_RDWR if write else os.O_RDONLY
    if create:
        flags |= os.O_CREAT
    dirfd, name = None, p
    if root is not None:
        *folders, name = _inside(p, os.fspath(root))
        dirfd = _open_folders(os.fspath(root), folders, p)
    try:
        try:
            fd = os.open(name, flags, 0o644, dir_fd=dirfd)
        except OSError as exc:
            # a link (ELOOP; EMLINK on some systems); a FIFO opened for writing or a socket
            if exc.errno in (errno.ELOOP, errno.EMLINK, errno.ENXIO, errno.EOPNOTSUPP):
                raise _unsafe(p, os.lstat(name, dir_fd=dirfd).st_mode, error) from None
            raise
    finally:
        if dirfd is not None:
            os.close(dirfd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _unsafe(p, mode, error)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str | os.PathLike[str], *, error: ErrorType | None = UnsafePathError
                 ) -> io.FileIO:
    """The regular file ``path`` opened for reading (unbuffered), link and FIFO refused
    (``error``: as in :func:`open_regular`)."""
    return io.FileIO(open_regular(path, error=error), "rb", closefd=True)


def remove_entry(path: str | os.PathLike[str]) -> None:
    """Remove what is at ``path`` itself: a link is unlinked (its target untouched), a real
    directory removed with its contents (``shutil.rmtree`` never follows links inside it), a file
    unlinked; nothing there is fine."""
    p = Path(path)
    mode = _lstat_mode(p)
    if mode is None:
        return
    if stat.S_ISDIR(mode):
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)
