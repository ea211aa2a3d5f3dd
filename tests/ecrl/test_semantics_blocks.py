"""Vectorised shards and row hashes agree with the step-by-step definitions of
ecrl.contract.semantics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract import semantics as sem
from ecrl.contract.errors import SemanticsError


@st.composite
def cases(draw: st.DrawFn) -> tuple[sem.Geometry, int, list[int], int, int]:
    batch = draw(st.sampled_from([1, 2, 4, 6, 8, 12]))
    size = draw(st.integers(batch, 300))
    geometry = sem.Geometry(dataset_size=size, global_batch=batch)
    world = draw(st.sampled_from([w for w in range(1, batch + 1) if batch % w == 0]))
    rank = draw(st.integers(0, world - 1))
    steps = draw(st.lists(st.integers(0, 5 * geometry.steps_per_epoch), max_size=30))
    seed = draw(st.integers(0, sem.MAX_SEED))
    return geometry, seed, steps, rank, world


@given(cases())
def test_shard_block_rows_are_shards(case: tuple[sem.Geometry, int, list[int], int, int]) -> None:
    geometry, seed, steps, rank, world = case
    block = sem.shard_block(geometry, seed, steps, rank, world)
    assert block.shape == (len(steps), geometry.global_batch // world)
    for row, step in zip(block, steps, strict=True):
        assert np.array_equal(row, sem.shard(geometry, seed, step, rank, world))


@given(cases())
def test_shard_hashes_are_ids_hashes(case: tuple[sem.Geometry, int, list[int], int, int]) -> None:
    geometry, seed, steps, rank, world = case
    hashes = sem.shard_hashes(geometry, seed, steps, rank, world)
    expected = [sem.ids_hash(sem.shard(geometry, seed, s, rank, world)) for s in steps]
    assert hashes.tolist() == expected


def test_shard_hashes_of_every_world_size_sum_to_the_window_hash() -> None:
    geometry = sem.Geometry(dataset_size=1000, global_batch=12)
    steps = np.arange(0, 250, 7)
    windows = [sem.ids_hash(sem.window(geometry, 3, int(s))) for s in steps]
    for world in (1, 2, 3, 4, 6, 12):
        total = sum(sem.shard_hashes(geometry, 3, steps, r, world) for r in range(world))
        assert np.asarray(total, dtype=np.uint64).tolist() == windows


def test_ids_hashes_rows() -> None:
    rows = np.array([[7, 8], [2, 6], [0, 0]])
    assert sem.ids_hashes(rows).tolist() == [sem.ids_hash(r) for r in rows]
    assert sem.ids_hashes(np.zeros((3, 0), dtype=np.int64)).tolist() == [0, 0, 0]
    with pytest.raises(SemanticsError, match="2-D"):
        sem.ids_hashes(np.array([1, 2]))


def test_shard_block_rejects_bad_input() -> None:
    geometry = sem.Geometry(dataset_size=100, global_batch=4)
    with pytest.raises(SemanticsError, match="not divisible"):
        sem.shard_block(geometry, 0, [0], 0, 3)
    with pytest.raises(SemanticsError, match="non-negative"):
        sem.shard_block(geometry, 0, [-1], 0, 2)
    assert sem.shard_block(geometry, 0, [], 0, 2).shape == (0, 2)
