"""Meshes in the verifier (verifier/mesh.py): generated mesh runs pass whatever their data-parallel
degree per attempt, the mesh mutations are caught, and claims that do not form one mesh are named
rank by rank. Hypothesis under the ci profile: a few dozen cheap examples."""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, note, settings
from hypothesis import strategies as st

from ecrl.contract import semantics
from verifier import render_text, verify_run
from verifier._mutations import CATALOGUE, apply, judge
from verifier._testing.generate import RunSpec, generate_run
from verifier.anomalies import AnomalySink
from verifier.mesh import attempt_mesh

MESH_MUTATIONS = [m for m in CATALOGUE if m.name in (
    "tp_peers_disagree", "dp_shard_wrong_rank", "mesh_changed_without_resume")]
FEW = settings(max_examples=min(30, settings.default.max_examples))


@st.composite
def mesh_specs(draw: st.DrawFn) -> RunSpec:
    """Mesh runs: per attempt a tensor-parallel degree and a data-parallel degree dividing B."""
    batch = draw(st.sampled_from([2, 4, 6, 8]))
    attempts = draw(st.integers(1, 3))
    dps = [draw(st.sampled_from([d for d in range(1, batch + 1) if batch % d == 0]))
           for _ in range(attempts)]
    tps = [draw(st.sampled_from([1, 2, 3])) for _ in range(attempts)]
    steps = draw(st.integers(4, 24))
    fails = sorted(draw(st.sets(st.integers(0, steps - 2), min_size=attempts - 1,
                                max_size=attempts - 1)))
    return RunSpec(
        dataset_size=draw(st.integers(batch, 6 * batch + 5)), global_batch=batch,
        target_steps=steps, seed=draw(st.integers(0, 2**40)),
        world_sizes=tuple(d * t for d, t in zip(dps, tps, strict=True)), tp_sizes=tuple(tps),
        fail_at=tuple(fails), ckpt_every=draw(st.sampled_from([1, 2, 3, 5])),
        strategy=draw(st.sampled_from(["blocking", "overlapped", "sharded"])),
        log_ids=draw(st.booleans()), chaos=draw(st.integers(0, 2**32)),
        stop_at=None if draw(st.integers(0, 3)) != 0 or not fails
        else draw(st.integers(fails[-1] + 1, steps - 1)))


@FEW
@given(mesh_specs())
def test_every_generated_mesh_run_gets_its_verdict(spec: RunSpec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run")
        result = verify_run(run.root)
        note(render_text(result))
        assert not result.anomaly_counts, render_text(result)
        if spec.finished:
            assert result.verdict == "PASS", render_text(result)
            assert result.checked["shards"] == result.checked["committed_records"]
        assert result.checked["fast_path_records"] == run.records


@FEW
@given(mesh_specs(), st.sampled_from(MESH_MUTATIONS), st.integers(0, 2**32))
def test_every_mesh_mutation_is_caught(spec: RunSpec, mutation: Any, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run")
        outcome = apply(mutation, run.root, Path(tmp) / "mutant", random.Random(seed))
        if outcome is None:
            return
        result = verify_run(Path(tmp) / "mutant")
        assert judge(outcome, result.verdict, list(result.anomaly_counts)), (
            f"{outcome}\n{render_text(result)}")


def test_the_mesh_mutations_apply_to_a_mesh_run_and_are_caught(tmp_path: Path) -> None:
    spec = RunSpec(dataset_size=40, global_batch=4, target_steps=24, world_sizes=(4, 2),
                   tp_sizes=(2,), fail_at=(9,), ckpt_every=3, log_ids=False, chaos=2)
    root = generate_run(spec, tmp_path / "run").root
    for mutation in MESH_MUTATIONS:
        for seed in range(2):
            outcome = apply(mutation, root, tmp_path / f"{mutation.name}-{seed}",
                            random.Random(seed))
            assert outcome is not None and outcome.verdict == "FAIL"
            result = verify_run(tmp_path / f"{mutation.name}-{seed}")
            assert judge(outcome, result.verdict, list(result.anomaly_counts)), (
                f"{outcome}\n{render_text(result)}")


def _first(rank: int, world: int, tp: int, **override: int) -> dict[str, Any]:
    coords = semantics.MeshCoords.of_rank(rank, world, tp_size=tp).as_fields()
    return {"global_step": 0, **coords, **override}


def _mesh(firsts: dict[int, dict[str, Any] | None], world: int = 4, batch: int = 4
          ) -> tuple[Any, AnomalySink]:
    sink = AnomalySink()
    mesh = attempt_mesh(attempt=0, world_size=world, global_batch=batch, firsts=firsts,
                        file_of=lambda r: f"rank-{r}.jsonl", sink=sink)
    return mesh, sink


def test_records_without_coordinates_are_plain_ddp() -> None:
    mesh, sink = _mesh({r: {"global_step": 0} for r in range(4)})
    assert mesh is None and not sink


def test_one_mesh_places_every_rank_on_its_data_parallel_shard() -> None:
    mesh, sink = _mesh({r: _first(r, 4, 2) for r in range(4)})
    assert not sink
    assert (mesh.dp_size, mesh.tp_size) == (2, 2)
    assert [(p.shard_rank, p.shard_world, p.local_batch, p.primary)
            for p in (mesh.place(r) for r in range(4))] == [
        (0, 2, 2, True), (0, 2, 2, False), (1, 2, 2, True), (1, 2, 2, False)]


def test_claims_that_do_not_form_one_mesh_are_witnessed_rank_by_rank() -> None:
    cases = {
        "collision": {**{r: _first(r, 4, 2) for r in range(4)}, 3: _first(2, 4, 2)},
        "sizes": {**{r: _first(r, 4, 2) for r in range(4)}, 1: _first(1, 4, 1)},
        "unnamed": {**{r: _first(r, 4, 2) for r in range(4)}, 2: {"global_step": 0}},
        "partial": {**{r: _first(r, 4, 2) for r in range(4)},
                    1: {"global_step": 0, "dp_rank": 0}},
        "range": {**{r: _first(r, 4, 2) for r in range(4)}, 3: _first(3, 4, 2, tp_rank=2)},
    }
    for reason, firsts in cases.items():
        _, sink = _mesh(firsts)
        found = sink.ordered()
        assert [a.kind for a in found] == ["mesh_mismatch"], reason
        assert found[0].evidence["reason"] == reason
    _, sink = _mesh({r: _first(r, 4, 4) for r in range(4)}, batch=2)
    assert {a.evidence["reason"] for a in sink.ordered()} == set()  # DP 1 divides B = 2
    _, sink = _mesh({r: {"global_step": 0, "dp_rank": r, "dp_size": 4, "tp_rank": 0,
                         "tp_size": 1} for r in range(4)}, batch=6)
    assert {a.evidence["reason"] for a in sink.ordered()} == {"batch"}
    _, sink = _mesh({r: {"global_step": 0, "dp_rank": r % 2, "dp_size": 2, "tp_rank": r // 2,
                         "tp_size": 1} for r in range(4)})
    assert "product" in {a.evidence["reason"] for a in sink.ordered()}


def test_same_order_compares_the_windows_of_a_mesh_run_with_a_ddp_run(tmp_path: Path) -> None:
    from verifier import verify

    mesh = generate_run(RunSpec(dataset_size=40, global_batch=4, target_steps=24,
                                world_sizes=(4, 2), tp_sizes=(2,), fail_at=(9,),
                                log_ids=False), tmp_path / "mesh")
    ddp = generate_run(RunSpec(dataset_size=40, global_batch=4, target_steps=24,
                               world_sizes=(2,)), tmp_path / "ddp")
    assert verify(mesh.root, same_order=ddp.root).verdict == "PASS"
    assert verify(ddp.root, same_order=mesh.root).verdict == "PASS"
    other = generate_run(RunSpec(dataset_size=40, global_batch=4, target_steps=24, seed=5,
                                 world_sizes=(2,)), tmp_path / "other")
    result = verify(mesh.root, same_order=other.root)
    assert result.verdict == "FAIL"
    assert "order_mismatch" in result.runs[0].anomaly_counts
