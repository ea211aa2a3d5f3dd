"""Runs launched without ``ecrl launch`` (each launch of the script a new attempt) are verified
from the attempts' own records, ``logs/attempt-NNN/attempt.json`` (issue 25, item 1). In one
process, world size 1, real files and checkpoints; plain ``torchrun`` launches are in
tests/integration/test_standalone_torchrun.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

import ecrl
from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from ecrl.runtime import _attempt
from ecrl.runtime.runlock import take_lock
from verifier import render_text, verify_run

STEPS = 12


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ECRL_")]:
        monkeypatch.delenv(key)
    _attempt._CACHE.clear()


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((4,), float(i)), torch.tensor(i % 2)


def _launch(run: Path, *, stop_after: int | None = None, steps_taken: int | None = None) -> None:
    """One launch of a small script on ``run``: it resumes, trains, and (``stop_after``) dies
    after logging that step, or (``steps_taken=0``) right after restore(), before its first step
    (a crash between its attempt record and its first step record)."""
    _attempt._CACHE.clear()  # a new process
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=STEPS)
    loader = DataLoader(ecrl.WithSampleIds(Squares()), batch_sampler=sampler)
    log = ecrl.StepLog(run, sampler=sampler, steps=STEPS)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler}, log=log,
                             every=4, strategy="blocking")
    start = ckpt.restore()
    if steps_taken == 0:
        return  # killed: no close, no step
    for step, (ids, (x, y)) in zip(range(start, STEPS), loader, strict=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.step(step, sample_ids=ids, loss=loss)
        ckpt.after_step(step)
        if step == stop_after:
            return  # killed after this step: no close
    ckpt.close()
    log.close()


def _record(run: Path, attempt: int) -> AttemptRecord:
    return read_json_record(RunPaths.of(run).attempt_record(attempt), AttemptRecord)


def test_each_launch_records_its_attempt_and_the_run_verifies_without_a_supervisor(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    _launch(run, stop_after=9)
    _launch(run, steps_taken=0)  # died between its attempt record and its first step
    _launch(run)
    assert not (run / "supervisor.json").exists()
    first, empty, last = (_record(run, k) for k in range(3))
    assert (first.resumed_from_step, first.status, first.launcher) == (None, "running",
                                                                       "standalone")
    assert (empty.resumed_from_step, empty.status) == (7, "running")
    assert empty.resumed_from_checksum is not None
    assert empty.resumed_from_checksum.startswith("sha256:")
    assert (last.resumed_from_step, last.status, last.last_step) == (7, "completed", STEPS - 1)
    result = verify_run(run)
    text = render_text(result)
    assert result.verdict == "PASS", text
    assert result.windows_checked, text
    assert result.checked["committed_steps"] == STEPS
    assert result.metrics.restarts == 2
    assert "attempt.json" in text  # the PASS says what the lineage rested on


def test_a_launch_after_the_run_completed_replays_its_tail_exactly_and_the_verdict_stands(
        tmp_path: Path) -> None:
    # A requeue of a finished job: it resumes from the last checkpoint (step 7), trains steps
    # 8..11 again from the restored state, and the run is still proved, those steps replayed.
    run = tmp_path / "run"
    _launch(run)
    first = _record(run, 0)
    _launch(run)
    again = _record(run, 1)
    assert (first.status, again.resumed_from_step, again.status) == ("completed", 7, "completed")
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert result.checked["committed_steps"] == STEPS
    assert result.metrics.replayed_steps == STEPS - 8


def test_an_unfinished_standalone_run_says_to_launch_the_script_again(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _launch(run, stop_after=9)
    result = verify_run(run)
    assert result.verdict == "UNKNOWN"
    assert result.unfinished is not None and result.unfinished.command == "standalone"
    assert "launch the script again" in result.unfinished.message
    assert "ecrl run" not in result.unfinished.message


def test_step_records_without_an_attempt_record_leave_the_lineage_unknown(
        tmp_path: Path) -> None:
    run = tmp_path / "run"
    _launch(run, stop_after=9)
    _launch(run)
    RunPaths.of(run).attempt_record(1).unlink()
    result = verify_run(run)
    assert result.verdict == "UNKNOWN"
    assert "attempt-001/attempt.json: file is missing" in result.unknown[0]


def test_a_second_launch_on_a_running_run_is_refused_in_one_line(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    held = take_lock(run)  # another launch (or ecrl launch's supervisor) holds the run
    try:
        with pytest.raises(ConfigError, match=r"another launch .* is starting or running"):
            ecrl.StepLog(run, sampler=ecrl.GlobalBatchSampler(64, 8), steps=STEPS)
        assert not (run / "logs").exists()  # nothing claimed
    finally:
        held.close()


def test_the_attempt_record_is_valid_json_of_the_documented_fields(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _launch(run, stop_after=2)
    data = json.loads(RunPaths.of(run).attempt_record(0).read_text())
    assert set(data) == {"schema_version", "attempt", "world_size", "resumed_from_step",
                         "resumed_from_checksum", "launcher", "status", "start_time",
                         "end_time", "last_step"}


def test_follow_ends_with_the_offline_verdict_once_the_last_attempt_completed(
        tmp_path: Path) -> None:
    from verifier.follow import INTERRUPTED, follow

    polls: list[float] = []

    def sleep(seconds: float) -> None:  # Ctrl-C after a few polls: follow must not need it
        polls.append(seconds)
        if len(polls) > 3:
            raise KeyboardInterrupt

    run = tmp_path / "run"
    _launch(run, stop_after=9)
    unfinished = follow(run, poll_s=0.0, sleep=sleep)  # no supervisor says it ended: Ctrl-C
    assert unfinished.verdict == "UNKNOWN" and INTERRUPTED in unfinished.runs[0].unknown[-1]
    _launch(run)
    polls.clear()
    done = follow(run, poll_s=0.0, sleep=sleep)
    assert done.verdict == "PASS" and len(polls) == 0, render_text(done)
