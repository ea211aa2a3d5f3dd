"""The run generator writes what the runtime writes, through ecrl.contract.runformat."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from verifier_helpers import run_specs

from ecrl.contract.runformat import JsonlReader, RunManifest, StepRecord, read_json_record
from verifier._testing.generate import RunSpec, generate_run, plan_run
from verifier.errors import VerifierError


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("log_ids", [True, False])
def test_bulk_writer_writes_the_same_bytes(tmp_path: Path, log_ids: bool) -> None:
    spec = dict(dataset_size=50, global_batch=6, target_steps=40, world_sizes=(3, 6, 1),
                fail_at=(11, 25), ckpt_every=4, strategy="overlapped", log_ids=log_ids, chaos=7)
    a = generate_run(RunSpec(**spec, writer="runformat"), tmp_path / "a")
    b = generate_run(RunSpec(**spec, writer="bulk"), tmp_path / "b")
    assert files(a.root) == files(b.root)
    assert a.records == b.records


def test_records_round_trip_through_runformat(tmp_path: Path) -> None:
    run = generate_run(RunSpec(world_sizes=(2,), log_ids=True), tmp_path / "run")
    manifest = read_json_record(run.paths.manifest, RunManifest)
    assert manifest.log_ids and manifest.global_batch == 4
    path = run.paths.rank_log(0, 1)
    for _, record in JsonlReader(path, StepRecord, torn_tail_ok=False):
        assert record.to_dict() == StepRecord.from_dict(record.to_dict()).to_dict()
        assert record.extra == {"step_s": 0.05}


@given(run_specs())
def test_plans_resume_after_the_newest_durable_checkpoint(spec: RunSpec) -> None:
    attempts = plan_run(spec)
    assert len(attempts) == len(spec.fail_at) + 1
    durable: list[int] = []
    for a in attempts:
        assert a.resumed_from == (max(durable) if durable else None)
        assert a.start == (0 if a.resumed_from is None else a.resumed_from + 1)
        assert all(a.start <= c <= a.last for c in a.checkpoints)
        # Ranks passed the barrier of the newest checkpoint they wrote.
        assert min(a.rank_last) >= max(a.checkpoints, default=a.start - 1)
        durable += a.checkpoints
    if spec.stop_at is None:
        assert attempts[-1].last == spec.target_steps - 1 and not attempts[-1].failed
        assert attempts[-1].status == "completed"
    else:
        assert attempts[-1].last == max(spec.stop_at, attempts[-1].start)
        assert attempts[-1].failed and attempts[-1].status == spec.end


@pytest.mark.parametrize(("spec", "message"), [
    (dict(global_batch=4, world_sizes=(3,)), "not divisible by world size 3"),
    (dict(fail_at=(5, 5)), "fail_at must increase strictly"),
    (dict(target_steps=10, fail_at=(9,)), r"fail_at steps must lie in \[0, 8\]"),
    (dict(strategy="magic"), "strategy must be one of"),
    (dict(world_sizes=()), "world_sizes needs at least one entry"),
])
def test_bad_specs_are_refused(spec: dict[str, object], message: str) -> None:
    with pytest.raises(VerifierError, match=message):
        RunSpec(**spec)  # type: ignore[arg-type]


def test_refuses_to_overwrite_a_run(tmp_path: Path) -> None:
    generate_run(RunSpec(), tmp_path / "run")
    with pytest.raises(VerifierError, match="already holds a run"):
        generate_run(RunSpec(), tmp_path / "run")
