"""A sharded checkpoint's encoding, kept for the next checkpoint of the same state.

Between two checkpoints of a training run the state's tensors are, as a rule, the same objects:
the model's parameters and buffers, the optimizer's moments and step counts. Only their values
change, and the values are copied anyway. Everything else the boundary derives from the tensors —
each one's manifest entry, a DTensor's pieces and their owners, the chunk of every tensor and its
offset there — then stands as it was, and recomputing it is most of the boundary's Python (about
3 ms of 6 for ResNet-50 with AdamW under FSDP2 here).

:class:`KeptEncoding` holds the last encoding; :meth:`KeptEncoding.reuse` hands it out again for a
new :func:`ecrl.runtime.checkpoint.statepack.skeleton` of the state when, leaf by leaf:

- a DTensor is the same object, with the same spec and the same local tensor over the same memory
  (:func:`ecrl.runtime.checkpoint.dtensor.still_taken`): its pieces stand, aliases and all;
- a plain tensor (or NumPy array) has the dtype and shape of the previous one at its place: its
  entry stands; its value is taken again (the previous alias, while the tensor is the same object
  over the same memory; a fresh one otherwise — the RNG states are new tensors each time).

Anything else (another number of leaves, a new or moved DTensor, a tensor of another shape, a
DTensor saved whole because its shard is not one box) declines, and the caller encodes anew. The
structure around the tensors (dicts, scalars, strings) comes from the new skeleton every time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.dtensor import LayoutCache, is_dtensor, same_memory, still_taken

__all__ = ["Encoding", "KeptEncoding"]


@dataclass(slots=True)
class Encoding:
    """What a sharded checkpoint's capture derives from its state's tensors."""

    values: list[Any]
    """Per manifest entry, the tensor or array to save (a meta tensor for another rank's piece)."""
    entries: list[dict[str, Any]]
    """Manifest entries, with their chunk and offset."""
    places: list[tuple[int, int]]
    chunk_sizes: list[int]
    layout: object
    """Stands for the values' dtypes and shapes: the same object for every reuse."""


@dataclass(slots=True)
class _Leaf:
    source: Any
    """The state's tensor or array."""
    content: dict[str, Any]
    """What its node of the tree holds."""
    index: int | None
    """Its place among the values (None: a DTensor, saved as pieces)."""
    taken: Any
    """A DTensor: what was taken from it (:class:`ShardLayout`); else its value as saved."""


class KeptEncoding:
    """The last encoding of a sharded checkpoint's state, and whether it still holds."""

    def __init__(self) -> None:
        self._leaves: list[_Leaf] | None = None
        self._encoding: Encoding | None = None

    def keep(self, leaves: list[tuple[Any, dict[str, Any]]], encoding: Encoding,
             layouts: LayoutCache) -> None:
        """Keep ``encoding``, made from ``leaves`` (their nodes filled) with ``layouts``."""
        kept: list[_Leaf] = []
        for value, node in leaves:
            (tag, ref), = node.items()
            if is_dtensor(value):
                if tag != statepack.SHARDED:
                    self.forget()  # saved whole (gathered by a collective): never reused
                    return
                kept.append(_Leaf(value, dict(node), None, layouts.leaves[id(value)]))
            else:
                kept.append(_Leaf(value, dict(node), int(ref), encoding.values[int(ref)]))
        self._leaves, self._encoding = kept, encoding

    def forget(self) -> None:
        self._leaves = self._encoding = None

    def reuse(self, leaves: list[tuple[Any, dict[str, Any]]]) -> Encoding | None:
        """The kept encoding for a skeleton's ``leaves`` (their nodes filled), or None (nodes
        untouched) when it does not hold for them."""
        kept, encoding = self._leaves, self._encoding
        if kept is None or encoding is None or len(kept) != len(leaves):
            return None
        values = list(encoding.values)
        for (value, _node), leaf in zip(leaves, kept, strict=True):
            if leaf.index is None:
                if not (is_dtensor(value) and still_taken(leaf.taken, value)):
                    return None
                continue
            before = leaf.taken
            if isinstance(value, np.ndarray):
                now: Any = np.ascontiguousarray(value)
                if not isinstance(before, np.ndarray) or now.dtype != before.dtype:
                    return None
            elif isinstance(value, torch.Tensor) and not is_dtensor(value) and \
                    isinstance(before, torch.Tensor):
                now = before if value is leaf.source and same_memory(value, before) \
                    else value.detach()
                if now.dtype != before.dtype:
                    return None
            else:
                return None
            if now.shape != before.shape:
                return None
            values[leaf.index] = now
        for (_value, node), leaf in zip(leaves, kept, strict=True):
            node.update(leaf.content)
        return Encoding(values=values, entries=list(encoding.entries), places=encoding.places,
                        chunk_sizes=encoding.chunk_sizes, layout=encoding.layout)
