"""PyTorch Lightning under its own launcher (2 CPU ranks, gloo), with ``ECRLCallback``
(docs/examples/lightning_train.py, docs/library.md "PyTorch Lightning").

- Audit mode, Lightning's default ``DistributedSampler``, killed in the middle of an epoch and
  resumed with ``fit(ckpt_path="last")``: ``ecrl-verify`` FAILs the run, with the witnesses of
  Lightning's resume (the resumed epoch starts its data over while ``batch_idx`` continues).
  At an epoch's end (no loader workers) the same resume PASSes the audit.
- Exact mode, ECRL's sampler in a ``DataLoader(batch_sampler=...)`` given to a Trainer with its
  default ``use_distributed_sampler=True`` (no ``TypeError``, no second sharding): killed and
  resumed at world size 2, it ends bit-identical to the uninterrupted run, with Lightning's own
  global step and epoch right.
- Exact mode under ``ecrl launch`` (its torchrun starts the ranks; the script takes Lightning's
  device count from torchrun's environment), two injected failures, world sizes 2→1→2, each
  resume Lightning's own ``fit(ckpt_path="last")``: PASS with windows checked, and Lightning's
  global step and epoch are ECRL's after every resume.

Every launch imports Lightning in two processes: the runs are made once per module, two chains
at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("lightning")

import torch
from framework_runs import (
    ROOT,
    assert_resumed_by_the_framework,
    ecrl_launch,
    framework_env,
    run_script,
)

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from verifier import render_text, verify_run

pytestmark = pytest.mark.torchrun

SCRIPT = ROOT / "docs" / "examples" / "lightning_train.py"
STEPS = 24  # 64 samples, global batch 8: 8 steps per epoch, 3 epochs
FAIL_AT = 12  # checkpoints every 3 steps: the resume starts after step 11 (epoch 1, cursor 3)


def _launch(out: Path, *args: str, every: int = 3) -> subprocess.CompletedProcess[str]:
    return run_script([sys.executable, str(SCRIPT), "--out", str(out), "--steps", str(STEPS),
                       "--ckpt-every", str(every), *args], framework_env("PL_"))


def _killed_then_resumed(out: Path, *args: str, devices: int = 2) -> None:
    killed = _launch(out, "--fail-at", str(FAIL_AT), *args)
    assert killed.returncode == 137, killed.stderr[-3000:]
    resumed = _launch(out, "--devices", str(devices), *args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def _audit(base: Path) -> None:
    _killed_then_resumed(base / "audit")
    # At an epoch's end: checkpoints every 8 steps, killed after step 9, resumed after step 7.
    end = base / "audit-epoch-end"
    killed = _launch(end, "--fail-at", "9", every=8)
    assert killed.returncode == 137, killed.stderr[-3000:]
    resumed = _launch(end, every=8)
    assert resumed.returncode == 0, resumed.stderr[-3000:]


def _exact_and_reference(base: Path) -> None:
    exact = base / "exact"
    killed = _launch(exact, "--exact", "--fail-at", str(FAIL_AT))
    assert killed.returncode == 137, killed.stderr[-3000:]
    done = _launch(exact, "--exact")
    assert done.returncode == 0, done.stderr[-3000:]
    done = _launch(base / "reference", "--exact")
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("lightning")
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(_audit, base), pool.submit(_exact_and_reference, base)]:
            future.result()
    return {name: base / name for name in ("audit", "audit-epoch-end", "reference", "exact")}


# Under ecrl launch, the fewest steps that resume once mid-epoch and once at an epoch's end:
# 16 samples, global batch 4 (4 steps per epoch), 6 steps, Lightning checkpoints after steps 1,
# 3, 5; failures after step 2 (resume after 1: epoch 0, cursor 2) and after step 4 (resume after
# 3: the end of epoch 0).
LAUNCHED = ("--dataset-size", "16", "--batch", "4", "--steps", "6", "--ckpt-every", "2")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return ecrl_launch(tmp_path_factory.mktemp("lightning-launch") / "run",
                       ["--world-sizes", "2,1,2", "--fail-at", "2,4"], SCRIPT,
                       ["--exact", *LAUNCHED], framework_env("PL_"))


def test_lightnings_own_mid_epoch_resume_fails_the_audit(runs: dict[str, Path]) -> None:
    run = runs["audit"]
    records = [read_json_record(RunPaths.of(run).attempt_record(k), AttemptRecord)
               for k in range(2)]
    assert [r.resumed_from_step for r in records] == [None, FAIL_AT - 1]
    assert (records[1].resumed_from_checksum or "").startswith("sha256:")
    assert records[1].status == "completed"
    result = verify_run(run)
    assert result.verdict == "FAIL", render_text(result)
    assert not result.windows_checked
    kinds = {a.kind for a in result.anomalies}
    assert {"duplicate_sample", "missing_sample"} <= kinds, render_text(result)
    # The witnesses: samples of epoch 1 consumed again by the resumed attempt, after its first
    # step (step 12, the replayed one), and epoch 1's other samples never consumed.
    duplicates = [a for a in result.anomalies if a.kind == "duplicate_sample"]
    assert all(a.epoch == 1 and a.attempt == 1 and a.step > FAIL_AT for a in duplicates)
    missing = [a for a in result.anomalies if a.kind == "missing_sample"]
    assert all(a.epoch == 1 for a in missing)


def test_lightnings_own_resume_at_an_epochs_end_passes_the_audit(runs: dict[str, Path]) -> None:
    # With no loader workers Lightning gets this case right (docs/library.md's table: with 2
    # workers the resumed epoch repeats the previous epoch's order).
    run = runs["audit-epoch-end"]
    last = read_json_record(RunPaths.of(run).attempt_record(1), AttemptRecord)
    assert last.resumed_from_step == 7
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert not result.windows_checked and result.checked["committed_steps"] == STEPS


def test_ecrl_sampler_resumes_lightning_bit_identically(runs: dict[str, Path]) -> None:
    run = runs["exact"]
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == STEPS
    assert result.metrics.restarts == 1 and result.metrics.replayed_steps == 1
    ours = torch.load(run / "final.pt", weights_only=True)
    theirs = torch.load(runs["reference"] / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    # Lightning's own counters continue from ECRL's: an epoch of Lightning is one of ECRL.
    final = json.loads((run / "lightning-final.json").read_text())
    assert final == {"global_step": STEPS, "current_epoch": STEPS // 8}


def test_ecrl_launch_drives_lightning_through_two_failures_and_2_to_1_to_2(
        launched: tuple[Path, str]) -> None:
    run, stdout = launched
    # supervisor.json names the resumes Lightning made (from attempt.json: the supervisor had no
    # ECRL checkpoint to choose), at the world sizes of the schedule.
    assert_resumed_by_the_framework(run, stdout, "lightning", steps=6,
                                    attempts=[(2, None), (1, 1), (2, 3)], failures=[2, 4])
    # Lightning's counters are ECRL's: every step record is keyed by Lightning's global_step and
    # checked against the sampler's window of that step (PASS above); at the end, its global
    # step and epoch are those of the uninterrupted run of the same script (Lightning counts
    # the epoch that max_steps stopped in, epoch 1 at its step 2, as ended: 2).
    final = json.loads((run / "lightning-final.json").read_text())
    assert final == {"global_step": 6, "current_epoch": 2}
