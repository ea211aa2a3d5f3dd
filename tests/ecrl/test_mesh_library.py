"""The library on a mesh (issue 31): GlobalBatchSampler and StepLog given a DeviceMesh, its
data-parallel sub-mesh or explicit coordinates feed each rank its data-parallel shard and log
where it sits. One process; the DeviceMesh test spawns 4 gloo processes on the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.multiprocessing as mp

import ecrl
from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.contract.runformat import RunPaths
from ecrl.runtime import _attempt
from ecrl.runtime.sampling import steplog as steplog_module
from ecrl.runtime.sampling.mesh import coords_from_mesh


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ECRL_")]:
        monkeypatch.delenv(key)
    _attempt._CACHE.clear()


def test_sampler_with_explicit_coordinates_yields_the_data_parallel_shard() -> None:
    d, b, seed = 90, 8, 3
    geometry = semantics.Geometry(dataset_size=d, global_batch=b)
    for rank in range(8):  # DP 4 x TP 2
        c = semantics.MeshCoords.of_rank(rank, 8, tp_size=2)
        sampler = ecrl.GlobalBatchSampler(d, b, seed=seed, dp_rank=c.dp_rank, dp_size=4,
                                          tp_rank=c.tp_rank, tp_size=2, steps=12)
        assert sampler.mesh_coords == c
        assert (sampler.rank, sampler.world_size, sampler.local_batch) == (c.dp_rank, 4, 2)
        batches = list(sampler)
        assert len(batches) == 12
        for step, ids in enumerate(batches):
            assert ids == semantics.mesh_shard(geometry, seed, step, c).tolist()


def test_sampler_refuses_a_mesh_the_batch_does_not_divide_in_one_line() -> None:
    with pytest.raises(SemanticsError, match="not divisible by the data-parallel size 3"):
        ecrl.GlobalBatchSampler(90, 8, dp_rank=0, dp_size=3)
    with pytest.raises(ConfigError, match="give dp_rank= and dp_size= together"):
        ecrl.GlobalBatchSampler(90, 8, tp_rank=0, tp_size=2)
    with pytest.raises(ConfigError, match="not both"):
        ecrl.GlobalBatchSampler(90, 8, rank=0, world_size=2, dp_rank=0, dp_size=2)


def _fake_rank(monkeypatch: pytest.MonkeyPatch, run: Path, rank: int, world: int) -> None:
    """This process plays ``rank`` of a standalone attempt 0 of ``world`` ranks."""
    attempt = _attempt.Attempt(paths=RunPaths.of(run), attempt=0, rank=rank, world_size=world,
                               env=None)
    RunPaths.of(run).attempt_dir(0).mkdir(parents=True, exist_ok=True)
    monkeypatch.setattr(steplog_module, "resolve_attempt", lambda run_dir: attempt)


def write_mesh_run(monkeypatch: pytest.MonkeyPatch, run: Path, *, dp: int, tp: int,
                   steps: int = 6, d: int = 50, b: int = 4, seed: int = 1,
                   log_ids: bool = True) -> None:
    """Every rank of a DP x TP attempt logs its steps through the library, as a script would."""
    for rank in range(dp * tp):
        _fake_rank(monkeypatch, run, rank, dp * tp)
        c = semantics.MeshCoords.of_rank(rank, dp * tp, tp_size=tp)
        sampler = ecrl.GlobalBatchSampler(d, b, seed=seed, steps=steps, **c.as_fields())
        with ecrl.StepLog(run, sampler=sampler, steps=steps, log_ids=log_ids) as log:
            for step, ids in enumerate(sampler):
                log.step(step, sample_ids=np.asarray(ids), loss=0.5)


def test_step_log_records_the_mesh_coordinates_and_run_json_the_mesh(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run = tmp_path / "run"
    write_mesh_run(monkeypatch, run, dp=2, tp=2)
    manifest = json.loads((run / "run.json").read_text())
    assert manifest["meshes"] == [{"dp_size": 2, "tp_size": 2}]
    logs = run / "logs" / "attempt-000"
    for rank in range(4):
        records = [json.loads(x) for x in (logs / f"rank-{rank:03d}.jsonl").read_text()
                   .splitlines()]
        c = semantics.MeshCoords.of_rank(rank, 4, tp_size=2)
        assert len(records) == 6
        for r in records:
            assert (r["dp_rank"], r["dp_size"], r["tp_rank"], r["tp_size"]) == (
                c.dp_rank, 2, c.tp_rank, 2)
            assert r["local_batch"] == 2 and r["world_size"] == 4 and r["rank"] == rank
    peers = [(logs / f"rank-{r:03d}.jsonl").read_text().splitlines() for r in (2, 3)]
    assert [json.loads(x)["sample_ids"] for x in peers[0]] == \
        [json.loads(x)["sample_ids"] for x in peers[1]]


def test_step_log_refuses_a_mesh_that_is_not_the_jobs(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    _fake_rank(monkeypatch, tmp_path, 0, 4)
    sampler = ecrl.GlobalBatchSampler(50, 4, dp_rank=0, dp_size=4, tp_rank=0, tp_size=2)
    with pytest.raises(ConfigError, match="DP 4 x TP 2 = 8 ranks, but this job has 4"):
        ecrl.StepLog(tmp_path, sampler=sampler, steps=3)
    plain = ecrl.GlobalBatchSampler(50, 4, rank=0, world_size=4)
    with pytest.raises(ConfigError, match="the GlobalBatchSampler has no mesh"):
        ecrl.StepLog(tmp_path, sampler=plain, steps=3, dp_rank=0, dp_size=2, tp_rank=0,
                     tp_size=2)
    with pytest.raises(ConfigError, match="not supported yet"):
        ecrl.StepLog(tmp_path, sampler={"kind": "external", "name": "x"}, dataset_size=50,
                     global_batch=4, steps=3, dp_rank=0, dp_size=2, tp_rank=0, tp_size=2)


def _mesh_worker(rank: int, port: int, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=4)
    try:
        found: dict[str, Any] = {}
        mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
        found["full"] = coords_from_mesh(mesh, world_size=4).as_fields()
        found["sub"] = coords_from_mesh(mesh["dp"], world_size=4).as_fields()
        sampler = ecrl.GlobalBatchSampler(40, 4, mesh=mesh["dp"], steps=1)
        found["batch"] = next(iter(sampler))
        hsdp = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_replicate", "dp_shard"))
        found["hsdp"] = coords_from_mesh(hsdp, world_size=4).as_fields()
        found["layouts"] = _layouts(rank, hsdp)
        Path(out, f"{rank}.json").write_text(json.dumps(found))
    finally:
        dist.destroy_process_group()


def _layouts(rank: int, mesh: Any) -> list[Any]:
    """Four checkpoints' shard layouts of an HSDP-placed state through one box cache (the
    sharded checkpointer's): each layout's pieces and owners, and whether it gathered every
    rank's boxes (a real all_gather_object, counted)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from ecrl.runtime.checkpoint import statepack
    from ecrl.runtime.checkpoint.dtensor import LayoutCache, ShardLayout

    gathers = []
    real = dist.all_gather_object

    def counted(*args: Any, **kwargs: Any) -> Any:
        gathers.append(1)
        return real(*args, **kwargs)

    dist.all_gather_object = counted
    cache = LayoutCache()
    out = []
    try:
        # the third checkpoint's tensor has another whole shape, the fourth another dtype
        for rows, dtype in ((8, torch.float32), (8, torch.float32), (6, torch.float32),
                            (6, torch.float64)):
            whole = torch.arange(rows * 3, dtype=dtype).reshape(rows, 3)
            state = {"w": distribute_tensor(whole, mesh, [Replicate(), Shard(0)]), "n": 1}
            shards = ShardLayout(cache)
            tree, values, entries = statepack.encode_tree(state, distributed=shards)
            shards.keep()
            before = len(gathers)
            owners = shards.lay_out(values, entries, rank=rank, world_size=4)
            out.append({"tree": tree, "owners": owners, "gathered": len(gathers) - before,
                        "shapes": [e["shape"] for e in entries],
                        "bytes": [e["nbytes"] for e in entries]})
        # The last DTensor taken twice more: as it is (what was taken from it is reused), then
        # with its local shard moved to other memory in place (taken again, the new values).
        w = state["w"]
        taken = [cache.leaves[id(w)]]
        for moved in (False, True):
            if moved:
                w._local_tensor.set_(torch.full_like(w._local_tensor, 7.0))
            shards = ShardLayout(cache)
            _tree, values, entries = statepack.encode_tree({"w": w, "n": 1}, distributed=shards)
            shards.keep()
            shards.lay_out(values, entries, rank=rank, world_size=4)
            taken.append(cache.leaves[id(w)])
        out.append({"reused": taken[1] is taken[0], "retaken": taken[2] is not taken[1],
                    "values": [float(leaf[3].flatten()[0]) for leaf in taken],
                    "kept": _kept_encodings(rank, cache, w)})
    finally:
        dist.all_gather_object = real
    return out


def _kept_encodings(rank: int, cache: Any, w: Any) -> list[str]:
    """Three checkpoints of ``{"w": w, "rng": <a new tensor each time>}`` through a kept
    encoding, ``w``'s local shard moved to other memory before the third: whether each reused
    the encoding or encoded anew."""
    import torch

    from ecrl.runtime.checkpoint import statepack
    from ecrl.runtime.checkpoint.dtensor import ShardLayout
    from ecrl.runtime.checkpoint.sharded._reuse import Encoding, KeptEncoding

    kept = KeptEncoding()
    how = []
    for moved in (False, False, True):
        if moved:
            w._local_tensor.set_(torch.full_like(w._local_tensor, 5.0))
        _tree, leaves = statepack.skeleton({"w": w, "rng": torch.ones(3)})
        if kept.reuse(leaves) is not None:
            how.append("reused")
            continue
        shards = ShardLayout(cache)
        values: list[Any] = []
        entries: list[Any] = []
        for value, node in leaves:
            statepack.encode_leaf(value, node, values, entries, shards)
        shards.keep()
        shards.lay_out(values, entries, rank=rank, world_size=4)
        kept.keep(leaves, Encoding(values, entries, [], [], object()), cache)
        how.append("encoded")
    return how


def test_coordinates_come_from_a_real_device_mesh_or_its_data_parallel_sub_mesh(
        tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_mesh_worker, args=(port, str(tmp_path)), nprocs=4, start_method="spawn")
    geometry = semantics.Geometry(dataset_size=40, global_batch=4)
    for rank in range(4):
        found = json.loads((tmp_path / f"{rank}.json").read_text())
        expected = semantics.MeshCoords.of_rank(rank, 4, tp_size=2).as_fields()
        assert found["full"] == expected and found["sub"] == expected
        assert found["batch"] == semantics.shard(geometry, 0, 0, rank // 2, 2).tolist()
        assert found["hsdp"] == {"dp_rank": rank, "dp_size": 4, "tp_rank": 0, "tp_size": 1}
        # The shard layout gathers every rank's boxes only when the geometries change: the
        # second checkpoint (same geometry) reuses the first's, pieces and owners alike.
        first, second, third, fourth, again = found["layouts"]
        assert [layout["gathered"] for layout in found["layouts"][:4]] == [1, 0, 1, 1]
        # the same DTensor is taken from the memo; moved to other memory, it is taken anew
        assert again["reused"] and again["retaken"]
        own_first = float(rank % 2 * 9)  # the first element of this rank's rows of arange(18)
        assert again["values"] == [own_first, own_first, 7.0]
        # a kept encoding serves the same DTensor (a new plain tensor of the same shape beside
        # it), and declines once its shard moved
        assert again["kept"] == ["encoded", "reused", "encoded"]
        assert second == {**first, "gathered": 0}
        assert third["bytes"] == [36, 36] and fourth["bytes"] == [72, 72]
        assert fourth["tree"]["w"]["$sharded"]["dtype"] == "float64"
        # two boxes (the replica groups share them, written once, by ranks 0 and 1)
        assert first["owners"] == [0, 1] and first["shapes"] == [[4, 3], [4, 3]]
        assert third["owners"] == [0, 1] and third["shapes"] == [[3, 3], [3, 3]]


def test_a_mesh_run_written_through_the_library_verifies(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    from verifier import render_text, verify_run

    for log_ids in (True, False):
        run = tmp_path / f"ids-{log_ids}"
        write_mesh_run(monkeypatch, run, dp=2, tp=2, log_ids=log_ids)
        result = verify_run(run)
        assert result.verdict == "PASS", render_text(result)
        assert result.checked["shards"] == result.checked["committed_records"] == 24
