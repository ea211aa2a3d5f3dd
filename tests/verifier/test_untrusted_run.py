"""A run directory written by someone else (issue 24): the verifier never blocks on a FIFO, never
follows a link out of the run nor prints what is outside it, reads lines in bounded memory, and
reports a stray attempt folder instead of giving up (docs/verifier.md, "Threat model")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest
from verifier_helpers import make_run

from verifier import render_json, render_text, verify, verify_run

MARKER = "OUTSIDE-SECRET-7f3a"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    # Attempt 0 fails after step 7 (a torn last line is tolerated there), attempt 1 completes.
    return make_run(tmp_path / "run", world_sizes=(2, 1), fail_at=(7,), ckpt_every=3).root


def _verify_cli(path: Path) -> subprocess.CompletedProcess[str]:
    # The timeout is the test's, not the product's: a reader that blocks fails here.
    return subprocess.run([sys.executable, "-m", "verifier.cli", str(path)], capture_output=True,
                          text=True, timeout=60)


def _refused_in_text(path: Path, *words: str) -> str:
    result = verify(path)
    text = render_text(result) + render_json(result)
    assert result.verdict == "UNKNOWN" and result.exit_code == 2, text
    reasons = [r for run in result.runs for r in run.unknown]
    assert len(reasons) == 1 and "\n" not in reasons[0], reasons
    for word in words:
        assert word in reasons[0], reasons
    return text


def test_a_fifo_rank_log_is_refused_not_waited_on(run: Path) -> None:
    log = run / "logs/attempt-001/rank-000.jsonl"
    log.unlink()
    os.mkfifo(log)
    out = _verify_cli(run)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if "attempt-001/rank-000.jsonl" in line]
    assert len(lines) == 1 and "a FIFO, not a regular file" in lines[0], out.stdout


@pytest.mark.parametrize("name", ["logs/attempt-000/checkpoint_rank0.jsonl", "supervisor.json",
                                  "run.json"])
def test_a_fifo_record_file_is_refused_not_taken_as_missing(run: Path, name: str) -> None:
    # A FIFO checkpoint log was taken for a missing one: the verdict was UNKNOWN for another
    # reason ("no durable checkpoint"), or PASS for a run that needed none of its events.
    path = run / name
    path.unlink()
    os.mkfifo(path)
    out = _verify_cli(run)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = [line for line in out.stdout.splitlines() if name in line]
    assert lines and "a FIFO, not a regular file" in lines[0], out.stdout


@pytest.mark.parametrize("target", ["outside", "/dev/zero"])
def test_a_rank_log_linked_outside_the_run_is_refused_and_never_shown(
        run: Path, tmp_path: Path, target: str) -> None:
    outside = tmp_path / "outside.txt"
    # No newline: followed, it would be the torn last line of the failed attempt, whose first
    # bytes the torn-line warning quotes.
    outside.write_text(MARKER + " the first bytes of a file outside the run")
    log = run / "logs/attempt-000/rank-001.jsonl"
    log.unlink()
    log.symlink_to(outside if target == "outside" else Path(target))
    text = _refused_in_text(run, "rank-001.jsonl", "a symbolic link")
    assert MARKER not in text


def test_logs_linked_to_another_folder_is_refused(run: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    (run / "logs").rename(elsewhere)
    (run / "logs").symlink_to(elsewhere)
    _refused_in_text(run, "logs", "a symbolic link")


def test_a_run_json_linked_outside_is_refused_unread(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "run.json"
    outside.write_text((run / "run.json").read_text())
    (run / "run.json").unlink()
    (run / "run.json").symlink_to(outside)
    _refused_in_text(run, "run.json", "a symbolic link")


def test_a_line_over_the_limit_is_refused_in_bounded_memory(run: Path) -> None:
    # 24 MiB without a newline inside a completed attempt's log: a reader that buffers the line
    # whole (or doubles its buffer until the line fits) holds it several times over.
    log = run / "logs/attempt-001/rank-000.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines.insert(3, b"x" * (24 << 20))
    log.write_bytes(b"\n".join(lines))
    del lines
    tracemalloc.start()
    try:
        result = verify_run(run)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.verdict == "UNKNOWN"
    assert any("rank-000.jsonl:4: line longer than 1048576 bytes" in r
               for r in result.unknown), result.unknown
    assert peak < 8 << 20, f"peak {peak / 2**20:.1f} MiB"


def test_the_rank_log_reader_refuses_a_line_over_a_configured_limit(run: Path) -> None:
    from ecrl.contract import semantics
    from ecrl.contract.errors import RunFormatError
    from verifier._scan import RankLog

    log = run / "logs/attempt-001/rank-000.jsonl"
    lengths = [len(line) for line in log.read_bytes().split(b"\n")[:-1]]
    limit = min(lengths)
    longer = next(i for i, n in enumerate(lengths, start=1) if n > limit)
    reader = RankLog(log, attempt=1, rank=0, world_size=1, local_batch=None,
                     geometry=semantics.Geometry(dataset_size=64, global_batch=4), seed=0,
                     torn_ok=False, start_step=0, log_ids=False, want_loss=False,
                     root=run, max_line=limit)
    with pytest.raises(RunFormatError, match=f"rank-000.jsonl:{longer}: line longer than "
                                             f"{limit} bytes"):
        list(reader.batches())


def test_a_planted_attempt_folder_is_reported_and_skipped(run: Path) -> None:
    stray = run / "logs/attempt-007"
    stray.mkdir()
    os.mkfifo(stray / "rank-000.jsonl")  # skipped means never opened
    result = verify_run(run)
    assert result.verdict == "PASS", result.unknown
    notes = [w for w in result.warnings if w.kind == "stray_attempt"]
    assert len(notes) == 1 and notes[0].file == "logs/attempt-007"
    assert "does not list" in notes[0].message and "skipped" in notes[0].message


def _renumber(run: Path, old: int, new: int) -> None:
    """Attempt ``old`` becomes attempt ``new`` everywhere (what an ECRL supervisor before issue 24
    recorded when it found a folder planted at ``new - 1``)."""
    folder = run / f"logs/attempt-{new:03d}"
    (run / f"logs/attempt-{old:03d}").rename(folder)
    for log in folder.glob("rank-*.jsonl"):
        log.write_bytes(log.read_bytes().replace(f'"attempt":{old},'.encode(),
                                                 f'"attempt":{new},'.encode()))
    state = json.loads((run / "supervisor.json").read_text())
    for a in state["attempts"]:
        if a["attempt"] == old:
            a["attempt"] = new
    points = state.get("resume_points", {})
    if str(old) in points:
        points[str(new)] = points.pop(str(old))
    (run / "supervisor.json").write_text(json.dumps(state))


def test_a_numbering_gap_left_by_a_planted_folder_is_skipped(run: Path) -> None:
    _renumber(run, 1, 2)
    stray = run / "logs/attempt-001"
    stray.mkdir()
    (stray / "rank-000.jsonl").write_text("not a record\n")
    result = verify_run(run)
    assert result.verdict == "PASS", result.unknown
    assert [w.file for w in result.warnings if w.kind == "stray_attempt"] == ["logs/attempt-001"]
    assert result.metrics is not None and result.metrics.committed_steps > 0


def test_a_gap_no_stray_folder_explains_is_still_unknown(run: Path) -> None:
    _renumber(run, 1, 2)
    result = verify_run(run)
    assert result.verdict == "UNKNOWN"
    assert any("attempt 1 is missing from the record" in r for r in result.unknown)
