"""The runtime's own run summary: committed and replayed steps, goodput, stalls."""

from __future__ import annotations

from pathlib import Path

from ecrl.contract.runformat import (
    CheckpointEvent,
    JsonlWriter,
    RunManifest,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    write_json_record,
)
from ecrl.runtime.supervision.summary import render_summary, summarize


def _attempt(n: int, world: int, resumed: int | None, last: int, status: str, t0: float,
             t1: float) -> SupervisorAttempt:
    return SupervisorAttempt(attempt=n, world_size=world, resumed_from_step=resumed,
                             first_step=0 if resumed is None else resumed + 1, last_step=last,
                             exit_code=0 if status == "completed" else 1, status=status,
                             start_time=t0, end_time=t1)


def test_summary_of_a_run_with_two_failures(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    write_json_record(paths.manifest, RunManifest(
        seed=0, dataset={"name": "fake", "size": 100}, global_batch=4, steps_per_epoch=25,
        target_steps=30, permutation={"algorithm": "x", "version": 1}, log_ids=False,
        strategy="blocking", ckpt_every=5, fail_at=[7, 18], world_sizes=[2, 2, 1],
        model="tiny-cnn", created="2026-01-01T00:00:00Z"))
    write_json_record(paths.supervisor, SupervisorState(
        attempts=[_attempt(0, 2, None, 7, "failed", 100.0, 110.0),
                  _attempt(1, 2, 4, 18, "failed", 110.0, 120.0),
                  _attempt(2, 1, 14, 29, "completed", 120.0, 130.0)],
        restarts=2, status="completed",
        extra={"injected_failures": [{"attempt": 0, "global_step": 7, "rank": 0},
                                     {"attempt": 1, "global_step": 18, "rank": 0}]}))
    with JsonlWriter(paths.checkpoint_log(0)) as log:
        for step, stall in ((4, 0.010), (9, 0.030)):
            log.write(CheckpointEvent(global_step=step, strategy="blocking", snapshot_s=0.001,
                                      write_s=0.005, enqueue_s=0, backpressure_s=0,
                                      stall_s=stall, bytes=10, path="p"))
    s = summarize(str(tmp_path))
    assert s.committed_steps == 30 and s.attempts == 3 and s.restarts == 2
    assert s.replayed_steps == (7 - 4) + (18 - 14)
    assert s.wall_s == 30.0 and s.goodput == 1.0
    assert s.injected_failures == [7, 18] and s.world_sizes == [2, 2, 1]
    assert s.checkpoints == 2 and s.stall_s_median == 0.020
    text = "\n".join(render_summary(s))
    assert "30/30 committed" in text and "2 → 2 → 1" in text and "20.0 ms median" in text


def test_a_planted_settings_record_is_ignored_not_followed_or_waited_on(tmp_path: Path) -> None:
    # Someone else may write the run directory: a FIFO in place of rank 0's record would block
    # the summary for ever, a symlink would read a file outside the run, a huge file all memory.
    import json
    import os

    from ecrl.runtime.settings import SETTINGS_FILE, ResolvedCheckpoint, resolve_checkpoint
    from ecrl.runtime.supervision.summary import checkpoint_settings

    paths = RunPaths.of(tmp_path)
    def record(every: int) -> str:
        return json.dumps(resolve_checkpoint(flags={}, script={"ckpt_every": every}).record())

    outside = tmp_path / "outside.json"
    outside.write_text(record(9))
    for attempt in range(4):
        paths.attempt_dir(attempt).mkdir(parents=True)
    (paths.attempt_dir(0) / SETTINGS_FILE).write_text(record(8))
    os.mkfifo(paths.attempt_dir(1) / SETTINGS_FILE)
    (paths.attempt_dir(2) / SETTINGS_FILE).symlink_to(outside)
    (paths.attempt_dir(3) / SETTINGS_FILE).write_text(record(10) + " " * (1 << 20))
    found = checkpoint_settings(paths, [0, 1, 2, 3])
    assert isinstance(found, ResolvedCheckpoint)  # attempt 0's, the newest honest one
    assert found.settings.ckpt_every == 8 and found.source("ckpt_every") == "script"
    assert checkpoint_settings(paths, [1, 2, 3]) is None
