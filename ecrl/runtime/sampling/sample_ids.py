"""``ecrl.WithSampleIds``: a dataset wrapper whose items carry their sample ID.

``WithSampleIds(dataset)[i]`` is ``(i, dataset[i])``. Through ``DataLoader`` workers and the
default collation a batch becomes ``(ids, batch)`` with ``ids`` a ``LongTensor`` of the indices
the sampler chose, in batch order. The step log records those IDs: the IDs that reached the step,
not IDs recomputed from the step number (which would make the log agree with the sampler by
construction, and a loader that loses, repeats or reorders data would go unnoticed).

A loader with a ``collate_fn`` of its own would hand it ``(id, item)`` pairs it does not expect:
``collate_fn=WithSampleIds.collate(my_collate)`` gives it the items and puts the IDs beside its
result, ``(ids, my_collate(items))``.

Items and batches are :class:`SampleIdPair` s, tuples that unpack as ``ids, batch`` and that the
framework integrations recognise by their type: Lightning's ``ECRLCallback`` takes the IDs off
before ``training_step`` sees the batch (a plain ``(ids, batch)`` tuple of the user's own could
not be told apart from a batch of two tensors). The default collation keeps the type (it collates
a named tuple field by field), so do Lightning's and Accelerate's moves to the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, NamedTuple, TypeVar

import torch
from torch.utils.data import Dataset

__all__ = ["SampleIdPair", "WithSampleIds"]

T = TypeVar("T")


class SampleIdPair(NamedTuple, Generic[T]):
    """An item ``(sample_id, item)`` of :class:`WithSampleIds`, or a batch of them collated:
    ``(ids, batch)``, ``ids`` a ``LongTensor`` in batch order."""

    sample_id: Any
    item: T


_new_pair = tuple.__new__


class WithSampleIds(Dataset[SampleIdPair[T]], Generic[T]):
    """``(sample_id, item)`` for every item of ``dataset`` (a map-style dataset)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> SampleIdPair[T]:
        return SampleIdPair(int(index), self.dataset[index])

    def __getitems__(self, indices: Sequence[int]) -> list[SampleIdPair[T]]:
        # torch's fetcher calls this for a whole batch when it exists: keep the wrapped data
        # set's own batched read if it has one.
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(list(indices)) if getitems is not None else [
            self.dataset[i] for i in indices]
        # tuple.__new__ on (id, item) pairs: the named tuple's own constructor is a Python
        # function, and this runs for every sample (a fifth of the wrapper's cost per batch).
        return [_new_pair(SampleIdPair, pair)
                for pair in zip(map(int, indices), items, strict=True)]

    @staticmethod
    def collate(collate_fn: Callable[[list[Any]], Any]) -> Callable[[list[tuple[int, Any]]], Any]:
        """A ``collate_fn`` for ``DataLoader`` that gives ``collate_fn`` the items of a batch of
        ``(id, item)`` pairs and returns ``(ids, collate_fn(items))``, ``ids`` a ``LongTensor``
        in batch order (what the default collation gives, with the caller's own collation)."""
        if not callable(collate_fn):
            raise TypeError(f"WithSampleIds.collate needs a function, got "
                            f"{type(collate_fn).__name__}")
        return _CollateWithIds(collate_fn)

    def __getattr__(self, name: str) -> Any:
        # Attributes of the wrapped data set (classes, transforms …) stay reachable.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


class _CollateWithIds:
    """A picklable collate function (loader workers may be spawned): the IDs apart, the items
    to the caller's ``collate_fn``."""

    def __init__(self, collate_fn: Callable[[list[Any]], Any]) -> None:
        self.collate_fn = collate_fn

    def __call__(self, batch: list[tuple[int, Any]]) -> SampleIdPair[Any]:
        ids = torch.tensor([pair[0] for pair in batch], dtype=torch.long)
        return SampleIdPair(ids, self.collate_fn([pair[1] for pair in batch]))
