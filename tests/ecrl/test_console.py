"""The supervisor's events as printed lines (ecrl.apps.console): the text people and tests know."""

from __future__ import annotations

from pathlib import Path

from ecrl.apps.console import Console, render
from ecrl.runtime.endings import Ending
from ecrl.runtime.failure import FiredFailure, RankError
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervision.events import (
    AttemptEnded,
    AttemptStarted,
    CrashReport,
    DeadlinePassed,
    RepeatedCrash,
    RestartLimitReached,
    RunAlreadyComplete,
    RunFailed,
    RunOpened,
    RunResumed,
    ScriptEndedShort,
    StepProgress,
    StopRequested,
)
from ecrl.runtime.supervision.rundir import plan_manifest

ROOT = Path("/runs/r")


def _ended(**changes: object) -> AttemptEnded:
    values: dict[str, object] = dict(command="run", root=ROOT, attempt=1, status="failed",
                                     exit_code=1, last_step=9, fired=None, ending=None,
                                     fatal=None, latest_step=7)
    values.update(changes)
    return AttemptEnded(**values)  # type: ignore[arg-type]


def test_the_run_header_and_the_attempt_lines() -> None:
    config = RunConfig(out=str(ROOT), dataset="fake", dataset_size=64, global_batch=8, steps=20,
                       world_sizes=(2, 1), strategy="blocking", ckpt_every=4)
    opened = RunOpened(command="run", root=ROOT, manifest=plan_manifest(config), config=config,
                       program=())
    assert render(opened) == [("out", "ecrl run: /runs/r · fake D=64 · tiny-cnn · B=8 · 20 steps "
                                      "· strategy blocking every 4 · world sizes 2,1")]
    started = AttemptStarted(attempt=1, world_size=1, resumed_from_step=7, target_steps=20,
                             fail_at=[12])
    assert render(started) == [("out", "[attempt 1] world size 1, resume after step 7, steps "
                                       "8..19, failures at [12]")]
    unknown = AttemptStarted(attempt=0, world_size=2, resumed_from_step=None, target_steps=0,
                             fail_at=[])
    assert render(unknown) == [("out", "[attempt 0] world size 2, fresh start, from step 0")]
    progress = StepProgress(step=9, target_steps=20, loss=0.5, steps_per_s=2.0, restarts=1,
                            attempt=1, world_size=1)
    assert render(progress) == [("out", "  step 10/20 · loss 0.5000 · 2.0 steps/s · restarts 1 "
                                        "[attempt 1, W=1]")]


def test_open_resume_and_end_lines_name_the_command() -> None:
    assert render(RunAlreadyComplete(command="run", root=ROOT, target_steps=20)) == [
        ("out", "ecrl run: /runs/r is already complete (20 steps); nothing to do")]
    assert render(RunAlreadyComplete(command="launch", root=ROOT, target_steps=None)) == [
        ("out", "ecrl launch: /runs/r is already complete; nothing to do")]
    assert render(RunResumed(command="run", root=ROOT, earlier_attempts=1)) == [
        ("out", "ecrl run: resuming /runs/r (1 earlier attempt)")]
    assert render(DeadlinePassed(command="launch", root=ROOT)) == [
        ("out", "ecrl launch: the deadline has passed; run `ecrl launch --out /runs/r` again "
                "to continue")]
    assert render(StopRequested(signal_name="SIGINT")) == [
        ("err", "ecrl run: SIGINT received, stopping the job…")]


def test_how_an_attempt_ended() -> None:
    assert render(_ended(status="completed", exit_code=0)) == []
    assert render(_ended(command="launch", status="completed", exit_code=1)) == [
        ("err", "[attempt 1] torchrun exited 1 after the run's last step was logged by every "
                "rank; the run is complete")]
    assert render(_ended(status="stopped")) == [
        ("out", "[attempt 1] stopped after step 9; run `ecrl run --out /runs/r` again to "
                "continue")]
    assert render(_ended(fatal="corrupt")) == []
    assert render(_ended(fired=FiredFailure(global_step=9, rank=0, attempt=1))) == [
        ("out", "[attempt 1] injected failure after step 9 (rank 0, exit 137); latest "
                "checkpoint: step 7")]
    # Under ecrl launch, a framework's own checkpoint (the run has no ECRL checkpoint).
    assert render(_ended(fired=FiredFailure(global_step=9, rank=0, attempt=1), latest_step=7,
                         latest_by="transformers")) == [
        ("out", "[attempt 1] injected failure after step 9 (rank 0, exit 137); latest "
                "checkpoint: step 7 (transformers's own)")]
    jit = Ending(status="jit", jit={"saved": True, "rank": 1, "global_step": 9,
                                    "source": "live", "reason": "a peer failed"})
    assert render(_ended(status="jit", ending=jit, latest_step=None)) == [
        ("out", "[attempt 1] jit: rank 1 saved step 9 (live state) after a peer failed; no "
                "checkpoint yet")]


def test_a_crash_shows_the_ranks_error_or_the_logs_tail() -> None:
    log = ROOT / "logs/attempt-001/torchrun.log"
    error = RankError(rank=1, exception="ValueError: bad", where='File "t.py", line 3')
    assert render(_ended(crash=CrashReport(log=log, error=error))) == [
        ("err", "[attempt 1] crashed (torchrun exit 1) after step 9; latest checkpoint: step 7"),
        ("err", "  rank 1: ValueError: bad"),
        ("err", f'  (File "t.py", line 3; full traceback in {log})')]
    tail = render(_ended(last_step=None, crash=CrashReport(log=log, error=None, tail=("boom",))))
    assert [line for _, line in tail][1:] == [f"  from {log}:", "  | boom"]
    assert "before completing a step" in tail[0][1]


def test_the_runs_failures() -> None:
    assert render(RunFailed(message="no checkpoint")) == [
        ("err", "ecrl run: error: no checkpoint")]
    assert render(RestartLimitReached(limit=3, last_step=None)) == [
        ("err", "ecrl run: restart limit reached (--max-restarts 3); the run stops before "
                "completing a step")]
    assert "attempts 1 and 2 after step 9, so a restart cannot fix it" in render(
        RepeatedCrash(root=ROOT, attempt=2, last_step=9))[0][1]
    # under ecrl launch, the command that continues the run is ecrl launch (issue 25, item 8)
    assert render(RunFailed(message="no checkpoint", command="launch")) == [
        ("err", "ecrl launch: error: no checkpoint")]
    launched = render(RepeatedCrash(root=ROOT, attempt=2, last_step=9, command="launch"))
    assert launched[0][1].startswith("ecrl launch: error: ") and \
        launched[0][1].endswith(f"then run `ecrl launch --out {ROOT}` to continue")
    assert render(ScriptEndedShort(wrote_log=True, last_step=5, target_steps=10)) == [
        ("err", "ecrl launch: error: the script exited 0 but its step log ends at step 5, "
                "run.json's target is step 9; ECRL cannot call the run complete")]


def test_the_console_sends_each_line_to_its_stream() -> None:
    out: list[str] = []
    err: list[str] = []
    console = Console(out=out.append, err=err.append)
    console.report(RunFailed(message="x"))
    console.report(RunResumed(command="run", root=ROOT, earlier_attempts=2))
    assert out == ["ecrl run: resuming /runs/r (2 earlier attempts)"]
    assert err == ["ecrl run: error: x"]
