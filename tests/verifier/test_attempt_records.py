"""A run without ``supervisor.json`` is verified from its attempts' own records
(``logs/attempt-NNN/attempt.json``, verifier.attemptrecords): every generated run, rewritten as a
standalone launch would have written it, gets the verdict the supervised run gets."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import given, note
from verifier_helpers import run_specs

from ecrl.contract.runformat import (
    AttemptRecord,
    RunPaths,
    SupervisorState,
    read_json_record,
    write_json_record,
)
from verifier import render_text, verify_run
from verifier._testing.generate import RunSpec, generate_run


def as_standalone(root: Path) -> None:
    """Replace ``supervisor.json`` with the attempt records the ranks of each attempt write."""
    paths = RunPaths.of(root)
    state = read_json_record(paths.supervisor, SupervisorState)
    points = state.extra.get("resume_points", {})
    for a in state.attempts:
        completed = a.status == "completed"
        paths.attempt_dir(a.attempt).mkdir(parents=True, exist_ok=True)
        write_json_record(paths.attempt_record(a.attempt), AttemptRecord(
            attempt=a.attempt, world_size=a.world_size, resumed_from_step=a.resumed_from_step,
            resumed_from_checksum=points.get(str(a.attempt), {}).get("checksum"),
            launcher="standalone", status="completed" if completed else "running",
            start_time=a.start_time, end_time=a.end_time if completed else None,
            last_step=a.last_step if completed else None))
    paths.supervisor.unlink()


@given(run_specs())
def test_a_standalone_run_gets_the_verdict_of_the_same_run_supervised(spec: RunSpec) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = generate_run(spec, Path(tmp) / "run")
        supervised = verify_run(run.root)
        as_standalone(run.root)
        standalone = verify_run(run.root)
        note(render_text(standalone))
        assert standalone.verdict == supervised.verdict, render_text(standalone)
        assert dict(standalone.anomaly_counts) == dict(supervised.anomaly_counts)
        for key in ("committed_steps", "committed_records", "records"):
            assert standalone.checked[key] == supervised.checked[key]
        assert standalone.metrics.restarts == supervised.metrics.restarts
        assert standalone.metrics.replayed_steps == supervised.metrics.replayed_steps
        assert any(w.kind == "self_recorded" for w in standalone.warnings)
        if standalone.unfinished is not None:
            assert standalone.unfinished.command == "standalone"


def test_a_step_log_beside_a_missing_attempt_record_is_unknown(tmp_path: Path) -> None:
    spec = RunSpec(dataset_size=50, global_batch=4, target_steps=20, world_sizes=(2,),
                   fail_at=(7,), ckpt_every=3, strategy="blocking", log_ids=True)
    run = generate_run(spec, tmp_path / "run")
    as_standalone(run.root)
    RunPaths.of(run.root).attempt_record(1).unlink()
    result = verify_run(run.root)
    assert result.verdict == "UNKNOWN"
    assert "attempt-001/attempt.json: file is missing" in result.unknown[0]
    assert "attempt 1 logged steps" in result.unknown[0]


def test_a_record_in_another_attempts_folder_is_unknown(tmp_path: Path) -> None:
    spec = RunSpec(dataset_size=50, global_batch=4, target_steps=20, world_sizes=(2,),
                   fail_at=(7,), ckpt_every=3, strategy="blocking", log_ids=True)
    run = generate_run(spec, tmp_path / "run")
    as_standalone(run.root)
    path = RunPaths.of(run.root).attempt_record(1)
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "attempt": 0}))
    result = verify_run(run.root)
    assert result.verdict == "UNKNOWN"
    assert "says attempt 0, in the folder of attempt 1" in result.unknown[0]


def test_no_supervisor_and_no_attempt_records_is_unknown_naming_both(tmp_path: Path) -> None:
    spec = RunSpec(dataset_size=50, global_batch=4, target_steps=20, world_sizes=(2,),
                   fail_at=(), ckpt_every=3, strategy="blocking", log_ids=True)
    run = generate_run(spec, tmp_path / "run")
    RunPaths.of(run.root).supervisor.unlink()
    result = verify_run(run.root)
    assert result.verdict == "UNKNOWN"
    assert "no attempt recorded itself" in result.unknown[0]
