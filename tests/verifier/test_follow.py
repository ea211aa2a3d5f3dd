"""``ecrl-verify --follow``: a run verified while its logs grow.

The run here is generated (``verifier._testing.generate``) and left ``running``; the test plays
the trainer between the follower's polls through its ``sleep`` hook, so every step of the
timeline is deterministic. A real ``ecrl run`` with ``--verify-follow`` is in
``tests/integration/test_follow_runs.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from verifier import render_json, verify
from verifier._testing.generate import RunSpec, generate_run
from verifier.anomalies import Anomaly
from verifier.follow import FollowState, follow
from verifier.result import RunResult

SPEC = RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 2),
               fail_at=(12,), ckpt_every=5, strategy="blocking", log_ids=True, chaos=1,
               stop_at=30, end="running", lag=False, torn=False)


@pytest.fixture
def live(tmp_path: Path) -> Path:
    return generate_run(SPEC, tmp_path / "run").root


def set_status(root: Path, status: str) -> None:
    path = root / "supervisor.json"
    state = json.loads(path.read_text())
    state["status"] = status
    path.write_text(json.dumps(state))


def status(root: Path) -> str:
    return str(json.loads((root / "supervisor.json").read_text())["status"])


class Trainer:
    """Plays the run between the follower's polls: ``acts[i]`` runs at the i-th poll."""

    def __init__(self, acts: list[Callable[[], None]]) -> None:
        self.acts = acts
        self.polls = 0

    def sleep(self, _seconds: float) -> None:
        if self.polls >= len(self.acts):
            raise AssertionError("the follower did not end after the run ended")
        self.acts[self.polls]()
        self.polls += 1


def follow_live(root: Path, acts: list[Callable[[], None]]
                ) -> tuple[object, list[tuple[str, str]], list[FollowState]]:
    anomalies: list[tuple[str, str]] = []  # (kind, the run's status when it was reported)
    states: list[FollowState] = []

    def on_anomaly(_run: RunResult, anomaly: Anomaly) -> None:
        anomalies.append((anomaly.kind, status(root)))

    result = follow(root, poll_s=0, on_anomaly=on_anomaly, on_progress=states.append,
                    sleep=Trainer(acts).sleep)
    return result, anomalies, states


def test_a_duplicate_record_is_reported_while_the_run_trains(live: Path) -> None:
    log = live / "logs" / "attempt-001" / "rank-000.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)

    def torn() -> None:  # the next record, half flushed
        with log.open("ab") as handle:
            handle.write(lines[-1][:40])

    def duplicate() -> None:  # the torn line completed, then a committed record again
        with log.open("ab") as handle:
            handle.write(lines[-1][40:] + lines[1])

    result, anomalies, states = follow_live(
        live, [torn, lambda: None, duplicate, lambda: set_status(live, "stopped")])
    # Before the duplicate: unfinished, a torn tail is no error.
    assert [s.result.verdict for s in states[:2]] == ["UNKNOWN", "UNKNOWN"]
    assert not states[1].result.anomalies and states[1].status == "running"
    assert any(w.kind == "torn_line" for w in states[1].result.warnings)
    # The duplicate is reported at the next poll, while the run still says running.
    assert anomalies and {s for _, s in anomalies} == {"running"}
    assert states[2].anomalies == len(anomalies) and states[2].result.verdict == "FAIL"
    # The final verdict is the offline one on the same files.
    assert result.verdict == "FAIL"  # type: ignore[attr-defined]
    assert render_json(result) == render_json(verify(live))  # type: ignore[arg-type]


def test_ends_with_the_offline_verdict_when_the_run_completes(tmp_path: Path) -> None:
    spec = RunSpec(dataset_size=50, global_batch=4, target_steps=40, world_sizes=(2, 1),
                   fail_at=(12,), ckpt_every=5, strategy="overlapped", log_ids=False, chaos=2)
    root = generate_run(spec, tmp_path / "run").root
    set_status(root, "running")
    result, anomalies, states = follow_live(root, [lambda: set_status(root, "completed")])
    assert [s.status for s in states] == ["running", "completed"]
    assert states[0].result.verdict != "FAIL" and not anomalies
    assert result.verdict == "PASS"  # type: ignore[attr-defined]
    assert render_json(result) == render_json(verify(root))  # type: ignore[arg-type]


def test_interrupted_is_unknown_unless_an_anomaly_was_found(live: Path) -> None:
    def interrupt() -> None:
        raise KeyboardInterrupt

    result, _, states = follow_live(live, [interrupt])
    assert states[0].result.verdict == "UNKNOWN"
    assert result.verdict == "UNKNOWN"  # type: ignore[attr-defined]
    assert "--follow was interrupted" in result.runs[0].unknown[-1]  # type: ignore[attr-defined]
    log = live / "logs" / "attempt-001" / "rank-000.jsonl"
    with log.open("ab") as handle:
        handle.write(log.read_bytes().splitlines(keepends=True)[1])
    result, anomalies, _ = follow_live(live, [interrupt])
    assert anomalies and result.verdict == "FAIL"  # type: ignore[attr-defined]


def test_follow_command_line(live: Path) -> None:
    """The flag: progress and the anomaly on stderr, the final report on stdout."""
    log = live / "logs" / "attempt-001" / "rank-000.jsonl"
    with log.open("ab") as handle:
        handle.write(log.read_bytes().splitlines(keepends=True)[1])
    set_status(live, "stopped")
    out = subprocess.run([sys.executable, "-m", "verifier.cli", "--follow", str(live),
                          "--jobs", "2", "--format", "json"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["verdict"] == "FAIL"
    lines = out.stderr.splitlines()
    assert any(line.startswith("[ecrl-verify --follow] FAIL ") for line in lines), out.stderr
    assert any("verdict so far FAIL" in line for line in lines), out.stderr
    bad = subprocess.run([sys.executable, "-m", "verifier.cli", "--follow", str(live),
                          "--self-test"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--follow verifies one run" in bad.stderr


def test_a_fifo_or_a_link_in_place_of_the_status_files_neither_hangs_nor_is_followed(
        tmp_path: Path) -> None:
    """Someone who can write the run directory plants a FIFO as supervisor.json (a plain read
    waits on it for ever) or a link to a status file elsewhere: --follow reads neither."""
    import os
    import threading

    from verifier.follow import _status

    outside = tmp_path / "outside.json"
    outside.write_text('{"status": "completed"}')
    fifo_run, link_run = tmp_path / "fifo", tmp_path / "link"
    fifo_run.mkdir()
    os.mkfifo(fifo_run / "supervisor.json")
    link_run.mkdir()
    (link_run / "supervisor.json").symlink_to(outside)
    found: dict[str, object] = {}
    reader = threading.Thread(target=lambda: found.update(
        fifo=_status(fifo_run), link=_status(link_run)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "--follow hung on a FIFO in the run directory"
    assert found == {"fifo": None, "link": None}
