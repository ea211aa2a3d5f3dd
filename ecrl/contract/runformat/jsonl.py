"""Reading and writing records: JSON-lines step and checkpoint logs, whole-file records.

JSON-lines files are appended one whole line per ``write`` and flushed, so the only damage a
killed process can do is a torn last line (no trailing newline). :class:`JsonlReader` tolerates
exactly that, where the caller says the file belongs to a failed attempt, and reports it as a
warning; every other defect is a :class:`~ecrl.contract.errors.RunFormatError` at ``file:line``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from ecrl.contract.atomicio import AppendLog, atomic_write_bytes
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat._json import JSON_ERRORS, dumps_line, loads
from ecrl.contract.runformat._record import Record
from ecrl.contract.runformat._safeio import (
    CHUNK_BYTES,
    MAX_LINE_BYTES,
    MAX_RECORD_BYTES,
    open_regular,
    read_small_file,
)

__all__ = ["TornLine", "JsonlReader", "JsonlWriter", "read_json_record", "write_json_record"]


@dataclass(frozen=True, slots=True)
class TornLine:
    """A warning: the last line of a failed attempt's file was cut short by the crash."""

    path: str
    line: int
    preview: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: torn last line ignored (crash while writing): " \
               f"{self.preview!r}"


R = TypeVar("R", bound=Record)


class JsonlReader(Generic[R]):
    """Stream ``(line_number, record)`` from a JSON-lines file, in constant memory.

    ``torn_tail_ok``: the file belongs to an attempt that crashed, so a last line without its
    newline is expected; it is skipped and appended to :attr:`warnings`. Otherwise, and for any
    defect elsewhere, :class:`RunFormatError` names the file and line.

    The file is opened with :func:`~ecrl.contract.runformat._safeio.open_regular` (no link
    followed — below ``root`` none on the way either —, no FIFO, device or socket) and read in
    chunks of :data:`CHUNK_BYTES`; a line longer than ``max_line`` bytes
    (:data:`MAX_LINE_BYTES` unless given) is a :class:`RunFormatError` as soon as that many bytes
    have been read without a newline, so memory stays bounded whatever the file holds.
    """

    def __init__(self, path: str | os.PathLike[str], record: type[R], *, torn_tail_ok: bool,
                 root: str | os.PathLike[str] | None = None,
                 max_line: int = MAX_LINE_BYTES) -> None:
        self.path = str(path)
        self.record = record
        self.torn_tail_ok = torn_tail_ok
        self.root = root
        self.max_line = max_line
        self.warnings: list[TornLine] = []

    def _too_long(self, number: int) -> RunFormatError:
        return RunFormatError(self.path, number, f"line longer than {self.max_line} bytes (the "
                              "run format's limit, docs/run-format.md); not read further")

    def raw(self) -> Iterator[tuple[int, Any]]:
        """``(line_number, parsed JSON)`` without record validation (fast path for checkers)."""
        try:
            fd = open_regular(self.path, root=self.root)
        except OSError as exc:
            raise RunFormatError(self.path, None, f"cannot read: {exc.strerror}") from None
        try:
            number = 0
            pending = bytearray()
            while True:
                chunk = os.read(fd, CHUNK_BYTES)
                if not chunk:
                    break
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    number += 1
                    if pending:
                        pending += chunk[start:end]
                        line, pending = bytes(pending), bytearray()
                    else:
                        line = chunk[start:end]
                    start = end + 1
                    if len(line) > self.max_line:
                        raise self._too_long(number)
                    if not line.strip():
                        raise RunFormatError(self.path, number, "empty line")
                    try:
                        parsed = loads(line)
                    except JSON_ERRORS as exc:
                        raise RunFormatError(self.path, number,
                                             f"not valid JSON ({exc})") from None
                    yield number, parsed
                pending += chunk[start:]
                if len(pending) > self.max_line:
                    raise self._too_long(number + 1)
            if pending:
                # Only the last line can lack its newline.
                if self.torn_tail_ok:
                    preview = bytes(pending[:60]).decode("utf-8", "replace")
                    self.warnings.append(TornLine(self.path, number + 1, preview))
                    return
                raise RunFormatError(
                    self.path, number + 1,
                    "last line is incomplete (no newline), but this attempt did not crash")
        finally:
            os.close(fd)

    def __iter__(self) -> Iterator[tuple[int, R]]:
        for number, data in self.raw():
            yield number, self.record.from_dict(data, where=(self.path, number))


class JsonlWriter:
    """Append records to a JSON-lines file, one flushed line each."""

    def __init__(self, path: str | os.PathLike[str], *, fsync: bool = False) -> None:
        self._log = AppendLog(path, fsync=fsync)
        self.path = self._log.path

    def write(self, record: Record) -> None:
        self.write_dict(record.to_dict())

    def write_dict(self, fields: dict[str, Any]) -> None:
        """One record given as the dict its ``to_dict()`` returns (a hot path's shortcut)."""
        self._log.write_line(dumps_line(fields))

    def close(self) -> None:
        self._log.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_json_record(path: str | os.PathLike[str], record: Record, *,
                      hook: Callable[[str], None] | None = None) -> None:
    """Atomically replace ``path`` with ``record`` (pretty-printed: people read these files).

    ``hook`` is passed to :func:`ecrl.contract.atomicio.atomic_write_bytes` (crash tests).
    """
    text = json.dumps(record.to_dict(), indent=2, sort_keys=False, allow_nan=False) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), hook=hook)


def read_json_record(path: str | os.PathLike[str], record: type[R], *,
                     root: str | os.PathLike[str] | None = None,
                     limit: int = MAX_RECORD_BYTES) -> R:
    """Read and validate a whole-file JSON record (:func:`read_small_file`: at most ``limit``
    bytes of a regular file, no link followed)."""
    p = str(path)
    try:
        data = read_small_file(p, limit=limit, root=root)
    except FileNotFoundError:
        raise RunFormatError(p, None, "file is missing") from None
    except OSError as exc:
        raise RunFormatError(p, None, f"cannot read: {exc.strerror}") from None
    try:
        parsed = loads(data)
    except JSON_ERRORS as exc:
        raise RunFormatError(p, None, f"not valid JSON ({exc})") from None
    return record.from_dict(parsed, where=(p, None))
