"""``ecrl.WithSampleIds``: a dataset wrapper whose items carry their sample ID.

``WithSampleIds(dataset)[i]`` is ``(i, dataset[i])``. Through ``DataLoader`` workers and the
default collation a batch becomes ``(ids, batch)`` with ``ids`` a ``LongTensor`` of the indices
the sampler chose, in batch order. The step log records those IDs: the IDs that reached the step,
not IDs recomputed from the step number (which would make the log agree with the sampler by
construction, and a loader that loses, repeats or reorders data would go unnoticed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from torch.utils.data import Dataset

__all__ = ["WithSampleIds"]

T = TypeVar("T")


class WithSampleIds(Dataset[tuple[int, T]], Generic[T]):
    """``(sample_id, item)`` for every item of ``dataset`` (a map-style dataset)."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> tuple[int, T]:
        return int(index), self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> list[tuple[int, T]]:
        # torch's fetcher calls this for a whole batch when it exists: keep the wrapped data
        # set's own batched read if it has one.
        getitems = getattr(self.dataset, "__getitems__", None)
        items = getitems(list(indices)) if getitems is not None else [
            self.dataset[i] for i in indices]
        return [(int(i), item) for i, item in zip(indices, items, strict=True)]

    def __getattr__(self, name: str) -> Any:
        # Attributes of the wrapped data set (classes, transforms …) stay reachable.
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
