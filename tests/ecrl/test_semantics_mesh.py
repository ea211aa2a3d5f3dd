"""Meshes in the sampling contract (docs/semantics.md, "Meshes"): the window is split over the
data-parallel ranks and tensor-parallel peers consume the identical shard."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ecrl.contract import semantics as sem
from ecrl.contract.errors import RunFormatError, SemanticsError
from ecrl.contract.runformat import RunManifest, StepRecord


@st.composite
def meshes(draw: st.DrawFn) -> tuple[sem.Geometry, int, int, int]:
    dp = draw(st.integers(1, 6))
    tp = draw(st.integers(1, 4))
    b = dp * draw(st.integers(1, 5))
    d = b * draw(st.integers(1, 6)) + draw(st.integers(0, b - 1))
    return sem.Geometry(dataset_size=d, global_batch=b), dp, tp, draw(st.integers(0, 40))


@settings(max_examples=40)
@given(meshes(), st.integers(0, 2**32))
def test_dp_shards_partition_the_window_and_tp_peers_share_one(
        mesh: tuple[sem.Geometry, int, int, int], seed: int) -> None:
    geometry, dp, tp, step = mesh
    w = dp * tp
    window = sem.window(geometry, seed, step)
    by_dp: dict[int, np.ndarray] = {}
    for rank in range(w):
        coords = sem.MeshCoords.of_rank(rank, w, tp_size=tp)
        ids = sem.mesh_shard(geometry, seed, step, coords)
        assert ids.size == sem.mesh_local_batch(geometry.global_batch, dp)
        if coords.dp_rank in by_dp:  # a tensor-parallel peer: the identical shard
            assert np.array_equal(by_dp[coords.dp_rank], ids)
        by_dp[coords.dp_rank] = ids
    assert sorted(by_dp) == list(range(dp))
    assert np.array_equal(np.concatenate([by_dp[d] for d in range(dp)]), window)


def test_ddp_is_the_mesh_without_tensor_parallelism() -> None:
    geometry = sem.Geometry(dataset_size=50, global_batch=6)
    for rank in range(3):
        coords = sem.MeshCoords.of_rank(rank, 3)
        assert coords == sem.MeshCoords.ddp(rank, 3)
        assert np.array_equal(sem.mesh_shard(geometry, 7, 11, coords),
                              sem.shard(geometry, 7, 11, rank, 3))


def test_layout_puts_tensor_parallel_peers_next_to_each_other() -> None:
    coords = [sem.MeshCoords.of_rank(r, 4, tp_size=2) for r in range(4)]
    assert [(c.dp_rank, c.tp_rank) for c in coords] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert coords[3].as_fields() == {"dp_rank": 1, "dp_size": 2, "tp_rank": 1, "tp_size": 2}
    assert coords[3].world_size == 4


def test_a_change_of_the_data_parallel_degree_keeps_the_window() -> None:
    geometry = sem.Geometry(dataset_size=64, global_batch=8)
    before = [sem.mesh_shard(geometry, 3, 5, sem.MeshCoords.of_rank(r, 4, tp_size=1))
              for r in range(4)]
    after = [sem.mesh_shard(geometry, 3, 5, sem.MeshCoords.of_rank(r, 4, tp_size=2))
             for r in range(0, 4, 2)]
    assert np.array_equal(np.concatenate(before), np.concatenate(after))


@pytest.mark.parametrize(("call", "words"), [
    (lambda: sem.data_parallel_degree(6, 4), "not divisible by the tensor-parallel size 4"),
    (lambda: sem.mesh_local_batch(10, 4), "not divisible by the data-parallel size 4"),
    (lambda: sem.MeshCoords(dp_rank=2, dp_size=2), "data-parallel rank must be in [0, 1]"),
    (lambda: sem.MeshCoords(dp_rank=0, dp_size=1, tp_rank=1, tp_size=1),
     "tensor-parallel rank"),
    (lambda: sem.mesh_shard(sem.Geometry(dataset_size=20, global_batch=6), 0, 0,
                            sem.MeshCoords(dp_rank=0, dp_size=4)), "data-parallel size 4"),
])
def test_bad_meshes_are_refused_in_one_line(call: Callable[[], object], words: str) -> None:
    with pytest.raises(SemanticsError) as info:
        call()
    assert words in str(info.value) and "\n" not in str(info.value)


def _record(**extra: object) -> dict[str, object]:
    return {"schema_version": 1, "attempt": 0, "global_step": 0, "epoch": 0, "cursor_step": 0,
            "rank": 1, "world_size": 4, "local_batch": 2, "sample_ids_count": 2,
            "sample_ids_hash": "0" * 16, "loss": 1.0, "time": 0.0, **extra}


def test_step_records_carry_the_mesh_coordinates_optionally() -> None:
    plain = StepRecord.from_dict(_record())
    assert plain.mesh is None and "dp_rank" not in plain.to_dict()
    fields = sem.MeshCoords.of_rank(1, 4, tp_size=2).as_fields()
    record = StepRecord.from_dict(_record(**fields))
    assert record.mesh == (0, 2, 1, 2)
    assert record.to_dict() == _record(**fields)
    with pytest.raises(RunFormatError, match="'dp_size' must be a positive integer"):
        StepRecord.from_dict(_record(**{**fields, "dp_size": 0}))


def test_run_json_records_the_mesh_of_each_attempt() -> None:
    base = {"schema_version": 1, "seed": 0, "dataset": {"name": "x", "size": 10},
            "global_batch": 4, "steps_per_epoch": 2, "target_steps": 4,
            "permutation": {"algorithm": "a", "version": 1}, "log_ids": True,
            "strategy": "none", "ckpt_every": 0, "fail_at": [], "world_sizes": [4, 2],
            "model": "m", "created": "now"}
    assert RunManifest.from_dict(base).mesh_of(3) is None
    meshes = [{"dp_size": 2, "tp_size": 2, "parallel": "fsdp"}, {"dp_size": 1, "tp_size": 2}]
    manifest = RunManifest.from_dict({**base, "meshes": meshes})
    assert manifest.mesh_of(0) == meshes[0] and manifest.mesh_of(5) == meshes[1]
    assert manifest.to_dict()["meshes"] == meshes
    with pytest.raises(RunFormatError, match="meshes"):
        RunManifest.from_dict({**base, "meshes": [{"dp_size": 2}]})
