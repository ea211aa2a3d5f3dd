"""NumPy arrays in a resume state: owners and views, tables of many, and the sharing check.

Memory sharing is what a resume must keep. An array that owns its memory (an *owner*) is saved
as its bytes; an array that is a view of an owner (``base[i].reshape(784, 1)``, ``w[:4]``) is
saved as a reference to that owner plus its byte offset, shape, strides and dtype, and comes
back as a view of the one restored owner. Views of one owner therefore share memory after a
resume exactly as before, an in-place update reaches all of them, and the owner's bytes are
saved once however many views the program holds. When the owner is an *anchor* (an array the
resumed program rebuilds by itself and that is restored in place), the views come back as views
of the rebuilt array.

Many arrays at once. A data set kept as 100,000 row views (Nielsen's ``network2.py`` zips them
with their labels: ``list(zip(inputs, results))``) pickled element by element costs several
Python calls per array. A large list or tuple whose elements are all arrays, all numbers, or all
tuples or lists of such, is written as one *table*: a column of views of one owner is its
owner, the common shape, strides and dtype, and the offsets as one array; a column of owners of
one shape is their bytes, stacked; a column of numbers is an array; a column whose elements
belong to an earlier table (``mini_batches`` slicing ``training_data``) is their positions
there. The checks and the encoding run in NumPy and in C-level ``map`` calls, not one Python
call per element. Identity is kept: every array, tuple and list a table holds is numbered, and
a later reference to it is written as that number; one met before the table (pickled the
ordinary way, in pickle's memo) is written inside the table's record, so pickle's memo gives
the same object back. A table that does not fit (mixed types, shapes or owners, an element
twice) is pickled element by element, as before.

Saves in a row. How a table is written (its *plan*: the columns, the offsets, the positions of
what it numbers) is kept with the blob memo and used again while the table holds the same
objects in the same order — checked by identity in one C-level pass, the lists inside it
compared again (they change in place). What an unchanged object can still change is read again
at every save: the shape, strides and dtype of every array (all three can be assigned in place),
the bytes of every owner (compared with the last save's, as any blob). The offsets of views
cannot change (an array keeps its data pointer and its base). So an unchanged data set costs,
per save, a pass over its elements and a comparison of its owner's bytes, not a new plan.

What still cannot be saved exactly is refused (:class:`Sharing`): two arrays that share memory
but would not after a resume — an array whose owner is not an ndarray (``np.frombuffer``, a
memory map) or whose dtype is not plain (saved as its own copy, as pickle does), overlapping a
saved owner's memory or an anchor's. Owners never overlap one another (each owns its memory),
so the check looks only at those copies and at anchors, and costs nothing when there are none.
"""

from __future__ import annotations

import ctypes
import itertools
import operator
import pickle
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any

__all__ = ["ArrayContent", "Raw", "Sharing", "TableReader", "TableWriter", "TABLE_MIN",
           "plain"]

TABLE_MIN = 32
"""Lists and tuples at least this long are tried as a table."""

_MAX_TUPLE = 16
"""Tuples up to this long are split into columns; longer ones are flattened."""

_PLAIN_KINDS = frozenset("biufcmMSU")


def plain(dtype: Any) -> bool:
    """A dtype its ``str`` names exactly (no fields, no objects): its bytes are its value."""
    return dtype.kind in _PLAIN_KINDS and dtype.fields is None and dtype.subdtype is None


class Raw:
    """Bytes written apart from the pickle (inline when small, else a blob). ``key`` and
    ``owner`` name them for the blob memo: ``owner`` stays alive while its entry does."""

    __slots__ = ("data", "key", "owner")

    def __init__(self, data: Any, key: tuple[Any, ...] | None, owner: Any) -> None:
        self.data = data
        self.key = key
        self.owner = owner


class ArrayContent:
    """An anchor array's saved state: its values, by value (the anchor itself is the
    resumed program's own array, into which they are copied)."""

    __slots__ = ("array",)

    def __init__(self, array: Any) -> None:
        self.array = array


def _numpy() -> Any:
    return sys.modules["numpy"]


def _address(array: Any) -> int:
    address: int = array.__array_interface__["data"][0]
    return address


def _order(array: Any) -> str | None:
    """How an owner's memory is laid out: ``C``, ``F`` or None (neither: not supported)."""
    flags = array.flags
    return "C" if flags.c_contiguous else "F" if flags.f_contiguous else None


def _flat_bytes(owner: Any, order: str) -> Any:
    """An owner's memory as one-dimensional bytes, without a copy."""
    return (owner.T if order == "F" else owner).reshape(-1).view("u1")


def _reach(shape: Sequence[int], strides: Sequence[int], itemsize: int) -> tuple[int, int]:
    """The bytes a view spans around its data pointer: (first, end), first ≤ 0 < end."""
    low = high = 0
    for n, s in zip(shape, strides, strict=True):
        if s < 0:
            low += (n - 1) * s
        else:
            high += (n - 1) * s
    return low, high + itemsize


def usable_owner(base: Any) -> str | None:
    """The layout of ``base`` when views of it can be saved as references to it."""
    np = _numpy()
    if type(base) is not np.ndarray or not base.flags.owndata or not plain(base.dtype):
        return None
    return _order(base)


# --------------------------------------------------------------------------- reconstructors


def _owner(dtype: str, shape: tuple[int, ...], order: str, raw: bytes) -> Any:
    """A saved owner: a new array that owns its memory, laid out as it was."""
    np = _numpy()
    kind = _checked_dtype(dtype)
    if order not in ("C", "F"):
        raise pickle.UnpicklingError("a damaged array")
    out = np.empty(tuple(shape), kind, order=order)
    flat = _flat_bytes(out, order)
    data = np.frombuffer(raw, dtype=np.uint8)
    if data.size != flat.size:
        raise pickle.UnpicklingError("a damaged array (its size)")
    flat[...] = data
    return out


def _view(base: Any, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...],
          offset: int) -> Any:
    """A saved view: a view of its restored owner (or of the rebuilt anchor it was a view of)
    at the same offset, shape and strides."""
    np = _numpy()
    return np.ndarray(tuple(shape), _checked_dtype(dtype), buffer=_buffer(base), offset=offset,
                      strides=tuple(strides))


def _checked_dtype(name: Any) -> Any:
    np = _numpy()
    try:
        kind = np.dtype(str(name))
    except TypeError:
        raise pickle.UnpicklingError("a damaged array (its dtype)") from None
    if not plain(kind):
        raise pickle.UnpicklingError(f"an array of dtype {kind} where only plain ones are saved")
    return kind


def _buffer(base: Any) -> Any:
    """The memory of a restored owner or a rebuilt anchor, for views into it."""
    np = _numpy()
    if type(base) is not np.ndarray or usable_owner(base) is None:
        raise pickle.UnpicklingError(
            f"views of an array that is now {type(base).__name__} "
            f"{getattr(base, 'shape', '')}, not an array that owns its memory")
    return base.T if _order(base) == "F" else base


# --------------------------------------------------------------------------- the sharing check


class Sharing:
    """Which saved arrays would share memory after a resume, and a check that nothing else did.

    A *group* is what an array's memory is after a resume: a restored owner (its ``id``), the
    rebuilt program's own memory (anchors and views of anchors), or a copy of its own. Arrays of
    one group share memory after a resume as they did before; two arrays of different groups
    whose memory overlaps (the bounds test of ``np.may_share_memory``) are refused. Owners never
    overlap one another, so there is work only when copies or anchors were saved: then one sort
    of every saved extent and one sweep, both in NumPy (the views of a table count as one extent,
    the owners of a table are located with one C-level pass).
    """

    def __init__(self) -> None:
        self.loose: list[tuple[Any, Any]] = []
        """(array, group) of copies and anchors: what can overlap another group."""
        self.saved: list[tuple[Any, Any]] = []
        """(array, group) of owners and views saved one by one."""
        self.owners: list[list[Any]] = []
        """The owners a table saved (each its own group)."""
        self.columns: list[tuple[Any, Any, Any, int, int, str]] = []
        """(group, owner, offsets, first, end, description): the views a table saved."""

    def check(self) -> None:
        if not self.loose:
            return
        np = _numpy()
        bounds = _byte_bounds()
        codes: dict[Any, int] = {}
        lows: list[Any] = []
        highs: list[Any] = []
        groups: list[Any] = []
        what: list[str] = []
        for array, group in itertools.chain(self.loose, self.saved):
            if array.size:
                low, high = bounds(array)
                lows.append([low])
                highs.append([high])
                groups.append([codes.setdefault(group, len(codes))])
                what.append(f"shape {array.shape}")
        for group, owner, offsets, first, end, description in self.columns:
            start = _address(owner)
            lows.append([start + int(np.min(offsets)) + first])
            highs.append([start + int(np.max(offsets)) + end])
            groups.append([codes.setdefault(group, len(codes))])
            what.append(description)
        following = len(codes)
        for arrays in self.owners:  # each owner its own group: numbers no other extent has
            starts = _addresses(arrays, np)
            lows.append(starts)
            highs.append(starts + arrays[0].nbytes)
            groups.append(np.arange(following, following + len(arrays)))
            following += len(arrays)
            what.extend([f"an array of shape {arrays[0].shape} in a list"] * len(arrays))
        if not lows:
            return
        low = np.concatenate([np.asarray(x, dtype=np.int64) for x in lows])
        order = np.argsort(low, kind="stable")
        low = low[order]
        high = np.concatenate([np.asarray(x, dtype=np.int64) for x in highs])[order]
        group = np.concatenate([np.asarray(x, dtype=np.int64) for x in groups])[order]
        reach = np.maximum.accumulate(high)
        # the extent that reached furthest so far (any of them, when several reach as far)
        reacher = np.maximum.accumulate(np.where(high == reach, np.arange(len(high)), 0))
        clash = np.flatnonzero((low[1:] < reach[:-1]) & (group[1:] != group[reacher[:-1]]))
        if len(clash):
            earlier, later = int(order[reacher[clash[0]]]), int(order[clash[0] + 1])
            raise pickle.PicklingError(
                f"two saved NumPy arrays share memory ({what[earlier]} and {what[later]}) that "
                "they would not share after a resume (one of them is saved as a copy: its "
                "memory is not owned by a NumPy array, or belongs to an array the resumed "
                "program rebuilds); keep only one of them live across the checkpoint, or copy "
                "one")


_REBUILT = "rebuilt"


def _byte_bounds() -> Callable[[Any], tuple[int, int]]:
    try:  # NumPy 2
        from numpy.lib.array_utils import byte_bounds
    except ImportError:  # NumPy 1 (imported: the arrays are its)
        bounds: Callable[[Any], tuple[int, int]] = sys.modules["numpy"].byte_bounds
        return bounds
    return byte_bounds


# --------------------------------------------------------------------------- writing


class _NotATable(Exception):
    """A list or tuple that is pickled element by element."""


_PYTHON_NUMBERS = {int: "<i8", float: "<f8", bool: "|b1"}
_NUMPY_NUMBER_KINDS = frozenset("biufc")
_get = operator.attrgetter


def _bytes_of(array: Any) -> memoryview:
    """A contiguous array's memory as bytes (no copy)."""
    return memoryview(array.reshape(-1).view("u1"))


def _same(objs: Sequence[Any], before: Sequence[Any]) -> bool:
    """The same objects, in the same order (one C-level pass)."""
    return objs is before or (len(objs) == len(before) and all(map(operator.is_, objs, before)))


def _layouts(objs: Sequence[Any]) -> tuple[Any, ...] | None:
    """The one (shape, strides, dtype) of many arrays, or None when they differ. Checked at
    every save: all three can be assigned in place (``a.shape = ...``)."""
    shapes = set(map(_get("shape"), objs))
    strides = set(map(_get("strides"), objs))
    dtypes = set(map(_get("dtype"), objs))
    if len(shapes) != 1 or len(strides) != 1 or len(dtypes) != 1:
        return None
    return shapes.pop(), strides.pop(), dtypes.pop()


class _Column:
    """How one column of a table is written; kept across saves while it still applies."""

    __slots__ = ("objs",)

    def __init__(self, objs: list[Any]) -> None:
        self.objs = objs

    def numbered(self) -> Iterator[_Numbered]:
        """The columns below and including this one whose objects are numbered."""
        return iter(())

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        """Whether this encoding still holds for ``objs`` at this save."""
        return _same(objs, self.objs)

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        raise NotImplementedError


class _Empty(_Column):
    __slots__ = ()

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        return ("empty",)


class _Numbers(_Column):
    """Python or NumPy numbers of one type: an array of them."""

    __slots__ = ("tag", "dtype", "raw")

    def __init__(self, objs: list[Any], tag: str, dtype: str, raw: Raw) -> None:
        super().__init__(objs)
        self.tag, self.dtype, self.raw = tag, dtype, raw

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        return ("numbers", self.tag, self.dtype, self.raw)


class _Items(_Column):
    """Objects an earlier table of the same payload wrote: their positions there."""

    __slots__ = ("source", "raw")

    def __init__(self, objs: list[Any], source: _Plan, raw: Raw) -> None:
        super().__init__(objs)
        self.source, self.raw = source, raw

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        return self.source in writer.numbers and _same(objs, self.objs)

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        return ("items", writer.numbers[self.source], self.raw)


class _Numbered(_Column):
    """A column of arrays, tuples or lists: each gets a position in its table, so that a later
    reference to one is written as that position."""

    __slots__ = ("ids", "start")

    def __init__(self, objs: list[Any], ids: list[int], start: int) -> None:
        super().__init__(objs)
        self.ids, self.start = ids, start

    def numbered(self) -> Iterator[_Numbered]:
        yield self

    def tail(self, emit: _Emit) -> tuple[Any, Any]:
        return emit.overrides.get(id(self)), self.start


class _Views(_Numbered):
    """Views of one owner, of one shape, strides and dtype: the owner and their offsets."""

    __slots__ = ("base", "layout", "offsets", "raw", "reach")

    def __init__(self, objs: list[Any], ids: list[int], start: int, base: Any,
                 layout: tuple[Any, ...], offsets: Any, raw: Raw, reach: tuple[int, int]
                 ) -> None:
        super().__init__(objs, ids, start)
        self.base, self.layout, self.offsets, self.raw, self.reach = \
            base, layout, offsets, raw, reach

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        return _same(objs, self.objs) and _layouts(objs) == self.layout

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        shape, strides, dtype = self.layout
        emit.columns.append((writer.group(self.base), self.base, self.offsets, *self.reach,
                             f"{len(self.objs)} views of shape {shape}"))
        return ("views", self.base, dtype.str, shape, strides, self.raw, *self.tail(emit))


class _Owners(_Numbered):
    """Arrays that own their memory, of one shape and dtype: their bytes, stacked (read again
    at every save: they may have been written in place)."""

    __slots__ = ("layout", "key", "owner")

    def __init__(self, objs: list[Any], ids: list[int], start: int, layout: tuple[Any, ...],
                 key: tuple[Any, ...], owner: Any) -> None:
        super().__init__(objs, ids, start)
        self.layout, self.key, self.owner = layout, key, owner

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        return _same(objs, self.objs) and _layouts(objs) == self.layout

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        shape, _, dtype = self.layout
        emit.owners.append(self.objs)
        stacked = writer.np.array(self.objs, dtype=dtype)
        return ("owners", dtype.str, shape, Raw(_bytes_of(stacked), self.key, self.owner),
                *self.tail(emit))


class _Tuples(_Numbered):
    """Tuples of one length: a column for each position."""

    __slots__ = ("children",)

    def __init__(self, objs: list[Any], ids: list[int], start: int,
                 children: list[_Column]) -> None:
        super().__init__(objs, ids, start)
        self.children = children

    def numbered(self) -> Iterator[_Numbered]:
        for child in self.children:
            yield from child.numbered()
        yield self

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        # the same tuples: the same elements (a tuple does not change)
        return _same(objs, self.objs) and all(child.still(child.objs, writer)
                                              for child in self.children)

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        return ("tuples", len(self.children),
                [child.spec(writer, emit) for child in self.children], *self.tail(emit))


class _Seqs(_Numbered):
    """Lists (or tuples of varying length): their lengths, and their elements as one
    column."""

    __slots__ = ("container", "lengths", "raw", "child")

    def __init__(self, objs: list[Any], ids: list[int], start: int, container: type,
                 lengths: Any, raw: Raw, child: _Column) -> None:
        super().__init__(objs, ids, start)
        self.container, self.lengths, self.raw, self.child = container, lengths, raw, child

    def numbered(self) -> Iterator[_Numbered]:
        yield from self.child.numbered()
        yield self

    def still(self, objs: list[Any], writer: TableWriter) -> bool:
        if not _same(objs, self.objs):
            return False
        if self.container is tuple:
            return self.child.still(self.child.objs, writer)
        # lists change in place: their lengths and elements are compared again
        lengths = writer.np.fromiter(map(len, objs), dtype=writer.np.int64, count=len(objs))
        if not writer.np.array_equal(lengths, self.lengths):
            return False
        flat = list(itertools.chain.from_iterable(objs))
        return self.child.still(flat, writer)

    def spec(self, writer: TableWriter, emit: _Emit) -> tuple[Any, ...]:
        return ("seqs", "tuple" if self.container is tuple else "list", self.raw,
                self.child.spec(writer, emit), *self.tail(emit))


class _Plan:
    """A table: how a list or tuple and everything in it are written, and the position of
    each array, tuple and list in it (kept across saves while the table is unchanged)."""

    __slots__ = ("seq", "root", "positions", "count")

    def __init__(self, seq: list[Any] | tuple[Any, ...], root: _Column,
                 positions: dict[int, int], count: int) -> None:
        self.seq, self.root, self.positions, self.count = seq, root, positions, count


class _Emit:
    """What one save of a table collects while writing it."""

    def __init__(self) -> None:
        self.overrides: dict[int, dict[int, Any]] = {}
        self.columns: list[tuple[Any, Any, Any, int, int, str]] = []
        self.owners: list[list[Any]] = []


class TableWriter:
    """Single arrays and tables, as the pickler meets them (see the module's docstring).

    ``lookups`` holds, for each table written so far, the position of every array, tuple and
    list it numbered (by ``id``: the objects stay alive until the pickle is done, so an ``id``
    names only them); ``met`` holds the ``id`` of every such object pickled the ordinary way,
    and of the anchors: a table writes those inside its record, where pickle's memo (or the
    anchor's token) gives the same object back.
    """

    def __init__(self, anchors: dict[int, Any], keep: list[Any],
                 cache: dict[int, _Plan] | None = None,
                 next_cache: dict[int, _Plan] | None = None) -> None:
        np = _numpy()
        self.np = np
        self.ndarray = np.ndarray
        self.anchors = anchors
        self.keep = keep
        self.cache = cache if cache is not None else {}
        self.next_cache = next_cache if next_cache is not None else {}
        self.lookups: list[dict[int, int]] = []
        self.numbers: dict[_Plan, int] = {}
        """The tables written so far, in order."""
        self.met: set[int] = set(anchors)
        self.sharing = Sharing()

    def item(self, ident: int) -> tuple[str, int, int] | None:
        """The persistent id of an object a table wrote, or None."""
        for number, lookup in enumerate(self.lookups):
            position = lookup.get(ident)
            if position is not None:
                return ("item", number, position)
        return None

    # -- one array

    def reduce(self, obj: Any) -> Any:
        """An ndarray's reduction (NotImplemented: pickle's own, a copy), or an anchor's
        content's."""
        np = self.np
        if type(obj) is ArrayContent:
            return self._content(obj.array)
        if type(obj) is not np.ndarray or obj.size == 0 or not plain(obj.dtype):
            self._copy(obj)
            return NotImplemented
        base = obj.base
        if base is None:
            order = usable_owner(obj)
            if order is None:
                self._copy(obj)
                return NotImplemented
            self.sharing.saved.append((obj, id(obj)))
            return _owner, (obj.dtype.str, obj.shape, order,
                            Raw(_bytes_of(_flat_bytes(obj, order)), ("object", id(obj)), obj))
        if usable_owner(base) is None:
            self._copy(obj)
            return NotImplemented
        self.sharing.saved.append((obj, self.group(base)))
        return _view, (base, obj.dtype.str, obj.shape, obj.strides,
                       _address(obj) - _address(base))

    def _content(self, array: Any) -> Any:
        np = self.np
        self.sharing.loose.append((array, _REBUILT))
        if type(array) is np.ndarray and plain(array.dtype) and array.size:
            data = np.ascontiguousarray(array)
            return _owner, (data.dtype.str, data.shape, "C",
                            Raw(_bytes_of(data), ("object", id(array)), array))
        copy = np.array(array, copy=True, subok=True)
        self.keep.append(copy)
        return _identity, (copy,)

    def _copy(self, obj: Any) -> None:
        if obj.size:
            self.sharing.loose.append((obj, ("copy", id(obj))))

    def group(self, owner: Any) -> Any:
        return _REBUILT if id(owner) in self.anchors else id(owner)

    # -- many

    def table(self, seq: list[Any] | tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The persistent id of a list or tuple written as a table, or None."""
        objs = list(seq)  # a list changes in place: the plan keeps what it held
        plan = self.cache.get(id(seq))
        try:
            if plan is None or plan.seq is not seq or not plan.root.still(objs, self) \
                    or not self._apart(plan):
                plan = self._plan(seq, objs)
            emit = _Emit()
            lookup = plan.positions
            for column in plan.root.numbered():
                if not self.met.isdisjoint(column.ids):
                    met = self.met
                    found = {i: column.objs[i] for i, ident in enumerate(column.ids)
                             if ident in met}
                    emit.overrides[id(column)] = found
                    if lookup is plan.positions:
                        lookup = dict(lookup)
                    for i in found:
                        # written in the record: later references go through pickle's memo
                        lookup.pop(column.ids[i], None)
            spec = plan.root.spec(self, emit)
        except _NotATable:
            return None
        self.next_cache[id(seq)] = plan
        self.keep.append(seq)
        self.sharing.columns.extend(emit.columns)
        self.sharing.owners.extend(emit.owners)
        self.numbers[plan] = len(self.lookups)
        self.lookups.append(lookup)
        return ("table", "tuple" if type(seq) is tuple else "list", spec, plan.count - 1)

    def _apart(self, plan: _Plan) -> bool:
        """No object the table numbers belongs to a table written before it in this save."""
        return all(lookup.keys().isdisjoint(column.ids) for column in plan.root.numbered()
                   for lookup in self.lookups)

    def _plan(self, seq: list[Any] | tuple[Any, ...], objs: list[Any]) -> _Plan:
        counter = [0]
        root = self._column(objs, ("table", id(seq)), seq, counter)
        positions: dict[int, int] = {}
        expected = 0
        for column in root.numbered():
            positions.update(zip(column.ids, range(column.start, column.start + len(column.ids)),
                                 strict=True))
            expected += len(column.ids)
        positions[id(seq)] = counter[0]
        if len(positions) != expected + 1:
            raise _NotATable  # one object twice: restored once per position, it would split
        for column in root.numbered():
            if isinstance(column, _Views) and id(column.base) in positions:
                raise _NotATable  # an owner written in the record of its own table
        return _Plan(seq, root, positions, counter[0] + 1)

    def _column(self, objs: list[Any], key: tuple[Any, ...], owner: Any, counter: list[int]
                ) -> _Column:
        n = len(objs)
        if n == 0:
            return _Empty(objs)
        kinds = set(map(type, objs))
        if len(kinds) != 1:
            raise _NotATable
        kind = kinds.pop()
        np = self.np
        if kind in _PYTHON_NUMBERS or (issubclass(kind, np.generic)
                                       and kind.__module__ == "numpy"):
            return self._numbers(kind, objs, key, owner)
        if kind is not self.ndarray and kind is not tuple and kind is not list:
            raise _NotATable
        ids = list(map(id, objs))
        for plan, number in self.numbers.items():
            lookup = self.lookups[number]
            if not lookup.keys().isdisjoint(ids):
                positions = list(map(lookup.get, ids))
                if None in positions:
                    raise _NotATable  # some in an earlier table, some not
                return _Items(objs, plan, Raw(_bytes_of(np.array(positions, dtype=np.int64)),
                                              (*key, "items"), owner))
        if kind is self.ndarray:
            column: _Column = self._arrays(objs, ids, key, owner, counter)
            return column
        if kind is tuple and len(widths := set(map(len, objs))) == 1 \
                and 0 < widths.pop() <= _MAX_TUPLE:
            children = [self._column(list(elements), (*key, j), owner, counter)
                        for j, elements in enumerate(zip(*objs, strict=True))]
            return _Tuples(objs, ids, self._take(counter, n), children)
        lengths = np.fromiter(map(len, objs), dtype=np.int64, count=n)
        flat = list(itertools.chain.from_iterable(objs))
        child = self._column(flat, (*key, "flat"), owner, counter)
        return _Seqs(objs, ids, self._take(counter, n), kind, lengths,
                     Raw(_bytes_of(lengths), (*key, "lengths"), owner), child)

    @staticmethod
    def _take(counter: list[int], n: int) -> int:
        start = counter[0]
        counter[0] += n
        return start

    def _numbers(self, kind: type, objs: list[Any], key: tuple[Any, ...], owner: Any
                 ) -> _Column:
        np = self.np
        python = kind in _PYTHON_NUMBERS
        dtype = np.dtype(_PYTHON_NUMBERS[kind] if python else kind)
        if not python and (dtype.type is not kind or dtype.kind not in _NUMPY_NUMBER_KINDS):
            raise _NotATable
        try:
            values = np.array(objs, dtype=dtype)
        except (OverflowError, ValueError, TypeError):
            raise _NotATable from None
        return _Numbers(objs, "python" if python else "numpy", dtype.str,
                        Raw(_bytes_of(values), (*key, "values"), owner))

    def _arrays(self, objs: list[Any], ids: list[int], key: tuple[Any, ...], owner: Any,
                counter: list[int]) -> _Column:
        np = self.np
        first = objs[0]
        layout = _layouts(objs)
        if layout is None or first.size == 0 or not plain(first.dtype) \
                or len(set(map(id, map(_get("base"), objs)))) != 1:
            raise _NotATable
        shape, strides, dtype = layout
        base = first.base
        if base is None:
            if _order(first) != "C" or not all(map(_get("flags.owndata"), objs)):
                raise _NotATable
            return _Owners(objs, ids, self._take(counter, len(objs)), layout, (*key, "owners"),
                           owner)
        if usable_owner(base) is None:
            raise _NotATable
        offsets = _addresses(objs, np) - _address(base)
        reach = _reach(shape, strides, dtype.itemsize)
        if int(offsets.min()) + reach[0] < 0 or int(offsets.max()) + reach[1] > base.nbytes:
            raise _NotATable  # outside its owner: never for a view NumPy made
        return _Views(objs, ids, self._take(counter, len(objs)), base, layout, offsets,
                      Raw(_bytes_of(offsets), (*key, "offsets"), owner), reach)


def _addresses(arrays: list[Any], np: Any) -> Any:
    """The data pointers of many arrays: through ctypes' buffer interface (C-level calls) when
    they are writeable and C-contiguous, else one Python call each."""
    n = len(arrays)
    try:
        return np.fromiter(map(ctypes.addressof, map(ctypes.c_char.from_buffer, arrays)),
                           dtype=np.int64, count=n)
    except (TypeError, ValueError, BufferError):
        return np.fromiter(map(_address, arrays), dtype=np.int64, count=n)


def _identity(value: Any) -> Any:
    return value


# --------------------------------------------------------------------------- reading


class TableReader:
    """Rebuilds tables, numbering what they hold as the writer did."""

    def __init__(self) -> None:
        self.tables: list[list[Any]] = []

    def item(self, number: Any, position: Any) -> Any:
        try:
            return self.tables[number][position]
        except (IndexError, TypeError):
            raise pickle.UnpicklingError("a damaged reference to saved data") from None

    def table(self, container: Any, spec: Any, start: Any) -> Any:
        if container not in ("list", "tuple"):
            raise pickle.UnpicklingError("a damaged table")
        items: list[Any] = []
        try:
            values = self._column(spec, items)
        except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
            raise pickle.UnpicklingError(f"a damaged table ({exc})") from None
        result = values if container == "list" else tuple(values)
        self._number(items, start, [result])
        self.tables.append(items)
        return result

    @staticmethod
    def _number(items: list[Any], start: Any, objs: list[Any]) -> None:
        if start != len(items):
            raise pickle.UnpicklingError("a damaged table (its numbering)")
        items.extend(objs)

    def _column(self, spec: Any, items: list[Any]) -> list[Any]:
        np = _numpy()
        if not isinstance(spec, tuple) or not spec:
            raise pickle.UnpicklingError("a damaged table")
        kind = spec[0]
        if kind == "empty":
            return []
        if kind == "items":
            _, number, raw = spec
            if not isinstance(number, int) or not 0 <= number < len(self.tables):
                raise pickle.UnpicklingError("a damaged table (a reference)")
            source = self.tables[number]
            positions = np.frombuffer(raw, dtype=np.int64)
            if len(positions) and (positions.min() < 0 or positions.max() >= len(source)):
                raise pickle.UnpicklingError("a damaged table (a reference)")
            return list(map(source.__getitem__, positions.tolist()))
        if kind == "numbers":
            _, tag, dtype, raw = spec
            values = np.frombuffer(raw, dtype=_checked_dtype(dtype))
            return values.tolist() if tag == "python" else list(values)
        *body, overrides, start = spec
        objs: list[Any]
        if kind == "views":
            objs = _views(*body[1:])
        elif kind == "owners":
            _, dtype, shape, raw = body
            stacked = np.frombuffer(raw, dtype=_checked_dtype(dtype))
            size = int(np.prod(shape))
            if size == 0 or stacked.size % size:
                raise pickle.UnpicklingError("a damaged table (its arrays)")
            objs = list(map(np.ndarray.copy, stacked.reshape(-1, *shape)))
        elif kind == "tuples":
            _, width, columns = body
            if width != len(columns) or not width:
                raise pickle.UnpicklingError("a damaged table (its tuples)")
            restored = [self._column(column, items) for column in columns]
            objs = list(zip(*restored, strict=True))
        elif kind == "seqs":
            _, container, raw, flat_spec = body
            lengths = np.frombuffer(raw, dtype=np.int64)
            flat = self._column(flat_spec, items)
            ends = np.cumsum(lengths)
            if len(lengths) and (lengths.min() < 0 or int(ends[-1]) != len(flat)):
                raise pickle.UnpicklingError("a damaged table (its lengths)")
            objs = list(map(flat.__getitem__, map(slice, (ends - lengths).tolist(),
                                                  ends.tolist())))
            if container == "tuple":
                objs = list(map(tuple, objs))
        else:
            raise pickle.UnpicklingError("a damaged table")
        if overrides:
            for i, obj in overrides.items():
                objs[i] = obj
        self._number(items, start, objs)
        return objs


def _views(base: Any, dtype: str, shape: tuple[int, ...], strides: tuple[int, ...],
           raw: bytes) -> list[Any]:
    """Views of one owner at the saved offsets: one array over them all (its first axis steps
    by the offsets' common divisor), indexed at each, so that every view's base is the owner."""
    np = _numpy()
    offsets = np.frombuffer(raw, dtype=np.int64)
    if not len(offsets):
        return []
    lowest = int(offsets.min())
    steps = offsets - lowest
    step = int(np.gcd.reduce(steps)) or 1
    index = (steps // step).tolist()
    every = np.ndarray((max(index) + 1, *shape), _checked_dtype(dtype), buffer=_buffer(base),
                       offset=lowest, strides=(step, *strides))
    if len(shape):
        return list(map(every.__getitem__, index))
    return [every[i, ...] for i in index]
