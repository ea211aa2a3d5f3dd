"""How a sharded checkpoint packs its tensors into chunks (``pack_chunks``, torch-free)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract.shardfile import ALIGN, pack_chunks

sizes_lists = st.lists(st.integers(min_value=0, max_value=1 << 20), max_size=60)


@given(sizes=sizes_lists, parts=st.integers(min_value=1, max_value=8))
def test_every_tensor_has_an_aligned_place_of_its_own_inside_one_chunk(
        sizes: list[int], parts: int) -> None:
    places, chunks = pack_chunks(sizes, parts)
    assert len(places) == len(sizes) and len(chunks) <= parts
    assert bool(chunks) == bool(sizes)
    previous = (0, -1)
    for size, (chunk, offset) in zip(sizes, places, strict=True):
        assert offset % ALIGN == 0 and offset + size <= chunks[chunk]
        # in order, never overlapping the tensor before it
        assert (chunk, offset) >= previous
        if chunk == previous[0] and previous[1] >= 0:
            assert offset >= previous[1]
        previous = (chunk, offset + size)
    # every chunk is used, and holds nothing but its tensors (padding to ALIGN aside)
    for k, total in enumerate(chunks):
        inside = [-(-s // ALIGN) * ALIGN for s, (c, _) in zip(sizes, places, strict=True)
                  if c == k]
        assert sum(inside) == total


@given(sizes=sizes_lists, parts=st.integers(min_value=1, max_value=8))
def test_chunks_share_the_bytes_about_equally(sizes: list[int], parts: int) -> None:
    _places, chunks = pack_chunks(sizes, parts)
    if not sizes:
        return
    largest = max(-(-s // ALIGN) * ALIGN for s in sizes)
    share = sum(chunks) / parts
    # a chunk misses its share by less than one tensor (tensors are never split)
    assert max(chunks) <= share + largest
    if len(chunks) == parts:
        assert min(chunks) >= share - largest


def test_equal_tensors_split_evenly() -> None:
    places, chunks = pack_chunks([4096] * 8, 2)
    assert chunks == [4 * 4096, 4 * 4096]
    assert [c for c, _ in places] == [0, 0, 0, 0, 1, 1, 1, 1]


@given(sizes=sizes_lists, parts=st.integers(min_value=1, max_value=8), data=st.data())
def test_pinned_tensors_go_to_their_owners_chunk_and_nothing_overlaps(
        sizes: list[int], parts: int, data: st.DataObject) -> None:
    owners = data.draw(st.lists(st.none() | st.integers(min_value=0, max_value=parts - 1),
                                min_size=len(sizes), max_size=len(sizes)))
    places, chunks = pack_chunks(sizes, parts, owners)
    assert len(places) == len(sizes) and len(chunks) <= parts
    for owner, (chunk, _offset) in zip(owners, places, strict=True):
        assert owner is None or chunk == owner
    for k, total in enumerate(chunks):
        spans = sorted((offset, offset + -(-s // ALIGN) * ALIGN)
                       for s, (c, offset) in zip(sizes, places, strict=True) if c == k)
        assert all(offset % ALIGN == 0 for offset, _ in spans)
        # the chunk is exactly its tensors, one after the other
        assert [a for a, _ in spans] == [0, *(b for _, b in spans[:-1])][:len(spans)]
        assert (spans[-1][1] if spans else 0) == total
    # without pins, the balanced placement is the one pack_chunks always made
    free = [s for s, o in zip(sizes, owners, strict=True) if o is None]
    balanced = [p for p, o in zip(places, owners, strict=True) if o is None]
    assert balanced == pack_chunks(free, parts)[0]


def test_a_pin_outside_the_chunks_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="outside"):
        pack_chunks([8, 8], 2, [None, 2])
