"""The global-batch sampler's order: shards from ecrl.contract.semantics, resume at the same or
another world size, a state from another run refused."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract import semantics
from ecrl.contract.errors import SemanticsError
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler

GEOMETRY = semantics.Geometry(dataset_size=100, global_batch=12)


def _sampler(*, rank: int, world_size: int, global_batch: int = 12) -> GlobalBatchSampler:
    return GlobalBatchSampler(100, global_batch, seed=9, rank=rank, world_size=world_size)


def test_shards_are_the_semantics_shards() -> None:
    sampler = _sampler(rank=1, world_size=3)
    for step, ids in enumerate(itertools.islice(iter(sampler), 20)):  # crosses S = 8
        assert np.array_equal(ids, semantics.shard(GEOMETRY, sampler.seed, step, 1, 3))
    assert sampler.next_step == 20


@given(stop=st.integers(0, 30), old=st.sampled_from([1, 2, 3, 4, 6, 12]),
       new=st.sampled_from([1, 2, 3, 4, 6, 12]))
def test_resume_at_another_world_size_reshards_the_same_window(stop: int, old: int,
                                                               new: int) -> None:
    before = _sampler(rank=0, world_size=old)
    for _ in itertools.islice(iter(before), stop):
        pass
    saved = before.state_dict()
    shards = []
    for rank in range(new):
        after = _sampler(rank=rank, world_size=new)
        after.load_state_dict(saved)
        assert after.next_step == stop
        shards.append(next(iter(after)))
    assert np.array_equal(np.concatenate(shards), semantics.window(GEOMETRY, before.seed, stop))


def test_a_state_from_another_run_is_refused() -> None:
    saved = _sampler(rank=0, world_size=1).state_dict()
    other = _sampler(rank=0, world_size=1, global_batch=10)
    with pytest.raises(SemanticsError, match="B=12"):
        other.load_state_dict(saved)
    with pytest.raises(SemanticsError, match="not divisible"):
        _sampler(rank=0, world_size=5)


def test_per_epoch_iterations_end_at_each_epoch_and_count_the_whole_epoch() -> None:
    # What a framework's epoch loop expects (Lightning): one iteration per epoch, and a length
    # counted from the epoch's first step even when a resume starts in its middle.
    sampler = GlobalBatchSampler(20, 4, seed=3, steps=12, rank=0, world_size=2,
                                 per_epoch=True)  # 5 steps per epoch
    assert len(sampler) == 5
    first = list(sampler)
    assert first == [sampler.shard_of(s).tolist() for s in range(5)]
    assert sampler.next_step == 5 and len(sampler) == 5
    assert len(list(sampler)) == 5
    assert len(sampler) == 2  # the last epoch is cut at steps=12
    assert list(sampler) == [sampler.shard_of(s).tolist() for s in (10, 11)]
    assert len(sampler) == 0 and list(sampler) == []
    resumed = GlobalBatchSampler(20, 4, seed=3, steps=12, rank=0, world_size=2, per_epoch=True)
    resumed.load_state_dict(semantics.SamplerState.at_step(resumed.geometry, 3, 7).to_dict())
    assert len(resumed) == 5  # epoch 1 counted from its start, step 5
    assert list(resumed) == [resumed.shard_of(s).tolist() for s in (7, 8, 9)]
