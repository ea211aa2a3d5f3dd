"""Interval arithmetic over step runs, and per-epoch sample counts, against plain sets."""

from __future__ import annotations

from itertools import pairwise

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract import semantics
from verifier.coverage import SampleCoverage, StepRuns, clip, difference, merge, overlaps, size

intervals = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 60)).map(
    lambda t: (min(t), max(t))), max_size=8)


def points(ivs: list[tuple[int, int]]) -> set[int]:
    return {x for a, b in ivs for x in range(a, b)}


@given(intervals)
def test_merge_is_the_union(ivs: list[tuple[int, int]]) -> None:
    merged = merge(ivs)
    assert points(merged) == points(ivs)
    assert all(b1 < a2 for (_, b1), (a2, _) in pairwise(merged))
    assert size(merged) == len(points(ivs))


@given(intervals)
def test_overlaps_find_every_point_covered_twice(ivs: list[tuple[int, int]]) -> None:
    twice = {x for x in range(61) if sum(a <= x < b for a, b in ivs) >= 2}
    found = overlaps(ivs)
    assert points([(o.start, o.stop) for o in found]) == twice
    for o in found:
        assert ivs[o.first][0] <= o.start < ivs[o.first][1]
        assert ivs[o.again][0] <= o.start < ivs[o.again][1]
        assert o.first != o.again


@given(intervals, intervals, st.integers(0, 60), st.integers(0, 60))
def test_difference_and_clip(a: list[tuple[int, int]], b: list[tuple[int, int]], lo: int,
                             hi: int) -> None:
    assert points(difference(merge(a), merge(b))) == points(a) - points(b)
    assert points(clip(a, lo, hi)) == {x for x in points(a) if lo <= x < hi}


@given(st.lists(st.lists(st.integers(0, 30), max_size=12), max_size=5))
def test_step_runs_keep_every_step_in_file_order(batches: list[list[int]]) -> None:
    runs = StepRuns()
    line = 1
    for steps in batches:
        runs.add(np.array(steps, dtype=np.int64), line)
        line += len(steps)
    flat = [s for steps in batches for s in steps]
    rebuilt = [(n, s) for start, stop, first in runs.runs()
               for n, s in enumerate(range(start, stop), start=first)]
    assert rebuilt == list(enumerate(flat, start=1))
    assert runs.first_step == (flat[0] if flat else None)
    assert runs.last_step == (max(flat) if flat else None)
    for step in set(flat):
        assert runs.line_of(step) == flat.index(step) + 1


def test_sample_coverage_counts_an_epoch_exactly() -> None:
    geometry = semantics.Geometry(dataset_size=10, global_batch=4)  # S = 2, N = 8
    cov = SampleCoverage(geometry, seed=0, target_steps=3)
    window0 = semantics.window(geometry, 0, 0)  # [7, 8, 2, 6]
    window1 = semantics.window(geometry, 0, 1)  # [9, 3, 0, 4]
    cov.add(0, window0)
    cov.add(1, np.array([9, 3, 9, 5]))  # 9 twice, 0 and 4 missing, 5 is an unused sample
    verdict = cov.finish(0)
    assert verdict is not None and verdict.counts == (1, 2, 1)
    assert verdict.duplicates.tolist() == [9]
    assert sorted(verdict.missing.tolist()) == sorted(set(window1.tolist()) - {9, 3})
    assert verdict.extra.tolist() == [5]
    assert cov.finish(0) is None
    # Epoch 1 has one step below the target of 3: only its first window is expected.
    cov.add(2, semantics.window(geometry, 0, 2))
    assert [v.counts for v in cov.finish_all()] == [(0, 0, 0)]
    assert cov.epochs_checked == 2


def test_counts_saturate_instead_of_wrapping() -> None:
    geometry = semantics.Geometry(dataset_size=4, global_batch=4)
    cov = SampleCoverage(geometry, seed=0, target_steps=1)
    for _ in range(300):
        cov.add(0, np.array([1, 1, 2]))
    verdict = cov.finish(0)
    assert verdict is not None and verdict.duplicates.tolist() == [1, 2]
    assert sorted(verdict.missing.tolist()) == [0, 3]
