"""The compiled kernels of the semantics (``ecrl/contract/_native.c``) compute exactly what its
numpy version computes: the epoch permutation (Feistel network, cycle walking) and the rows'
multiset hashes. A build without a C compiler runs the numpy version; both define the run's data
order, so they must never differ."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ecrl.contract import semantics as sem

native = sem.native
T = TypeVar("T")


def test_the_kernels_are_built() -> None:
    """`make setup` compiles them (setup.py): the suite tests the code users run."""
    assert native is not None


def _both(fn: Callable[[], T]) -> tuple[T, T]:
    """``fn()`` with the compiled kernels, then with numpy's (as a build without them)."""
    compiled = fn()
    sem.native = None
    try:
        return compiled, fn()
    finally:
        sem.native = native


@given(size=st.one_of(st.integers(1, 5000), st.integers(1, sem.MAX_DATASET_SIZE)),
       seed=st.integers(0, sem.MAX_SEED), epoch=st.integers(0, 2**64 - 1),
       picks=st.lists(st.integers(0, 2**62), min_size=1, max_size=200))
def test_permutation_is_the_same_compiled_and_in_numpy(size: int, seed: int, epoch: int,
                                                       picks: list[int]) -> None:
    positions = np.array([p % size for p in picks], dtype=np.int64)

    def ids() -> np.ndarray:
        return sem.EpochPermutation(dataset_size=size, seed=seed, epoch=epoch)(positions)

    compiled, numpy = _both(ids)
    assert compiled.dtype == numpy.dtype == np.int64
    assert np.array_equal(compiled, numpy)
    assert np.all((compiled >= 0) & (compiled < size))


@given(size=st.integers(1, 3000), seed=st.integers(0, sem.MAX_SEED), epoch=st.integers(0, 99))
def test_a_whole_epoch_is_the_same_permutation_both_ways(size: int, seed: int, epoch: int
                                                         ) -> None:
    compiled, numpy = _both(lambda: sem.EpochPermutation(
        dataset_size=size, seed=seed, epoch=epoch).range(0, size))
    assert np.array_equal(compiled, numpy)
    assert np.array_equal(np.sort(compiled), np.arange(size))


@given(rows=st.lists(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=3, max_size=3),
                     max_size=40))
def test_row_hashes_are_the_same_compiled_and_in_numpy(rows: list[list[int]]) -> None:
    block = np.array(rows, dtype=np.int64).reshape(len(rows), 3)
    compiled, numpy = _both(lambda: sem.ids_hashes(block))
    assert compiled.dtype == numpy.dtype == np.uint64
    assert np.array_equal(compiled, numpy)
    assert [int(h) for h in compiled] == [sem.ids_hash(row) if row else 0 for row in rows]


def test_the_permutation_kernel_refuses_what_could_walk_forever() -> None:
    """A position at or beyond the data set's size, or masks that are not the halves of the
    network, would never end the cycle walk: a ValueError instead of a hang."""
    assert native is not None
    keys = np.arange(8, dtype=np.uint64)
    out = np.empty(1, dtype=np.int64)
    with pytest.raises(ValueError, match="below limit"):
        native.feistel(keys, 2, 3, 3, 10, np.array([10], dtype=np.uint64), out)
    with pytest.raises(ValueError, match="halves"):
        native.feistel(keys, 2, 7, 3, 10, np.array([1], dtype=np.uint64), out)
    with pytest.raises(ValueError, match="halves"):
        native.feistel(keys, 2, 3, 3, 17, np.array([1], dtype=np.uint64), out)
    native.feistel(keys, 2, 3, 3, 16, np.array([15], dtype=np.uint64), out)
    assert 0 <= out[0] < 16


@given(ids=st.lists(st.one_of(st.integers(0, 10**6), st.integers(-(2**70), 2**70),
                              st.booleans()), max_size=100),
       as_tuple=st.booleans())
def test_list_hash_is_the_python_loop(ids: list[int], as_tuple: bool) -> None:
    """The step log's hash of one batch's IDs: any int (negative, beyond 64 bits, a bool) is
    taken mod 2^64, as the Python loop's masks take it."""
    given_ids = tuple(ids) if as_tuple else ids
    compiled, python = _both(lambda: sem.int_ids_hash(given_ids))
    assert native is not None and native.list_hash(given_ids) == compiled == python
    assert python == sem.ids_hash(np.array([i % 2**64 for i in ids], dtype=np.uint64)) \
        if ids else python == 0


def test_list_hash_leaves_other_items_to_the_python_loop() -> None:
    assert native is not None and native.list_hash([1, 2.0]) is None
    with pytest.raises(TypeError):
        sem.int_ids_hash([1, 2.5])


@given(ids=st.lists(st.integers(0, 2**63 - 1), max_size=3 * sem.SMALL_HASH))
@example(ids=list(range(sem.SMALL_HASH)))
@example(ids=list(range(2**40, 2**40 + sem.SMALL_HASH + 1)))  # the longer lists' way
def test_a_batchs_hash_is_the_same_at_every_length_and_both_ways(ids: list[int]) -> None:
    """The step log's hash of a batch: the kernel at any length, else the Python loop up to
    SMALL_HASH IDs and numpy beyond; all the multiset hash of the IDs."""
    compiled, fallback = _both(lambda: sem.batch_ids_hash(ids))
    assert compiled == fallback == (sem.ids_hash(np.array(ids, dtype=np.int64)) if ids else 0)
