"""The run summary never counts the idle time between a stop and its continuation (issue 11.10;
ecrl.contract.goodput), and says what happened in plain words."""

from __future__ import annotations

from pathlib import Path

from ecrl.contract.runformat import (
    RunManifest,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    write_json_record,
)
from ecrl.runtime.supervision.summary import render_summary, summarize


def _run(tmp_path: Path, attempts: list[SupervisorAttempt], fired: list[int]) -> str:
    paths = RunPaths.of(tmp_path)
    write_json_record(paths.manifest, RunManifest(
        seed=0, dataset={"name": "fake", "size": 100}, global_batch=4, steps_per_epoch=25,
        target_steps=30, permutation={"algorithm": "x", "version": 1}, log_ids=False,
        strategy="blocking", ckpt_every=5, fail_at=fired, world_sizes=[1],
        model="tiny-cnn", created="2026-01-01T00:00:00Z"))
    write_json_record(paths.supervisor, SupervisorState(
        attempts=attempts, restarts=len(attempts) - 1, status="completed",
        extra={"injected_failures": [{"attempt": 0, "global_step": s, "rank": 0}
                                     for s in fired]}))
    return str(tmp_path)


def test_idle_time_between_a_stop_and_its_continuation_is_not_counted(tmp_path: Path) -> None:
    stopped = SupervisorAttempt(attempt=0, world_size=1, resumed_from_step=None, first_step=0,
                                last_step=14, exit_code=130, status="stopped",
                                start_time=1000.0, end_time=1010.0)
    # continued three days later
    later = SupervisorAttempt(attempt=1, world_size=1, resumed_from_step=14, first_step=15,
                              last_step=29, exit_code=0, status="completed",
                              start_time=1000.0 + 3 * 86400, end_time=1000.0 + 3 * 86400 + 20)
    s = summarize(_run(tmp_path, [stopped, later], []))
    assert s.attempt_wall_s == [10.0, 20.0]
    assert s.wall_s == 30.0 and s.goodput == 1.0
    text = "\n".join(render_summary(s))
    assert "10.0, 20.0 s per attempt" in text
    assert "no injected failures" in text and "steps none" not in text


def test_injected_failures_are_listed_as_steps(tmp_path: Path) -> None:
    only = SupervisorAttempt(attempt=0, world_size=1, resumed_from_step=None, first_step=0,
                             last_step=29, exit_code=0, status="completed", start_time=0.0,
                             end_time=6.0)
    text = "\n".join(render_summary(summarize(_run(tmp_path, [only], [7, 18]))))
    assert "injected failures after steps 7, 18" in text
