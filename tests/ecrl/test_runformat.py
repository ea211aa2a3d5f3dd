"""The run-directory schema: round trips, torn tails, versions, errors at file:line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import (
    SCHEMA_VERSION,
    CheckpointEvent,
    JsonlReader,
    JsonlWriter,
    LatestPointer,
    RunManifest,
    RunPaths,
    StepRecord,
    SupervisorAttempt,
    SupervisorState,
    find_runs,
    read_json_record,
    write_json_record,
)

hashes = st.text("0123456789abcdef", min_size=16, max_size=16)
nonneg = st.integers(0, 2**53)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)

step_records = st.builds(
    StepRecord,
    attempt=nonneg, global_step=nonneg, epoch=nonneg, cursor_step=nonneg, rank=nonneg,
    world_size=st.integers(1, 1024), local_batch=st.integers(1, 4096),
    sample_ids_count=nonneg, sample_ids_hash=hashes, loss=st.none() | finite, time=finite,
    sample_ids=st.none() | st.lists(st.integers(0, 2**62), max_size=20),
    extra=st.dictionaries(st.sampled_from(["step_s", "lr", "note"]), finite, max_size=2),
)


def manifest(**over: object) -> RunManifest:
    fields: dict[str, object] = dict(
        seed=1, dataset={"name": "fake", "size": 100}, global_batch=4, steps_per_epoch=25,
        target_steps=50, permutation={"algorithm": "feistel-cyclewalk-mix64", "version": 1},
        log_ids=True, strategy="blocking", ckpt_every=10, fail_at=[12], world_sizes=[2, 1],
        model="tiny-cnn", created="2026-11-22T00:00:00Z",
    )
    fields.update(over)
    return RunManifest(**fields)  # type: ignore[arg-type]


class TestRoundTrip:
    @given(step_records)
    def test_step_record(self, record: StepRecord) -> None:
        assert StepRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record

    def test_whole_file_records(self, tmp_path: Path) -> None:
        attempt = SupervisorAttempt(attempt=0, world_size=2, resumed_from_step=None, first_step=0,
                                    last_step=12, exit_code=137, status="failed",
                                    start_time=1.0, end_time=2.5)
        records = [
            manifest(),
            SupervisorState(attempts=[attempt], restarts=1, status="completed"),
            LatestPointer(path="step-00000012.pt", global_step=12, epoch=0, cursor_step=12,
                          world_size=2, time=3.0, checksum="sha256:ab"),
        ]
        for i, record in enumerate(records):
            path = tmp_path / f"r{i}.json"
            write_json_record(path, record)
            assert read_json_record(path, type(record)) == record
            assert not list(tmp_path.glob(".*.tmp")), "atomic write left a temporary behind"

    def test_checkpoint_event_jsonl(self, tmp_path: Path) -> None:
        event = CheckpointEvent(global_step=9, strategy="overlapped", snapshot_s=0.01,
                                write_s=0.2, enqueue_s=0.001, backpressure_s=0.0, stall_s=0.02,
                                bytes=1234, path="step-00000009.pt", extra={"attempt": 0})
        with JsonlWriter(tmp_path / "c.jsonl") as writer:
            writer.write(event)
            writer.write(event)
        got = [r for _, r in JsonlReader(tmp_path / "c.jsonl", CheckpointEvent,
                                          torn_tail_ok=False)]
        assert got == [event, event]

    def test_unknown_fields_survive(self) -> None:
        data = manifest().to_dict() | {"future_field": [1, 2]}
        assert RunManifest.from_dict(data).to_dict() == data


def write_lines(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(lines))
    return path


def good_line(step: int) -> bytes:
    return json.dumps(StepRecord(
        attempt=0, global_step=step, epoch=0, cursor_step=step, rank=0, world_size=1,
        local_batch=2, sample_ids_count=2, sample_ids_hash="0" * 16, loss=0.5, time=1.0,
    ).to_dict()).encode() + b"\n"


class TestTornLines:
    def test_torn_tail_tolerated_for_failed_attempt(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "rank-000.jsonl",
                           [good_line(0), good_line(1), good_line(2)[:30]])
        reader = JsonlReader(path, StepRecord, torn_tail_ok=True)
        steps = [r.global_step for _, r in reader]
        assert steps == [0, 1]
        assert len(reader.warnings) == 1 and reader.warnings[0].line == 3
        assert "torn last line" in str(reader.warnings[0])

    def test_torn_tail_is_an_error_for_a_clean_attempt(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "rank-000.jsonl", [good_line(0), good_line(1)[:-1]])
        with pytest.raises(RunFormatError) as info:
            list(JsonlReader(path, StepRecord, torn_tail_ok=False))
        assert str(info.value).startswith(f"{path}:2: ")

    def test_garbage_in_the_middle_is_an_error_even_after_a_crash(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "rank-000.jsonl",
                           [good_line(0), b'{"schema_version": 1, "glob\n', good_line(2)])
        with pytest.raises(RunFormatError, match=r"rank-000.jsonl:2: not valid JSON"):
            list(JsonlReader(path, StepRecord, torn_tail_ok=True))

    def test_empty_line_is_an_error(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "r.jsonl", [good_line(0), b"\n", good_line(1)])
        with pytest.raises(RunFormatError, match=r":2: empty line"):
            list(JsonlReader(path, StepRecord, torn_tail_ok=True))

    def test_empty_file_has_no_records(self, tmp_path: Path) -> None:
        path = write_lines(tmp_path / "r.jsonl", [])
        assert list(JsonlReader(path, StepRecord, torn_tail_ok=False)) == []


class TestValidation:
    def test_unknown_schema_version_is_rejected_clearly(self, tmp_path: Path) -> None:
        data = manifest().to_dict() | {"schema_version": SCHEMA_VERSION + 1}
        path = tmp_path / "run.json"
        path.write_text(json.dumps(data))
        with pytest.raises(RunFormatError, match=r"run.json: unsupported schema_version 2"):
            read_json_record(path, RunManifest)

    def test_missing_schema_version(self) -> None:
        data = manifest().to_dict()
        del data["schema_version"]
        with pytest.raises(RunFormatError, match="unsupported schema_version None"):
            RunManifest.from_dict(data)

    @pytest.mark.parametrize(
        ("field", "value", "needle"),
        [
            ("global_step", -1, "non-negative integer"),
            ("global_step", 1.0, "non-negative integer"),
            ("rank", True, "non-negative integer"),
            ("sample_ids_hash", "ABC", "16 lowercase hex digits"),
            ("loss", "nan", "a number or null"),
            ("sample_ids", [1, "2"], "list of integers"),
        ],
    )
    def test_bad_step_field_names_line(self, tmp_path: Path, field: str, value: object,
                                       needle: str) -> None:
        data = json.loads(good_line(0))
        data[field] = value
        path = write_lines(tmp_path / "r.jsonl", [good_line(0), json.dumps(data).encode() + b"\n"])
        with pytest.raises(RunFormatError, match=rf"r.jsonl:2: field '{field}' must be .*{needle}"):
            list(JsonlReader(path, StepRecord, torn_tail_ok=False))

    def test_missing_field(self) -> None:
        data = json.loads(good_line(0))
        del data["loss"]
        with pytest.raises(RunFormatError, match="missing field 'loss'"):
            StepRecord.from_dict(data)

    def test_latest_pointer_must_stay_inside_checkpoints(self) -> None:
        good = LatestPointer(path="a.pt", global_step=1, epoch=0, cursor_step=1, world_size=1,
                             time=0.0, checksum="sha256:00").to_dict()
        for bad in ["/etc/passwd", "../x.pt", ""]:
            with pytest.raises(RunFormatError, match="relative path inside checkpoints"):
                LatestPointer.from_dict(good | {"path": bad})

    def test_missing_file(self, tmp_path: Path) -> None:
        with pytest.raises(RunFormatError, match=r"run\.json: file is missing"):
            read_json_record(tmp_path / "run.json", RunManifest)

    def test_bad_attempt_inside_supervisor(self) -> None:
        data = {"schema_version": 1, "attempts": [{"attempt": 0}], "restarts": 0,
                "status": "running"}
        with pytest.raises(RunFormatError, match="attempt is missing field"):
            SupervisorState.from_dict(data, where=("supervisor.json", None))


class TestRunPaths:
    def test_layout_and_discovery(self, tmp_path: Path) -> None:
        run = RunPaths.of(tmp_path / "runs" / "a")
        write_json_record(run.manifest, manifest())
        for attempt in (0, 1, 10):
            for rank in (0, 1):
                run.rank_log(attempt, rank).parent.mkdir(parents=True, exist_ok=True)
                run.rank_log(attempt, rank).write_bytes(b"")
        run.checkpoint_log(0).write_bytes(b"")
        assert run.rank_log(1, 1) == tmp_path / "runs/a/logs/attempt-001/rank-001.jsonl"
        assert run.attempts() == [0, 1, 10]
        assert list(run.rank_logs(0)) == [0, 1]
        other = RunPaths.of(tmp_path / "runs" / "b")
        write_json_record(other.manifest, manifest())
        assert find_runs(tmp_path) == [run.root, other.root]
        assert find_runs(run.root) == [run.root]


class TestSamplerField:
    """run.json names the sampler that fed the run; absent means ECRL's own."""

    def test_absent_means_ecrl_and_is_not_written(self) -> None:
        m = manifest()
        assert not m.external_sampler and "sampler" not in m.to_dict()

    def test_external_round_trip_keeps_details(self) -> None:
        data = {**manifest().to_dict(),
                "sampler": {"kind": "external", "name": "DistributedSampler", "drop_last": False}}
        m = RunManifest.from_dict(data)
        assert m.external_sampler and m.to_dict() == data

    @pytest.mark.parametrize("bad", [{"kind": "mine"}, {"kind": "external"}, "ecrl"])
    def test_malformed_sampler_is_rejected(self, bad: object) -> None:
        with pytest.raises(RunFormatError, match="field 'sampler'"):
            RunManifest.from_dict({**manifest().to_dict(), "sampler": bad})
