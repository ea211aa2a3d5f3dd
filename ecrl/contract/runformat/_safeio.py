"""Opening a run directory's files when someone else may be able to write the directory.

A run directory is data, and whoever can write it can plant anything there: a symlink from a
rank log to ``/etc/passwd`` or ``/dev/zero``, ``logs/`` as a link to another directory, a FIFO
that blocks the first ``open`` for good, a line of gigabytes. Every reader of the run format
therefore opens files through :func:`open_regular`:

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
import stat

__all__ = ["MAX_LINE_BYTES", "MAX_RECORD_BYTES", "CHUNK_BYTES", "open_regular", "read_bounded",
           "check_entry"]

MAX_LINE_BYTES = 1 << 20
"""Longest line (without its newline) a JSON-lines file of the run format may hold: 1 MiB. A step
record of 4096 logged IDs is about 40 KiB; a longer line was not written by ECRL."""

MAX_RECORD_BYTES = 16 << 20
"""Largest whole-file JSON record (``run.json``, ``supervisor.json``, ``latest.json``, …)."""

CHUNK_BYTES = 64 << 10
"""Bytes read per call by the bounded readers."""

_KINDS = ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _refuse(path: str, what: str) -> OSError:
    return OSError(errno.EINVAL, f"{what}, not a regular file (a run directory's files are never "
                                 "followed through links or read from special files)", path)


def _parts(path: str, root: str) -> list[str]:
    full, base = os.path.abspath(path), os.path.abspath(root)
    rel = os.path.relpath(full, base)
    if rel == os.curdir or rel == os.pardir or rel.startswith(os.pardir + os.sep) \
            or os.path.isabs(rel):
        raise OSError(errno.EXDEV, "outside the run directory, not read", path)
    return rel.split(os.sep)


def open_regular(path: str | os.PathLike[str], *, root: str | os.PathLike[str] | None = None
                 ) -> int:
    """A read-only descriptor of the regular file ``path``; :class:`OSError` (its ``strerror``
    one line, its ``filename`` the path) for anything else — see the module docstring.

    ``root``: the run directory; every component of ``path`` below it must be a real directory.
    Without it only the file itself is checked."""
    p = os.fspath(path)
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    if root is None:
        dirfd, name, where = None, p, p
    else:
        parts = _parts(p, os.fspath(root))
        dirfd = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY)
        where = os.fspath(root)
        try:
            for part in parts[:-1]:
                where = os.path.join(where, part)
                try:
                    nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                  dir_fd=dirfd)
                except OSError as exc:
                    if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                        info = os.lstat(part, dir_fd=dirfd)
                        inside = os.path.relpath(where, os.fspath(root))
                        raise OSError(errno.EINVAL, f"its folder {inside} is "
                                      f"{_kind(info.st_mode)}, not a directory (links are never "
                                      "followed in a run directory)", p) from None
                    raise
                os.close(dirfd)
                dirfd = nxt
        except BaseException:
            os.close(dirfd)
            raise
        name, where = parts[-1], p
    try:
        fd = os.open(name, flags, dir_fd=dirfd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _refuse(where, "a symbolic link") from None
        if exc.errno in (errno.ENXIO, errno.EOPNOTSUPP):  # a socket (or FIFO without reader)
            info = os.lstat(name, dir_fd=dirfd)
            raise _refuse(where, _kind(info.st_mode)) from None
        raise
    finally:
        if dirfd is not None:
            os.close(dirfd)
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _refuse(where, _kind(mode))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bounded(path: str | os.PathLike[str], *, limit: int,
                 root: str | os.PathLike[str] | None = None) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes (:func:`open_regular`); larger is an
    :class:`OSError` (``EFBIG``) after reading at most ``limit + 1`` bytes."""
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


def check_entry(path: str | os.PathLike[str], *, directory: bool = False) -> str | None:
    """Why ``path`` (not followed) is not a regular file (or, with ``directory``, a directory);
    None when it is, or when it does not exist."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    ok = stat.S_ISDIR(mode) if directory else stat.S_ISREG(mode)
    return None if ok else _kind(mode)
