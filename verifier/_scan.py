"""Streaming a rank's step log as column batches, fast when the log is what the runtime writes.

A verifier that builds one Python object per field of every record runs at a third of the speed
of merely parsing the file, and the runs it checks have tens of millions of records. So each
block of lines goes through one of two paths that return the same :class:`Batch`:

*Fast path.* The runtime writes records with :class:`ecrl.contract.runformat.JsonlWriter`: compact
JSON whose first ten keys are always ``schema_version, attempt, global_step, epoch, cursor_step,
rank, world_size, local_batch, sample_ids_count, sample_ids_hash`` in that order. For a rank log
whose next records are correct, every byte of that *prefix* is predictable: the attempt, rank, world
size and local batch are fixed, the steps continue from the last one, ``(epoch, cursor_step)``
follow from the step, and the hash is the expected shard's hash (:mod:`ecrl.contract.semantics`).
The fast path builds the expected prefixes of the whole block with numpy and compares them byte for
byte with the lines (one gather of each line's first ``P`` bytes through a sliding-window view).
That single comparison proves all ten fields of every record in the block. The rest of each line
(loss, time, extra fields) is still parsed by orjson, but as small objects: the proven prefixes
are left out of a copy of the block (all but each line's ``{``), newlines become commas, and the
block is parsed as one JSON array.

In a run that logs sample IDs the list ``"sample_ids":[...]`` of every line is proven the same
way where the runtime wrote it (compact decimal integers, :func:`_id_lists`): each list is exactly
as long as its expected shard written out, holds only digits and single commas, and numpy's C
number reader reads the block's lists as the expected shards; then they are left out too, so that
the parse sees ``"sample_ids":[]``. The IDs are never built as Python objects. Any other form of
the list (blanks, a second list under the key, a float) is parsed and compared as Python lists.

The parse of what is left runs with Python's cyclic garbage collector held off: it makes a few
thousand small dicts per block, all freed with the block, and collections that find nothing to
free took a tenth of the verifier's time.

That array parse is exactly equivalent to parsing each line on its own, because (1) the block
has exactly one ``{`` per line, at its first byte, and one ``}`` per line, at its last byte, so
(2) the parse can only return one object per line when no ``{`` hides in a string and no line's
object extends into the next, which (3) we check (``len == lines``). A line whose remainder after
the prefix is just ``}`` would become a valid empty object although the original line ends in a
trailing comma; requiring ``loss`` and ``time`` rules that out, and requiring that no remainder
repeats a prefix key rules out JSON's last-duplicate-wins silently overriding a checked field.

*Compiled.* Where the install built ``verifier._native`` (``verifier/_native.c``, an optional
C extension, ``setup.py``), the byte comparisons above — prefixes, braces, ID lists — and the copy
of what is left run in one pass per line (:meth:`RankLog._fast_native`); the expected values are
the same arrays, and what it accepts is what the numpy version accepts (a canonical decimal is
the only text whose length, byte classes and value all match). The tests of this module run
against both.

*Slow path.* Anything else — the first deviation from the expected records, a different writer,
damaged lines — goes line by line through
:meth:`ecrl.contract.runformat.StepRecord.from_dict`, which names ``file:line`` for every schema
error, and yields the columns for the checker to judge. The
fast path never accepts a block the slow path would reject or read differently; a property test
(``tests/verifier/test_scan.py``) holds it to that.
"""

from __future__ import annotations

import operator
import os
from collections.abc import Iterator, Set
from dataclasses import dataclass, fields
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.lib.stride_tricks import as_strided

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.gcpause import collection_paused
from ecrl.contract.runformat import MAX_LINE_BYTES, SCHEMA_VERSION, StepRecord, loads, open_regular
from verifier._rests import numeric_rests

try:  # the compiled fast path (an optional build, setup.py); else the numpy one below
    import verifier._native as native
except ImportError:  # pragma: no cover - a build without a C compiler
    native = None  # type: ignore[assignment]

__all__ = ["Batch", "RankLog", "PREFIX_KEYS", "BLOCK_BYTES"]

BLOCK_BYTES = 1 << 20
"""Bytes read per block: large enough to amortise numpy's per-call cost, small enough for 64
ranks' blocks to sit in memory at once."""

PREFIX_KEYS: tuple[str, ...] = ("schema_version", *(
    f.name for f in fields(StepRecord) if f.name != "extra"))[:10]
"""The keys JsonlWriter writes first, in order (StepRecord's field order)."""

_INT_KEYS = ("attempt", "global_step", "epoch", "cursor_step", "rank", "world_size",
             "local_batch", "sample_ids_count")
_POW10 = 10 ** np.arange(19, dtype=np.int64)
_ZERO, _NINE = ord("0"), ord("9")
_LBRACE, _RBRACE, _LBRACKET, _RBRACKET, _COMMA, _NL, _SPACE = (
    ord("{"), ord("}"), ord("["), ord("]"), ord(","), ord("\n"), ord(" "))
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
_get_loss = operator.itemgetter("loss")
_get_time = operator.itemgetter("time")
_get_ids = operator.itemgetter("sample_ids")
_MESH_KEYS = ("dp_rank", "dp_size", "tp_rank", "tp_size")
_VARIABLE_KEYS = ("global_step", "epoch", "cursor_step", "sample_ids_hash")
"""The prefix's fields that change from record to record, in the order the writer writes them."""
_get_mesh = operator.itemgetter(*_MESH_KEYS)
_LOSS_TYPES = frozenset({float, int, type(None)})
_TIME_TYPES = frozenset({float, int})


@dataclass(slots=True, eq=False)
class Batch:
    """Consecutive lines ``first_line .. first_line + n - 1`` of one rank log, as columns.

    ``fast``: every prefix field was proven equal to the expected record (right attempt, rank,
    world size, consecutive steps, cursor, count and shard hash), so no per-record check is
    needed; the per-record columns are then ``None``.
    """

    first_line: int
    steps: npt.NDArray[np.int64]
    time: npt.NDArray[np.float64]
    fast: bool
    loss: npt.NDArray[np.float64] | None = None
    ids: list[npt.NDArray[np.int64] | None] | None = None
    """Slow path, per record: the logged sample IDs (None where the record has none)."""
    id_block: npt.NDArray[np.int64] | None = None
    """Fast path: the logged sample IDs, one row per record, proven equal to the shards."""
    ints: npt.NDArray[np.int64] | None = None
    """Slow path: columns of ``_INT_KEYS`` (shape (n, 8))."""
    hashes: npt.NDArray[np.uint64] | None = None
    mesh: npt.NDArray[np.int64] | None = None
    """Slow path: the records' mesh fields ``dp_rank, dp_size, tp_rank, tp_size`` (shape
    (n, 4), -1 where a record does not name one); None when no record names any."""

    def __len__(self) -> int:
        return int(self.steps.size)

    def column(self, key: str) -> npt.NDArray[np.int64]:
        assert self.ints is not None
        return self.ints[:, _INT_KEYS.index(key)]


def _ndigits(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    return np.maximum(np.searchsorted(_POW10, values, side="right"), 1).astype(np.int64)


def _digits(n: int) -> bytes:
    return str(n).encode()


@dataclass(frozen=True, slots=True)
class _Template:
    row: npt.NDArray[np.uint8]
    """Expected prefix bytes with the variable digits and hash left as placeholders."""
    step_at: int
    epoch_at: int
    cursor_at: int
    hash_at: int


class RankLog:
    """One rank's step log of one attempt, read block by block (constant memory).

    ``start_step``: the step the first record should have (the attempt's resume point + 1).
    ``local_batch`` is None when the attempt's world size does not divide the global batch;
    then only the slow path runs (the checker reports that).

    On a mesh (:mod:`verifier.mesh`) ``shard_rank``/``shard_world`` are the rank's
    data-parallel coordinate and degree (whose shard it consumes; default: ``rank`` and
    ``world_size``) and ``mesh_fields`` the ``(dp_rank, dp_size, tp_rank, tp_size)`` every
    record must name (None: records name none), which the fast path proves too.

    The file is opened with :func:`ecrl.contract.runformat.open_regular` (no link followed on
    the way from ``root``, no FIFO, device or socket). A line longer than ``max_line`` bytes is a
    :class:`RunFormatError` as soon as that many bytes were read without a newline, so memory
    stays bounded (a few blocks) whatever the file holds.
    """

    def __init__(self, path: Path, *, attempt: int, rank: int, world_size: int,
                 local_batch: int | None, geometry: semantics.Geometry, seed: int,
                 torn_ok: bool, start_step: int, log_ids: bool, want_loss: bool,
                 block: int = BLOCK_BYTES, fast: bool = True, root: Path | None = None,
                 max_line: int = MAX_LINE_BYTES, shard_rank: int | None = None,
                 shard_world: int | None = None,
                 mesh_fields: tuple[int, int, int, int] | None = None) -> None:
        self.path = path
        self.root = root
        self.max_line = max_line
        self.attempt = attempt
        self.rank = rank
        self.world_size = world_size
        self.local_batch = local_batch
        self.geometry = geometry
        self.seed = seed
        self.torn_ok = torn_ok
        self.log_ids = log_ids
        self.want_loss = want_loss
        self.block = block
        self.next_step = start_step
        self.next_line = 1
        self.torn: tuple[int, str] | None = None
        self.fast_records = 0
        self._lines_in_block = 0
        self._error: RunFormatError | None = None
        self._templates: dict[tuple[int, int, int], _Template] = {}
        self._prefix_pieces: tuple[bytes, bytes, bytes, bytes, bytes] | None = None
        self.shard_rank = rank if shard_rank is None else shard_rank
        self.shard_world = world_size if shard_world is None else shard_world
        self.mesh_fields = mesh_fields
        self._fast_ok = fast and local_batch is not None and 0 <= rank < world_size \
            and 0 <= self.shard_rank < self.shard_world
        self._chunks = self._read()

    # -- reading ---------------------------------------------------------------------------

    def _read(self) -> Iterator[tuple[bytearray, int]]:
        """Blocks of whole lines in fresh buffers: ``buf[1 : 1 + n]``, ``buf[0]`` spare."""
        try:
            fd = open_regular(self.path, root=self.root)
        except OSError as exc:
            raise RunFormatError(str(self.path), None, f"cannot read: {exc.strerror}") from None
        handle = open(fd, "rb", buffering=0)  # noqa: SIM115 - closed in finally
        try:
            carry = b""
            left = os.fstat(handle.fileno()).st_size
            size = self.block
            while True:
                # Small files get small buffers: a zeroed megabyte per file adds up at 64 ranks.
                size = min(size, left + 1)
                buf = bytearray(1 + len(carry) + size)
                buf[1 : 1 + len(carry)] = carry
                got = handle.readinto(memoryview(buf)[1 + len(carry):])
                end = 1 + len(carry) + got
                if got == 0:
                    break
                left -= got
                cut = buf.rfind(b"\n", 1, end)
                if cut < 0:  # a line longer than the block: read more before cutting
                    if end - 1 > self.max_line:
                        raise self._too_long(self.next_line)
                    carry = bytes(buf[1:end])
                    size *= 2
                    continue
                carry = bytes(buf[cut + 1 : end])
                size = self.block
                yield buf, cut
            if carry:
                self.torn = (self.next_line, carry[:60].decode("utf-8", "replace"))
                if not self.torn_ok:
                    raise RunFormatError(
                        str(self.path), self.next_line,
                        "last line is incomplete (no newline), but this attempt did not crash")
        finally:
            handle.close()

    def _too_long(self, line: int) -> RunFormatError:
        return RunFormatError(str(self.path), line, f"line longer than {self.max_line} bytes "
                              "(the run format's limit, docs/run-format.md); not read further")

    def batches(self) -> Iterator[Batch]:
        """Batches in file order; a schema error is raised after the records before it."""
        for buf, nbytes in self._chunks:
            yield self._batch(buf, nbytes)
            if self._error is not None:
                raise self._error

    def _batch(self, buf: bytearray, nbytes: int) -> Batch:
        arr = np.frombuffer(buf, dtype=np.uint8, count=nbytes + 1)
        ends = np.flatnonzero(arr == _NL)
        over = np.flatnonzero(np.diff(ends, prepend=0) - 1 > self.max_line)
        if over.size:
            raise self._too_long(self.next_line + int(over[0]))
        self._lines_in_block = int(ends.size)
        batch = self._fast(buf, arr, ends) if self._fast_ok else None
        if batch is None:
            batch = self._slow(buf, nbytes)
        else:
            self.fast_records += len(batch)
        self.next_line += int(ends.size)
        if len(batch):
            self.next_step = int(batch.steps[-1]) + 1
        return batch

    # -- fast path -------------------------------------------------------------------------

    def _pieces(self) -> tuple[bytes, bytes, bytes, bytes, bytes]:
        """The expected prefix's bytes around its variable fields: ``pieces[0]``, the global
        step, ``pieces[1]``, the epoch, ``pieces[2]``, the cursor step, ``pieces[3]``, the hash's
        16 hex digits, ``pieces[4]``."""
        if self._prefix_pieces is not None:
            return self._prefix_pieces
        fixed = {"schema_version": _digits(SCHEMA_VERSION), "attempt": _digits(self.attempt),
                 "rank": _digits(self.rank), "world_size": _digits(self.world_size),
                 "local_batch": _digits(self.local_batch or 0),
                 "sample_ids_count": _digits(self.local_batch or 0)}
        pieces: list[bytes] = []
        out = bytearray(b"{")
        for i, name in enumerate(PREFIX_KEYS):
            out += (b"," if i else b"") + b'"' + name.encode() + b'":'
            if name in fixed:
                out += fixed[name]
            else:
                assert name == _VARIABLE_KEYS[len(pieces)], PREFIX_KEYS
                pieces.append(bytes(out + (b'"' if name == "sample_ids_hash" else b"")))
                out = bytearray(b'"' if name == "sample_ids_hash" else b"")
        pieces.append(bytes(out + b","))
        self._prefix_pieces = (pieces[0], pieces[1], pieces[2], pieces[3], pieces[4])
        return self._prefix_pieces

    def _template(self, dg: int, de: int, dc: int) -> _Template:
        key = (dg, de, dc)
        cached = self._templates.get(key)
        if cached is not None:
            return cached
        pieces = self._pieces()
        at = np.cumsum([len(p) for p in pieces[:4]]) + np.cumsum([0, dg, de, dc])
        row = b"".join((pieces[0], b"0" * dg, pieces[1], b"0" * de, pieces[2], b"0" * dc,
                        pieces[3], b"0" * 16, pieces[4]))
        tpl = _Template(np.frombuffer(row, dtype=np.uint8), *map(int, at))
        self._templates[key] = tpl
        return tpl

    def _fast(self, buf: bytearray, arr: npt.NDArray[np.uint8], ends: npt.NDArray[np.intp]
              ) -> Batch | None:
        n = int(ends.size)
        if n == 0:
            return None
        assert self.local_batch is not None
        geometry = self.geometry
        s = geometry.steps_per_epoch
        steps = self.next_step + np.arange(n, dtype=np.int64)
        epochs = steps // s
        cursors = steps - epochs * s
        if self.log_ids:
            expected_ids = semantics.shard_block(geometry, self.seed, steps, self.shard_rank,
                                                 self.shard_world)
            hashes = semantics.ids_hashes(expected_ids)
        else:
            hashes = semantics.shard_hashes(geometry, self.seed, steps, self.shard_rank,
                                            self.shard_world)
        if native is not None:
            return self._fast_native(arr, ends, steps, epochs, cursors, hashes,
                                     expected_ids if self.log_ids else None)
        starts = np.empty(n, dtype=np.int64)
        starts[0] = 1
        starts[1:] = ends[:-1] + 1
        lengths = ends - starts
        hexes = np.frombuffer(hashes.astype(">u8").tobytes().hex().encode(),
                              dtype=np.uint8).reshape(n, 16)
        dg, de, dc = _ndigits(steps), _ndigits(epochs), _ndigits(cursors)
        signature = (dg * 32 + de) * 32 + dc
        cuts = (np.flatnonzero(signature[1:] != signature[:-1]) + 1).tolist()
        groups = list(zip([0, *cuts], [*cuts, n], strict=True))
        proven = []
        for lo, hi in groups:
            tpl = self._template(int(dg[lo]), int(de[lo]), int(dc[lo]))
            p = tpl.row.size
            if int(lengths[lo:hi].min()) <= p:
                return None
            expected = np.empty((hi - lo, p), dtype=np.uint8)
            expected[:] = tpl.row
            for at, nd, values in ((tpl.step_at, int(dg[lo]), steps[lo:hi]),
                                   (tpl.epoch_at, int(de[lo]), epochs[lo:hi]),
                                   (tpl.cursor_at, int(dc[lo]), cursors[lo:hi])):
                expected[:, at : at + nd] = (values[:, None] // _POW10[nd - 1 :: -1]) % 10 + 48
            expected[:, tpl.hash_at : tpl.hash_at + 16] = hexes[lo:hi]
            window = as_strided(arr, shape=(arr.size - p + 1, p), strides=(1, 1))
            rows = starts[lo:hi]
            if not np.array_equal(window[rows], expected):
                return None
            proven.append((window, rows, expected))
        # Every prefix is proven; reduce each line to "{rest" and parse them all at once.
        if (np.count_nonzero(arr == _LBRACE) != n or np.count_nonzero(arr == _RBRACE) != n
                or not np.all(arr[ends - 1] == _RBRACE)):
            return None
        # Logged IDs: proven byte by byte too where they are written as the runtime writes them;
        # then the parse below only sees "sample_ids":[].
        id_lists = _id_lists(arr, ends, expected_ids) if self.log_ids else None
        # The proven bytes are left out (not parsed again): what is left of each line is
        # "{" and the rest of its object, with JSON's meaning unchanged (a prefix ends with
        # its comma, and nothing left out was inside a string).
        keep = np.ones(arr.size, dtype=bool) if id_lists is None else ~id_lists
        for window, rows, _ in proven:
            as_strided(keep, shape=window.shape, strides=(1, 1))[rows, 1:] = False
        rest = arr[keep]
        rest[0] = _NL
        return self._parse_rests(rest, steps, expected_ids if self.log_ids else None,
                                 ids_proven=id_lists is not None)

    def _fast_native(self, arr: npt.NDArray[np.uint8], ends: npt.NDArray[np.intp],
                     steps: npt.NDArray[np.int64], epochs: npt.NDArray[np.int64],
                     cursors: npt.NDArray[np.int64], hashes: npt.NDArray[np.uint64],
                     expected_ids: npt.NDArray[np.int64] | None) -> Batch | None:
        """:meth:`_fast`'s proof of the prefixes, braces and ID lists in one compiled pass
        (``verifier/_native.c``), which also leaves out the proven bytes."""
        assert native is not None
        rest = np.empty(arr.size, dtype=np.uint8)
        proven = native.prove_block(
            arr, np.ascontiguousarray(ends, dtype=np.int64), self._pieces(), steps, epochs,
            cursors, np.ascontiguousarray(hashes, dtype=np.uint64),
            None if expected_ids is None else np.ascontiguousarray(expected_ids, dtype=np.int64),
            rest)
        if proven is None:
            return None
        size, ids_proven = proven
        return self._parse_rests(rest[:size], steps, expected_ids, ids_proven=ids_proven)

    def _parse_rests(self, rest: npt.NDArray[np.uint8], steps: npt.NDArray[np.int64],
                     expected_ids: npt.NDArray[np.int64] | None, *, ids_proven: bool
                     ) -> Batch | None:
        """The batch of a block whose prefixes are proven, from ``rest``: a newline, then each
        line's ``{`` and what follows its prefix (its ID list left out where proven)."""
        n = int(steps.size)
        batch = self._fast_columns(rest, steps, expected_ids, ids_proven=ids_proven)
        if batch is not None:
            return batch
        rest[rest == _NL] = _COMMA
        rest[0] = _LBRACKET
        rest[-1] = _RBRACKET
        # Thousands of small objects, all freed with the block: a collection would find nothing.
        with collection_paused():
            try:
                rests = loads(rest.tobytes())
            except Exception:
                return None
            batch = None
            if isinstance(rests, list) and len(rests) == n:
                batch = self._fast_rests(rests, steps, expected_ids, ids_proven=ids_proven)
            del rests  # freed while the collector is off: back on, it would walk them all once
        return batch

    def _fast_columns(self, rest: npt.NDArray[np.uint8], steps: npt.NDArray[np.int64],
                      expected_ids: npt.NDArray[np.int64] | None, *, ids_proven: bool
                      ) -> Batch | None:
        """What :meth:`_fast_rests` finds, read from the rests' bytes as columns
        (:mod:`verifier._rests`) when they allow it; else None (they are parsed as JSON)."""
        if self.mesh_fields is not None:
            return None
        read = numeric_rests(rest, int(steps.size))
        if read is None:
            return None
        first, columns = read
        keys = first.keys()
        if "loss" not in columns or "time" not in columns or not self._rest_keys_fit(keys) \
                or not keys.isdisjoint(_MESH_KEYS):
            return None
        logged_ids = "sample_ids" in keys
        if logged_ids and (not ids_proven or "sample_ids" in columns):
            return None  # an ID list left to compare (or not a list): the JSON parse does it
        return Batch(first_line=self.next_line, steps=steps, time=columns["time"], fast=True,
                     loss=columns["loss"] if self.want_loss else None,
                     id_block=expected_ids if logged_ids else None)

    def _rest_keys_fit(self, keys: Set[str]) -> bool:
        """No proven prefix key again in the rest, and the IDs there when the run logs them."""
        return keys.isdisjoint(PREFIX_KEYS) and ("sample_ids" in keys or not self.log_ids)

    def _fast_rests(self, rests: list[Any], steps: npt.NDArray[np.int64],
                    expected_ids: npt.NDArray[np.int64] | None, *, ids_proven: bool = False
                    ) -> Batch | None:
        first = rests[0]
        if not isinstance(first, dict) or "loss" not in first or "time" not in first:
            return None
        keys = set(first)
        if not self._rest_keys_fit(keys):
            return None
        if not self._mesh_proven(rests, keys):
            return None
        # Same size and a union no larger than the first: every object has exactly its keys.
        if set(map(len, rests)) != {len(keys)} or set().union(*rests) != keys:
            return None
        times = list(map(_get_time, rests))
        if not set(map(type, times)) <= _TIME_TYPES:
            return None
        losses = list(map(_get_loss, rests))
        if not set(map(type, losses)) <= _LOSS_TYPES:
            return None
        loss = np.array(losses, dtype=np.float64) if self.want_loss else None
        if "sample_ids" in keys:
            if expected_ids is None:
                return None
            lists = list(map(_get_ids, rests))
            if ids_proven:
                # _id_lists proved the bytes of each line's one "sample_ids" list; what is left
                # of it must be the top-level key's, now empty, in every record.
                if set(map(type, lists)) != {list} or any(lists):
                    return None
                return Batch(first_line=self.next_line, steps=steps,
                             time=np.array(times, dtype=np.float64), fast=True, loss=loss,
                             id_block=expected_ids)
            # Equal as Python lists (1 == 1.0 == True, hence the type check after) is cheaper
            # than converting a million small lists to an array.
            if set(map(type, lists)) != {list} or lists != expected_ids.tolist():
                return None
            if expected_ids.shape[1] and set(map(type, chain.from_iterable(lists))) != {int}:
                return None
        return Batch(first_line=self.next_line, steps=steps,
                     time=np.array(times, dtype=np.float64), fast=True, loss=loss,
                     id_block=expected_ids if "sample_ids" in keys else None)

    def _mesh_proven(self, rests: list[Any], keys: set[str]) -> bool:
        """Every record names exactly the rank's mesh fields (or, off a mesh, none)."""
        if self.mesh_fields is None:
            return not keys.intersection(_MESH_KEYS)
        if not keys.issuperset(_MESH_KEYS):
            return False  # every object has exactly the first one's keys (checked before)
        said = set(map(_get_mesh, rests))
        return said == {self.mesh_fields} and set(map(type, next(iter(said)))) == {int}

    # -- slow path -------------------------------------------------------------------------

    def _slow(self, buf: bytearray, nbytes: int) -> Batch:
        lines = bytes(memoryview(buf)[1 : nbytes + 1]).split(b"\n")
        lines.pop()  # the block ends with a newline
        if len(lines) != self._lines_in_block:
            raise AssertionError(f"{self.path}: block of {self._lines_in_block} lines split "
                                 f"into {len(lines)}")
        path = str(self.path)
        ints: list[tuple[int, ...]] = []
        hashes: list[int] = []
        times: list[float] = []
        losses: list[float] = []
        ids: list[npt.NDArray[np.int64] | None] = []
        mesh: list[tuple[int, ...]] = []
        for i, line in enumerate(lines):
            number = self.next_line + i
            try:
                record = self._record(line, path, number)
            except RunFormatError as exc:
                # The records before the bad line are still judged (a witness there is a FAIL).
                self._error = exc
                break
            ints.append((record.attempt, record.global_step, record.epoch, record.cursor_step,
                         record.rank, record.world_size, record.local_batch,
                         record.sample_ids_count))
            hashes.append(int(record.sample_ids_hash, 16))
            times.append(float(record.time))
            losses.append(float("nan") if record.loss is None else float(record.loss))
            ids.append(None if record.sample_ids is None else _id_array(record.sample_ids))
            # -1: not named; a value beyond int64 is no coordinate of any mesh either.
            mesh.append(tuple(-1 if v is None else min(v, 2**62) for v in (
                record.dp_rank, record.dp_size, record.tp_rank, record.tp_size)))
        try:
            table = np.array(ints, dtype=np.int64).reshape(len(ints), len(_INT_KEYS))
        except OverflowError:
            big = next(i for i, row in enumerate(ints) if max(row) >= 2**63)
            raise RunFormatError(path, self.next_line + big,
                                 "an integer field is too large (at least 2^63)") from None
        return Batch(first_line=self.next_line, steps=table[:, 1].copy(),
                     time=np.array(times, dtype=np.float64), fast=False,
                     loss=np.array(losses, dtype=np.float64),
                     ids=ids if any(x is not None for x in ids) else None, ints=table,
                     hashes=np.array(hashes, dtype=np.uint64),
                     mesh=np.array(mesh, dtype=np.int64).reshape(len(mesh), 4)
                     if any(max(m) >= 0 for m in mesh) else None)


    def _record(self, line: bytes, path: str, number: int) -> StepRecord:
        if not line.strip():
            raise RunFormatError(path, number, "empty line")
        try:
            data = loads(line)
        except Exception as exc:
            raise RunFormatError(path, number, f"not valid JSON ({exc})") from None
        record = StepRecord.from_dict(data, where=(path, number))
        if record.sample_ids is None and self.log_ids:
            raise RunFormatError(path, number, "run.json sets log_ids but this record has no "
                                               "sample_ids")
        return record


_IDS_KEY = np.frombuffer(b'"sample_ids":[', dtype=np.uint8)


def _id_lists(arr: npt.NDArray[np.uint8], ends: npt.NDArray[np.intp],
              expected_ids: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_] | None:
    """Where each line's ``"sample_ids":[...]`` list holds exactly its expected shard: a mask
    of the bytes between the brackets, else None (the IDs are then parsed and compared).

    Proven when every line holds the key exactly once, and the bytes up to the next ``]`` are
    decimal integers without sign, leading zero or blank, separated by single commas, whose
    values are the line's row of ``expected_ids`` (how that follows from lengths, byte classes
    and numpy's reader: the comment before the read). JSON reads such a list as exactly those
    Python ints (no float, no bool), as the comparison of parsed lists would find; a line with
    a second list under that key (nested, or a repeated key) has two matches and is refused.
    The byte sequence cannot occur inside a JSON string (its quote before the colon would be
    escaped), so a match is a key; that it is the top-level one is checked after the parse (the
    blanked list must come back as the record's empty ``sample_ids``).
    """
    n, per = expected_ids.shape
    k = _IDS_KEY.size
    if per == 0 or arr.size < k:
        return None
    opens = np.flatnonzero(arr == _LBRACKET)
    opens = opens[opens >= k - 1]
    keys = as_strided(arr, shape=(arr.size - k + 1, k), strides=(1, 1))
    opens = opens[np.all(keys[opens - (k - 1)] == _IDS_KEY, axis=1)]
    # Exactly one key per line, in order: the k-th key lies between line k's newline and the last.
    if opens.size != n or not (np.all(opens < ends) and np.all(opens[1:] > ends[:-1])):
        return None
    closes = np.flatnonzero(arr == _RBRACKET)
    at = np.searchsorted(closes, opens)
    if at.size and int(at[-1]) >= closes.size:
        return None
    closes = closes[at]
    if np.any(closes > ends):
        return None
    # Each list exactly as long as its expected numbers written out (digits and commas).
    expected_flat = expected_ids.ravel()
    widths = _ndigits(expected_flat).reshape(n, per).sum(axis=1) + (per - 1)
    if not np.array_equal(closes - opens - 1, widths):
        return None
    # The lists' bytes back to back, each closed by its "]": ranges (opens, closes].
    spans = np.empty(2 * n, dtype=np.int64)
    spans[0] = opens[0] + 1
    spans[1::2] = closes - opens
    spans[2::2] = opens[1:] - closes[:-1]
    inside = np.zeros(2 * n, dtype=bool)
    inside[1::2] = True
    lists = np.zeros(arr.size, dtype=bool)
    lists[: int(closes[-1]) + 1] = np.repeat(inside, spans)
    text = arr[lists]
    sep = (text == _COMMA) | (text == _RBRACKET)
    if not np.all(sep | ((text >= _ZERO) & (text <= _NINE))):
        return None
    if sep[0] or np.any(sep[1:] & sep[:-1]):
        return None  # an empty number: "[,", ",,", ",]" or "[]"
    # Only non-empty runs of digits are left, one before each separator; numpy's C reader turns
    # each into its value (one beyond int64 into int64's largest, which is no sample ID). If the
    # values are the expected ones, the runs are their decimal forms: each run is at least as
    # long as its value's form and all lists together are exactly as long as the forms, so no
    # run is longer (no leading zero, no overflow); and as each list has its own expected
    # length, no list can have passed a number on to the next.
    text[np.cumsum(closes - opens) - 1] = _COMMA
    values = np.fromstring(text[:-1].tobytes(), dtype=np.int64, sep=",")
    if not np.array_equal(values, expected_flat):
        return None
    lists[closes] = False
    return lists


def _id_array(values: list[int]) -> npt.NDArray[np.int64]:
    """Logged IDs as int64; IDs beyond int64 (never valid sample IDs) become -1 (out of range)."""
    try:
        return np.array(values, dtype=np.int64)
    except OverflowError:
        return np.array([v if -(2**63) <= v < 2**63 else -1 for v in values], dtype=np.int64)
