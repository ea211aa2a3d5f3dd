"""The resumable sampler: shards from ecrl.contract.semantics, resume at the same or another world
size."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract import semantics
from ecrl.contract.errors import SemanticsError
from ecrl.runtime.sampling.sampler import ResumableSampler

GEOMETRY = semantics.Geometry(dataset_size=100, global_batch=12)


def test_shards_are_the_semantics_shards() -> None:
    sampler = ResumableSampler(GEOMETRY, seed=5, rank=1, world_size=3)
    for _ in range(20):  # crosses the epoch border (S = 8)
        step, ids = next(sampler)
        assert np.array_equal(ids, semantics.shard(GEOMETRY, 5, step, 1, 3))
    assert sampler.next_step == 20


@given(stop=st.integers(0, 30), old=st.sampled_from([1, 2, 3, 4, 6, 12]),
       new=st.sampled_from([1, 2, 3, 4, 6, 12]))
def test_resume_at_another_world_size_reshards_the_same_window(stop: int, old: int,
                                                               new: int) -> None:
    before = ResumableSampler(GEOMETRY, seed=9, rank=0, world_size=old)
    for _ in range(stop):
        next(before)
    saved = before.state_dict()
    shards = []
    for rank in range(new):
        after = ResumableSampler(GEOMETRY, seed=9, rank=rank, world_size=new)
        after.load_state_dict(saved)
        step, ids = next(after)
        assert step == stop
        shards.append(ids)
    assert np.array_equal(np.concatenate(shards), semantics.window(GEOMETRY, 9, stop))


def test_a_state_from_another_run_is_refused() -> None:
    saved = ResumableSampler(GEOMETRY, seed=9, rank=0, world_size=1).state_dict()
    other = ResumableSampler(semantics.Geometry(dataset_size=100, global_batch=10), seed=9,
                             rank=0, world_size=1)
    with pytest.raises(SemanticsError, match="B=12"):
        other.load_state_dict(saved)
    with pytest.raises(SemanticsError, match="not divisible"):
        ResumableSampler(GEOMETRY, seed=9, rank=0, world_size=5)
