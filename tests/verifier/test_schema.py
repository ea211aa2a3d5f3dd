"""Preconditions of a verdict: a broken manifest, supervisor state or log is UNKNOWN, with the
file (and line) named, never a traceback and never PASS."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from verifier_helpers import make_run

from verifier import verify_run


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    return make_run(tmp_path / "run", world_sizes=(2, 1), fail_at=(7,), ckpt_every=3,
                    chaos=2).root


CASES: list[tuple[str, Callable[[Path], None], str]] = [
    ("missing manifest", lambda r: (r / "run.json").unlink(), "run.json: file is missing"),
    ("manifest not JSON", lambda r: (r / "run.json").write_text("{nope"),
     "run.json: not valid JSON"),
    ("manifest field type", lambda r: edit_json(r / "run.json",
                                                lambda d: d.update(global_batch="4")),
     "field 'global_batch' must be a positive integer"),
    ("schema version", lambda r: edit_json(r / "run.json",
                                           lambda d: d.update(schema_version=2)),
     "unsupported schema_version 2"),
    ("other permutation", lambda r: edit_json(
        r / "run.json", lambda d: d.update(permutation={"algorithm": "randperm", "version": 1})),
     "the run used permutation randperm v1"),
    ("steps per epoch", lambda r: edit_json(r / "run.json",
                                            lambda d: d.update(steps_per_epoch=3)),
     "steps_per_epoch is 3"),
    ("batch above dataset", lambda r: edit_json(r / "run.json",
                                                lambda d: d.update(global_batch=1000)),
     "larger than the dataset"),
    ("nothing to verify", lambda r: edit_json(r / "run.json", lambda d: d.update(target_steps=0)),
     "target_steps is 0"),
    ("missing supervisor", lambda r: (r / "supervisor.json").unlink(),
     "supervisor.json: file is missing"),
    ("no attempts", lambda r: edit_json(r / "supervisor.json", lambda d: d.update(attempts=[])),
     "no attempts recorded"),
    ("attempt numbering", lambda r: edit_json(
        r / "supervisor.json", lambda d: d["attempts"][1].update(attempt=5)),
     "attempts must be numbered 0, 1"),
    ("attempt field", lambda r: edit_json(
        r / "supervisor.json", lambda d: d["attempts"][0].pop("world_size")),
     "attempt is missing field 'world_size'"),
    ("bad log line", lambda r: _append(r / "logs/attempt-001/rank-000.jsonl", b"{}\n"),
     "rank-000.jsonl:"),
    ("torn line, completed attempt", lambda r: _append(r / "logs/attempt-001/rank-000.jsonl",
                                                      b'{"schema'),
     "last line is incomplete (no newline), but this attempt did not crash"),
    ("bad checkpoint event", lambda r: _append(r / "logs/attempt-000/checkpoint_rank0.jsonl",
                                              b'{"schema_version":1}\n'),
     "checkpoint_rank0.jsonl:"),
    ("empty lineage", lambda r: [p.write_bytes(b"") for p in r.glob("logs/*/rank-*.jsonl")],
     "the committed lineage is empty"),
]


def _append(path: Path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


@pytest.mark.parametrize(("name", "damage", "reason"), CASES, ids=[c[0] for c in CASES])
def test_unusable_input_is_unknown(run: Path, name: str, damage: Callable[[Path], None],
                                   reason: str) -> None:
    damage(run)
    result = verify_run(run)
    assert result.verdict == "UNKNOWN", result
    assert result.exit_code == 2
    assert any(reason in r for r in result.unknown), result.unknown


def test_the_untouched_run_passes(run: Path) -> None:
    # Guard for the table above: each case fails only because of its damage.
    assert verify_run(run).verdict == "PASS"


def test_schema_error_names_file_and_line(run: Path) -> None:
    path = run / "logs/attempt-001/rank-000.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[2] = lines[2].replace(b'"rank":0', b'"rank":"zero"')
    path.write_bytes(b"\n".join(lines))
    result = verify_run(run)
    assert result.verdict == "UNKNOWN"
    assert result.unknown == (f"{path}:3: field 'rank' must be a non-negative integer, got "
                              "'zero'",)


def test_unreadable_log_is_unknown(run: Path) -> None:
    path = run / "logs/attempt-001/rank-000.jsonl"
    path.unlink()
    path.mkdir()  # unreadable as a file, even for root
    result = verify_run(run)
    assert result.verdict == "UNKNOWN" and "cannot read" in result.unknown[0]


def test_anomaly_found_before_a_schema_error_still_fails(run: Path) -> None:
    log = run / "logs/attempt-001/rank-000.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[0] = lines[0].replace(b'"cursor_step":', b'"cursor_step":1', 1)
    lines[-2] = b"not json"
    log.write_bytes(b"\n".join(lines))
    result = verify_run(run)
    assert result.verdict == "FAIL"
    assert "wrong_cursor" in result.anomaly_counts
    assert result.unknown and "not valid JSON" in result.unknown[0]


def test_latest_pointer_without_an_event_is_a_warning(run: Path) -> None:
    edit_json(run / "checkpoints" / "latest.json", lambda d: d.update(global_step=999))
    result = verify_run(run)
    assert result.verdict == "PASS"
    assert any(w.kind == "latest" and "step 999" in w.message for w in result.warnings)


def test_epoch_judged_before_a_schema_error_still_fails(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", dataset_size=40, global_batch=4, target_steps=60,
                   world_sizes=(2,), log_ids=True).root
    log = run / "logs/attempt-000/rank-000.jsonl"
    lines = log.read_bytes().split(b"\n")
    first, second = json.loads(lines[0]), json.loads(lines[1])
    first["sample_ids"][0] = second["sample_ids"][0]  # epoch 0 consumes a sample twice
    lines[0] = json.dumps(first).encode()
    lines[-3] = b"not json"  # far into the last epoch
    log.write_bytes(b"\n".join(lines))
    result = verify_run(run)
    assert result.verdict == "FAIL" and result.unknown
    assert {"duplicate_sample", "missing_sample", "hash_mismatch"} <= set(result.anomaly_counts)
