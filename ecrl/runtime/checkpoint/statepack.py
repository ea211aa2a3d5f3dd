"""StatePack: everything a resumed attempt needs, laid out as one checkpoint image.

A state is a tree of dicts, lists, tuples, scalars, strings, NumPy arrays and tensors (the model,
optimizer and scheduler ``state_dict``s, the sampler position and every rank's RNG states).
:func:`encode` replaces each tensor and array by a reference and turns the rest into JSON (tuples,
non-string dict keys and non-finite floats are tagged so that they come back as they were).
:func:`snapshot_into` copies the tensors and arrays, as raw bytes, straight into a buffer laid out
like the file (:mod:`ecrl.contract.ckptfile`): the only per-checkpoint cost on the training path is
one copy per tensor. :func:`decode` rebuilds the tree from a verified file.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ecrl.contract.ckptfile import (
    CheckpointError,
    Layout,
    VerifiedCheckpoint,
    encode_prefix,
    plan_layout,
)

__all__ = [
    "EncodedState",
    "encode",
    "encode_tree",
    "encode_leaf",
    "skeleton",
    "map_refs",
    "tensor_refs",
    "renumber_refs",
    "snapshot_into",
    "snapshot_tensors",
    "decode",
    "rebuild",
    "rng_state",
    "set_rng_state",
]

_TENSOR, _TUPLE, _DICT, _FLOAT, _NDARRAY = "$tensor", "$tuple", "$dict", "$float", "$ndarray"
SHARDED = "$sharded"
"""A tensor saved as pieces written by several ranks (a DTensor's shards in a sharded
checkpoint): ``{"$sharded": {"dtype", "shape", "pieces": [[tensor index, offsets], ...]}}``,
rebuilt whole (:func:`rebuild`); :mod:`ecrl.runtime.checkpoint.dtensor` writes it."""
_TAGS = frozenset({_TENSOR, _TUPLE, _DICT, _FLOAT, _NDARRAY, SHARDED})


@dataclass(frozen=True, slots=True)
class EncodedState:
    """A state tree with tensors pulled out, ready to be laid out and copied."""

    tree: Any
    tensors: list[torch.Tensor | np.ndarray]
    entries: list[dict[str, Any]]
    """Per tensor: dtype, shape, nbytes and (once laid out) its offset in the data section."""
    layout: Layout


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def encode(state: Any, *, meta: Mapping[str, Any]) -> EncodedState:
    """Separate ``state``'s tensors from its structure and plan the image layout."""
    tree, tensors, entries = encode_tree(state)
    layout = plan_layout(meta=meta, tensors=entries, tree=tree)
    return EncodedState(tree=tree, tensors=tensors, entries=entries, layout=layout)


def encode_tree(state: Any, *, distributed: Distributed | None = None
                ) -> tuple[Any, list[torch.Tensor | np.ndarray], list[dict[str, Any]]]:
    """``state``'s structure (JSON), its tensors in order and an entry (dtype, shape, nbytes)
    per tensor, without the single file's layout (sharded checkpoints place them in chunks):
    :func:`skeleton`, then :func:`encode_leaf` for each tensor and array."""
    tree, leaves = skeleton(state)
    tensors: list[torch.Tensor | np.ndarray] = []
    entries: list[dict[str, Any]] = []
    for value, node in leaves:
        encode_leaf(value, node, tensors, entries, distributed)
    return tree, tensors, entries


Distributed = Callable[[torch.Tensor, dict[str, Any]], Any]
"""What sees every tensor of a sharded checkpoint first (:func:`encode_leaf`)."""


def encode_leaf(value: torch.Tensor | np.ndarray, node: dict[str, Any],
                tensors: list[torch.Tensor | np.ndarray], entries: list[dict[str, Any]],
                distributed: Distributed | None = None) -> None:
    """Fill the (empty) ``node`` standing for ``value`` with its reference, appending it and its
    entry to ``tensors`` and ``entries``.

    ``distributed`` (sharded checkpoints) sees every tensor first: it returns None for a plain
    tensor, ``node`` when it fills the node itself (a DTensor's shards, laid out later), or the
    detached plain tensor to save in its place."""
    if isinstance(value, np.ndarray):
        a = np.ascontiguousarray(value)
        entries.append({"dtype": a.dtype.str, "shape": list(a.shape), "nbytes": a.nbytes,
                        "kind": "numpy"})
        tensors.append(a)
        node[_NDARRAY] = len(tensors) - 1
        return
    instead = distributed(value, node) if distributed is not None else None
    if instead is node:
        return
    t = value.detach() if instead is None else instead
    entries.append({"dtype": dtype_name(t.dtype), "shape": list(t.shape),
                    "nbytes": t.numel() * t.element_size()})
    tensors.append(t)
    node[_TENSOR] = len(tensors) - 1


def skeleton(state: Any) -> tuple[Any, list[tuple[Any, dict[str, Any]]]]:
    """``state``'s structure (JSON) with an empty node where each tensor and NumPy array is, and
    each of them with its node, in order: the part of the encoding that does not depend on the
    tensors (:func:`encode_leaf` fills the nodes)."""
    leaves: list[tuple[Any, dict[str, Any]]] = []

    # Runs at every checkpoint boundary, over every node of the state (about 900 for ResNet-50
    # with AdamW): the path of a value is made only when one is refused, on the way out.
    def walk(value: Any) -> Any:
        if isinstance(value, (torch.Tensor, np.ndarray)):
            node: dict[str, Any] = {}
            leaves.append((value, node))
            return node
        if value is None or isinstance(value, (int, str)):  # bool is an int
            return value
        if isinstance(value, float):
            return value if math.isfinite(value) else {_FLOAT: repr(value)}
        if isinstance(value, np.generic):
            return walk(value.item())
        if isinstance(value, Mapping):
            if all(map(isinstance, value, _STRINGS)) and _TAGS.isdisjoint(value):
                return _walk_items(value.items(), walk, ".{}".format)
            return {_DICT: [[walk(k), _walk_items(((k, v),), walk, "[{!r}]".format)[k]]
                            for k, v in value.items()]}
        if isinstance(value, tuple):
            return {_TUPLE: list(_walk_items(enumerate(value), walk, "[{}]".format).values())}
        if isinstance(value, list):
            return list(_walk_items(enumerate(value), walk, "[{}]".format).values())
        raise _Refused(type(value).__name__)

    try:
        return walk(state), leaves
    except _Refused as refused:
        where = "state" + "".join(reversed(refused.path))
        raise CheckpointError(f"cannot checkpoint {where}: values of type {refused.kind} are "
                              "not supported") from None


_STRINGS = itertools.repeat(str)
"""``str`` as often as asked (``map(isinstance, keys, _STRINGS)``: every key a string)."""


class _Refused(Exception):
    """A value of an unsupported type, with its path collected on the way out of the walk."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind
        self.path: list[str] = []


def _walk_items(items: Iterable[tuple[Any, Any]], walk: Callable[[Any], Any],
                step: Callable[[Any], str]) -> dict[Any, Any]:
    """``{key: walk(value)}``; a refusal below gains ``step(key)`` in its path."""
    out: dict[Any, Any] = {}
    key = None
    try:
        for key, item in items:
            out[key] = walk(item)
    except _Refused as refused:
        refused.path.append(step(key))
        raise
    return out


def map_refs(tree: Any, change: Callable[[int], int]) -> Any:
    """``tree`` (an :func:`encode_tree` tree without sharded nodes) with each tensor reference's
    index replaced by ``change(index)``, called in the order the encoder walked them."""
    if isinstance(tree, list):
        return [map_refs(value, change) for value in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1 and (_TENSOR in tree or _NDARRAY in tree):
        (tag, index), = tree.items()
        return {tag: change(int(index))}
    return {key: map_refs(value, change) for key, value in tree.items()}


def tensor_refs(tree: Any) -> list[int]:
    """The tensor indices ``tree`` refers to, in the encoder's order (:func:`map_refs`)."""
    found: list[int] = []

    def note(index: int) -> int:
        found.append(index)
        return index

    map_refs(tree, note)
    return found


def renumber_refs(tree: Any, indices: Sequence[int]) -> Any:
    """``tree`` with its i-th tensor reference pointing at ``indices[i]`` instead."""
    given = iter(indices)
    renumbered = map_refs(tree, lambda _index: next(given))
    if next(given, None) is not None:
        raise ValueError("more indices than the tree has tensor references")
    return renumbered


def snapshot_into(state: EncodedState, image: memoryview) -> None:
    """Copy the header and every tensor of ``state`` into ``image`` (at least layout.size)."""
    encode_prefix(state.layout, image)
    snapshot_tensors(state, image, range(len(state.tensors)))


def snapshot_tensors(state: EncodedState, image: memoryview, indices: Iterable[int]) -> None:
    """Copy the tensors ``indices`` of ``state`` to their places in ``image`` (the header is
    :func:`ecrl.contract.ckptfile.encode_prefix`'s; :mod:`ecrl.runtime.checkpoint.pipeline` copies
    the tensors in two parts)."""
    layout = state.layout
    small: list[tuple[int, int, torch.Tensor]] = []
    for index in indices:
        tensor, entry = state.tensors[index], state.entries[index]
        nbytes = int(entry["nbytes"])
        if not nbytes:
            continue
        start = layout.data_start + int(entry["offset"])
        if isinstance(tensor, torch.Tensor) and tensor.device.type != "cpu" and \
                nbytes <= SMALL_DEVICE_TENSOR:
            small.append((start, nbytes, tensor))
            continue
        if isinstance(tensor, np.ndarray):
            target_bytes = np.frombuffer(image, dtype=np.uint8, count=nbytes, offset=start)
            target_bytes[:] = tensor.reshape(-1).view(np.uint8)
            del target_bytes
            continue
        target = torch.frombuffer(image, dtype=torch.uint8, count=nbytes, offset=start)
        target.view(tensor.dtype).view(tensor.shape).copy_(tensor)
        del target
    if small:
        copy_in_one_transfer(image, small)


SMALL_DEVICE_TENSOR = 1 << 20
"""Bytes up to which a device tensor joins :func:`copy_in_one_transfer`'s batch."""


def copy_in_one_transfer(image: memoryview, items: Sequence[tuple[int, int, torch.Tensor]]
                         ) -> None:
    """Copy each ``(offset, nbytes, tensor)`` to ``image[offset:offset + nbytes]``: the tensors
    of each device gathered into one buffer there and brought to the host at once.

    A checkpoint of a model on a GPU holds hundreds of small tensors that the pipelined copy does
    not defer (BatchNorm statistics and counters, optimizer step counts); copied one by one, each
    is a device-to-host transfer that waits for the device, and their waits add up in the
    training thread's stall. Gathered, they cost one kernel and one transfer."""
    by_device: dict[torch.device, list[tuple[int, int, torch.Tensor]]] = {}
    for item in items:
        by_device.setdefault(item[2].device, []).append(item)
    for group in by_device.values():
        flat = torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8)
                          for _, _, t in group]).cpu()
        at = 0
        for offset, nbytes, _ in group:
            target = torch.frombuffer(image, dtype=torch.uint8, count=nbytes, offset=offset)
            target.copy_(flat[at:at + nbytes])
            del target
            at += nbytes


def decode(ckpt: VerifiedCheckpoint) -> Any:
    """The state tree of a verified checkpoint, with fresh (owned, CPU) tensors."""
    entries: Sequence[dict[str, Any]] = ckpt.header["tensors"]

    def raw(index: int) -> torch.Tensor:
        entry = entries[index]
        return torch.frombuffer(ckpt.data, dtype=torch.uint8, count=int(entry["nbytes"]),
                                offset=ckpt.data_start + int(entry["offset"]))

    return rebuild_from_bytes(ckpt.header["tree"], entries, raw, where=ckpt.path)


def rebuild_from_bytes(tree: Any, entries: Sequence[Mapping[str, Any]],
                       raw: Callable[[int], torch.Tensor], *, where: object) -> Any:
    """The state of an encoded ``tree`` whose tensor ``i`` is the bytes ``raw(i)`` (a uint8
    tensor of ``entries[i]["nbytes"]``, asked for only when that is not 0), as fresh (owned, CPU)
    tensors and arrays: the one reading of an entry's dtype and shape, shared by both
    checkpoint formats (one file, or a sharded directory's chunks). ``where`` names the
    checkpoint in errors."""

    def declared(index: int, itemsize: int) -> tuple[Mapping[str, Any], tuple[int, ...]]:
        # The bytes become exactly the declared dtype and shape, or the entry is refused.
        entry = entries[index]
        shape = entry.get("shape") if isinstance(entry, Mapping) else None
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape) \
                or entry.get("nbytes") != math.prod(shape) * itemsize:
            raise CheckpointError(f"{where}: tensor {index}'s shape {shape!r} and size "
                                  f"{entry.get('nbytes') if isinstance(entry, Mapping) else None!r}"
                                  " do not agree with its dtype")
        return entry, tuple(shape)

    def tensor(index: int) -> torch.Tensor:
        name = entries[index].get("dtype") if isinstance(entries[index], Mapping) else None
        dtype = getattr(torch, name, None) if isinstance(name, str) else None
        if not isinstance(dtype, torch.dtype):
            raise CheckpointError(f"{where}: unknown tensor dtype {name!r}")
        entry, shape = declared(index, dtype.itemsize)
        if not int(entry["nbytes"]):
            return torch.empty(shape, dtype=dtype)
        return raw(index).view(dtype).view(shape).clone()

    def sharded(inner: Any) -> torch.Tensor:
        return _assemble(inner, tensor, where)

    def array(index: int) -> np.ndarray:
        name = entries[index].get("dtype") if isinstance(entries[index], Mapping) else None
        try:
            dtype = np.dtype(name) if isinstance(name, str) else None
        except TypeError:
            dtype = None
        if dtype is None or dtype.hasobject:  # an object array would be pointers, not data
            raise CheckpointError(f"{where}: unknown array dtype {name!r}")
        entry, shape = declared(index, dtype.itemsize)
        if not int(entry["nbytes"]):
            return np.empty(shape, dtype=dtype)
        return raw(index).numpy().view(dtype).reshape(shape).copy()

    return rebuild(tree, tensor=tensor, array=array, sharded=sharded)


def _assemble(inner: Any, tensor: Callable[[int], torch.Tensor], where: object) -> torch.Tensor:
    """The whole tensor of a :data:`SHARDED` node from its pieces, which must tile it exactly:
    each inside it, none overlapping another, together every element (else it is refused: a
    gap would be uninitialised memory)."""
    def bad(why: str) -> CheckpointError:
        return CheckpointError(f"{where}: a sharded tensor's pieces {why}")

    if not isinstance(inner, Mapping) or not isinstance(inner.get("pieces"), list):
        raise bad("are not listed")
    shape, name = inner.get("shape"), inner.get("dtype")
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape) \
            or not isinstance(dtype, torch.dtype):
        raise bad(f"have no valid whole shape and dtype ({shape!r}, {name!r})")
    # Every piece is read and checked before the whole is allocated: a forged shape cannot make
    # a load allocate more than the bytes the checkpoint really holds.
    placed: list[tuple[tuple[int, ...], torch.Tensor]] = []
    for item in inner["pieces"]:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], int)
                and isinstance(item[1], list) and len(item[1]) == len(shape)
                and all(isinstance(n, int) and n >= 0 for n in item[1])):
            raise bad(f"are not [index, offsets] pairs ({item!r})")
        piece = tensor(item[0])
        start, size = tuple(item[1]), tuple(piece.shape)
        if piece.dtype != dtype or len(size) != len(shape) or \
                any(a + n > total for a, n, total in zip(start, size, shape, strict=True)):
            raise bad(f"do not fit the whole tensor (a {piece.dtype} piece of {list(size)} at "
                      f"{list(start)} in {name} {shape})")
        for other_start, other in placed:
            if all(a < b + m and b < a + n for a, n, b, m
                   in zip(start, size, other_start, other.shape, strict=True)):
                raise bad(f"overlap (at {list(start)} and {list(other_start)})")
        placed.append((start, piece))
    covered, count = sum(piece.numel() for _, piece in placed), math.prod(shape)
    if covered != count:
        raise bad(f"cover {covered} of its {count} elements")
    whole = torch.empty(shape, dtype=dtype)
    for start, piece in placed:
        target = whole
        for dim, (a, n) in enumerate(zip(start, piece.shape, strict=True)):
            target = target.narrow(dim, a, n)
        target.copy_(piece)
    return whole


def rebuild(tree: Any, *, tensor: Callable[[int], torch.Tensor],
            array: Callable[[int], np.ndarray], sharded: Callable[[Any], torch.Tensor]) -> Any:
    """The state of an encoded ``tree``; ``tensor(i)``/``array(i)`` give tensor ``i``,
    ``sharded(node)`` the whole tensor of a :data:`SHARDED` node."""

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (tag, inner), = value.items()
            if tag == _TENSOR:
                return tensor(inner)
            if tag == _TUPLE:
                return tuple(walk(v) for v in inner)
            if tag == _DICT:
                return {walk(k): walk(v) for k, v in inner}
            if tag == _FLOAT:
                return float(inner)
            if tag == _NDARRAY:
                return array(inner)
            if tag == SHARDED:
                return sharded(inner)
        return {k: walk(v) for k, v in value.items()}

    return walk(tree)


def rng_state() -> dict[str, Any]:
    """This process's RNG states: Python, NumPy, torch CPU and (when present) every CUDA device.

    Python's Mersenne Twister state (625 words) travels as a uint32 array, so that it is copied as
    bytes rather than written into the JSON header number by number.
    """
    version, words, gauss = random.getstate()
    return {
        "python": {"version": version, "words": np.array(words, dtype=np.uint32),
                   "gauss": gauss},
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Inverse of :func:`rng_state`."""
    python = state["python"]
    random.setstate((python["version"], tuple(int(w) for w in python["words"]),
                     python["gauss"]))
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
