"""Coverage: which steps each rank and attempt logged, and which samples each epoch consumed.

Steps are tracked as *runs* of consecutive steps in file order (a correct rank log is one run),
so memory does not grow with the number of steps; interval arithmetic over those runs finds
missing, duplicated and out-of-order records and steps exactly.

Samples (only when IDs are logged) are counted per epoch in a byte per sample ID (0, 1 or "2 or
more"), which is the only state that grows with the dataset; an epoch's counts are judged and
dropped as soon as the committed lineage has moved past it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics

__all__ = [
    "Interval",
    "StepRuns",
    "Overlap",
    "merge",
    "overlaps",
    "difference",
    "clip",
    "size",
    "EpochVerdict",
    "SampleCoverage",
]

Interval = tuple[int, int]
"""Half-open range of steps ``[start, stop)``."""


@dataclass(slots=True)
class StepRuns:
    """Runs of consecutive steps one rank logged, in file order, with their first lines."""

    starts: list[int] = field(default_factory=list)
    stops: list[int] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)

    def add(self, steps: npt.NDArray[np.int64], first_line: int
            ) -> tuple[int, list[tuple[int, int, int]]]:
        """Append a batch; return (number of regressions, the first few as (line, step, prev))."""
        if steps.size == 0:
            return 0, []
        regressions: list[tuple[int, int, int]] = []
        count = 0
        if self.stops and int(steps[0]) < self.stops[-1] - 1:
            count += 1
            regressions.append((first_line, int(steps[0]), self.stops[-1] - 1))
        back = np.flatnonzero(steps[1:] < steps[:-1])
        if back.size:
            count += int(back.size)
            regressions += [(first_line + int(i) + 1, int(steps[i + 1]), int(steps[i]))
                             for i in back[:5]]
        breaks = (np.flatnonzero(steps[1:] != steps[:-1] + 1) + 1).tolist()
        begin = 0
        if self.stops and int(steps[0]) == self.stops[-1]:
            end = breaks[0] if breaks else steps.size
            self.stops[-1] = int(steps[end - 1]) + 1
            begin = end
            breaks = breaks[1:]
        for lo, hi in zip([begin, *breaks], [*breaks, steps.size], strict=True):
            if lo >= hi:
                continue
            self.starts.append(int(steps[lo]))
            self.stops.append(int(steps[hi - 1]) + 1)
            self.lines.append(first_line + lo)
        return count, regressions

    def runs(self) -> list[tuple[int, int, int]]:
        """(start, stop, first line) in file order."""
        return list(zip(self.starts, self.stops, self.lines, strict=True))

    @property
    def first_step(self) -> int | None:
        return self.starts[0] if self.starts else None

    @property
    def last_step(self) -> int | None:
        return max(self.stops) - 1 if self.stops else None

    def line_of(self, step: int) -> int | None:
        """Line of the first record of ``step`` in file order."""
        for start, stop, line in zip(self.starts, self.stops, self.lines, strict=True):
            if start <= step < stop:
                return line + step - start
        return None

    def clipped(self, lo: int, hi: int | None) -> list[tuple[int, int, int]]:
        """Runs restricted to steps ``lo .. hi`` (inclusive; None: no upper bound)."""
        out = []
        for start, stop, line in self.runs():
            a = max(start, lo)
            b = stop if hi is None else min(stop, hi + 1)
            if a < b:
                out.append((a, b, line + a - start))
        return out


@dataclass(frozen=True, slots=True)
class Overlap:
    """Steps ``[start, stop)`` covered twice: by ``first`` and again by ``again`` (run indices)."""

    start: int
    stop: int
    first: int
    again: int


def merge(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint, non-adjacent union."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[0] < i[1]):
        if out and a <= out[-1][1]:
            if b > out[-1][1]:
                out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def overlaps(intervals: Sequence[Interval]) -> list[Overlap]:
    """Every stretch covered by two or more of ``intervals`` (indices into the sequence)."""
    order = sorted(range(len(intervals)), key=lambda i: intervals[i])
    found: list[Overlap] = []
    reach, owner = None, -1
    for i in order:
        a, b = intervals[i]
        if a >= b:
            continue
        if reach is not None and a < reach:
            found.append(Overlap(a, min(b, reach), owner, i))
        if reach is None or b > reach:
            reach, owner = b, i
    return found


def difference(a: Sequence[Interval], b: Sequence[Interval]) -> list[Interval]:
    """``a - b`` for merged interval lists."""
    out: list[Interval] = []
    j = 0
    for start, stop in a:
        cur = start
        while j < len(b) and b[j][1] <= cur:
            j += 1
        k = j
        while k < len(b) and b[k][0] < stop:
            if b[k][0] > cur:
                out.append((cur, b[k][0]))
            cur = max(cur, b[k][1])
            k += 1
        if cur < stop:
            out.append((cur, stop))
    return out


def clip(intervals: Iterable[Interval], lo: int, hi: int) -> list[Interval]:
    """Restrict to ``[lo, hi)``."""
    return [(max(a, lo), min(b, hi)) for a, b in intervals if max(a, lo) < min(b, hi)]


def size(intervals: Iterable[Interval]) -> int:
    return sum(b - a for a, b in intervals)


@dataclass(frozen=True, kw_only=True, slots=True)
class EpochVerdict:
    """An epoch's sample multiset against the samples its committed windows contain."""

    epoch: int
    steps: int
    """Committed-lineage steps of the epoch that were expected (below target_steps)."""
    duplicates: npt.NDArray[np.int64]
    missing: npt.NDArray[np.int64]
    extra: npt.NDArray[np.int64]
    counts: tuple[int, int, int]
    """Full counts of (duplicates, missing, extra); the arrays hold the first few."""


class SampleCoverage:
    """Per-epoch sample counts over the committed lineage (when IDs are logged)."""

    KEEP = 32
    """IDs kept per epoch and kind as witness candidates."""

    def __init__(self, geometry: semantics.Geometry, seed: int, target_steps: int) -> None:
        self.geometry = geometry
        self.seed = seed
        self.target_steps = target_steps
        self._counts: dict[int, npt.NDArray[np.uint8]] = {}
        self.epochs_checked = 0
        self.samples_counted = 0

    @property
    def open_epochs(self) -> list[int]:
        return sorted(self._counts)

    def add(self, step: int, ids: npt.NDArray[np.int64]) -> None:
        """Count the in-range IDs a committed record of ``step`` consumed."""
        self.add_epoch(step // self.geometry.steps_per_epoch, ids)

    def add_epoch(self, epoch: int, ids: npt.NDArray[np.int64]) -> None:
        d = self.geometry.dataset_size
        counts = self._counts.get(epoch)
        if counts is None:
            counts = self._counts[epoch] = np.zeros(d, dtype=np.uint8)
        ids = ids[(ids >= 0) & (ids < d)]
        self.samples_counted += int(ids.size)
        if ids.size == 0:
            return
        unique, times = np.unique(ids, return_counts=True)
        # Saturating at 2 keeps one byte per sample exact for "once" vs "more than once".
        counts[unique] = np.minimum(counts[unique].astype(np.int64) + times, 2).astype(np.uint8)

    def add_distinct(self, epoch: int, ids: npt.NDArray[np.int64]) -> None:
        """Count IDs known to be distinct and in range (the expected shards of distinct steps
        of one rank: disjoint slices of the epoch's permutation), without sorting them."""
        counts = self._counts.get(epoch)
        if counts is None:
            counts = self._counts[epoch] = np.zeros(self.geometry.dataset_size, dtype=np.uint8)
        self.samples_counted += int(ids.size)
        counts[ids] = np.minimum(counts[ids], 1) + 1

    def expected_mask(self, epoch: int) -> npt.NDArray[np.bool_]:
        """Samples the epoch's steps below target_steps consume (by the window definition)."""
        g = self.geometry
        steps = max(0, min(g.steps_per_epoch, self.target_steps - epoch * g.steps_per_epoch))
        used = steps * g.global_batch
        perm = semantics.epoch_permutation(dataset_size=g.dataset_size, seed=self.seed,
                                           epoch=epoch)
        # Whichever side of the cut is smaller is computed: a full epoch leaves out < B IDs.
        if used >= g.dataset_size - used:
            mask = np.ones(g.dataset_size, dtype=bool)
            mask[perm.range(used, g.dataset_size)] = False
        else:
            mask = np.zeros(g.dataset_size, dtype=bool)
            mask[perm.range(0, used)] = True
        return mask

    def finish(self, epoch: int) -> EpochVerdict | None:
        """Judge and drop one epoch's counts (None if no committed record touched it)."""
        counts = self._counts.pop(epoch, None)
        if counts is None:
            return None
        self.epochs_checked += 1
        mask = self.expected_mask(epoch)
        dup = np.flatnonzero(counts >= 2)
        missing = np.flatnonzero((counts == 0) & mask)
        extra = np.flatnonzero((counts >= 1) & ~mask)
        g = self.geometry
        steps = max(0, min(g.steps_per_epoch, self.target_steps - epoch * g.steps_per_epoch))
        return EpochVerdict(epoch=epoch, steps=steps, duplicates=dup[: self.KEEP],
                            missing=missing[: self.KEEP], extra=extra[: self.KEEP],
                            counts=(int(dup.size), int(missing.size), int(extra.size)))

    def finish_before(self, step: int) -> list[EpochVerdict]:
        """Judge every open epoch whose last step is before ``step``."""
        s = self.geometry.steps_per_epoch
        done = [e for e in self._counts if (e + 1) * s <= step]
        return [v for e in sorted(done) if (v := self.finish(e)) is not None]

    def finish_all(self) -> list[EpochVerdict]:
        return [v for e in sorted(self._counts) if (v := self.finish(e)) is not None]
