"""The attempt policy (ecrl.runtime.supervision.policy): how an attempt ended, relaunch or stop."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecrl.runtime.checkpoint.deadline import DEADLINE_EXIT_CODE
from ecrl.runtime.endings import Ending
from ecrl.runtime.failure import FiredFailure, RankError
from ecrl.runtime.supervision.policy import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_STOPPED,
    Outcome,
    after_attempt,
    classify,
    log_tail,
    repeated,
)


def _classify(**changes: object) -> Outcome:
    values: dict[str, object] = dict(attempt=1, exit_code=1, last_step=5, target_steps=10,
                                     stopping=False, fired=None, fatal=None, ending=None)
    values.update(changes)
    return classify(**values)  # type: ignore[arg-type]


def test_classification() -> None:
    assert _classify(exit_code=0, last_step=9).status == "completed"
    assert _classify(exit_code=0, last_step=5).status == "failed"  # short of the target
    assert _classify(stopping=True).status == "stopped"
    hung = Ending(status="hung")
    assert _classify(ending=hung).status == "hung"
    assert _classify(ending=hung, fatal="corrupt").status == "failed"
    crash = _classify()
    assert crash.crashed and not _classify(fired=FiredFailure(attempt=1, global_step=5,
                                                              rank=0)).crashed


@pytest.mark.parametrize(("outcome", "relaunches", "again", "expected"), [
    (_classify(exit_code=0, last_step=9), 0, False, ("completed", EXIT_OK, "completed")),
    (_classify(stopping=True), 0, False, ("stopped", EXIT_STOPPED, "stopped")),
    (_classify(fatal="corrupt"), 0, False, ("failed", EXIT_FAILED, "fatal")),
    (_classify(ending=Ending(status="deadline")), 0, False,
     ("deadline", DEADLINE_EXIT_CODE, "deadline")),
    (_classify(), 0, True, ("failed", EXIT_FAILED, "repeated")),
    (_classify(), 3, False, ("failed", EXIT_FAILED, "restart_limit")),
    (_classify(), 2, False, None),
])
def test_relaunch_or_stop(outcome: Outcome, relaunches: int, again: bool,
                          expected: tuple[str, int, str] | None) -> None:
    end = after_attempt(outcome, relaunches=relaunches, max_restarts=3, repeated_crash=again)
    assert (None if end is None else (end.status, end.exit_code, end.why)) == expected


def test_a_crash_repeats_only_with_the_same_error_step_and_checkpoint() -> None:
    error = RankError(rank=0, exception="ValueError: x", where=None)
    outcome = Outcome(attempt=2, exit_code=1, last_step=5, status="failed", fired=None,
                      fatal=None, error=error)
    same = {"exception": "ValueError: x", "last_step": 5, "resumed_from_step": 3}
    assert repeated(outcome, {"1": same, "2": same})
    assert not repeated(outcome, {"1": {**same, "last_step": 4}, "2": same})
    assert not repeated(outcome, {"2": same})


def test_the_log_tail_prefers_the_ranks_reports(tmp_path: Path) -> None:
    log = tmp_path / "torchrun.log"
    assert log_tail(log) is None
    log.write_text("noise\necrl trainer (rank 1): bad data\nmore noise\n")
    assert log_tail(log) == ("ecrl trainer (rank 1): bad data",)
    log.write_text("a\nTraceback (most recent call last):\n  File x\nValueError: y\nz\n")
    assert log_tail(log) == ("Traceback (most recent call last):", "  File x", "ValueError: y")
