"""HF Accelerate under ``accelerate launch`` (2 CPU processes over torchrun, gloo), with
``ECRLTracker`` (docs/examples/accelerate_train.py, docs/library.md "HF Accelerate").

- Audit mode, the loader prepared by ``accelerator.prepare`` (shuffled), killed in the middle of
  an epoch and resumed as Accelerate's docs show (``load_state`` + ``skip_first_batches``):
  ``ecrl-verify`` FAILs the run (the shuffled order of the resumed epoch is drawn again, and the
  skipped batches are those of the new order). At an epoch's end (nothing to skip) it FAILs too:
  the replayed steps compute other losses than the failed attempt did at the same world size.
- Exact mode, ECRL's sampler under the loader ``accelerator.prepare`` prepared (the tracker turns
  Accelerate's second sharding off) and the same documented resume: killed and resumed at 2
  processes, bit-identical to the uninterrupted run.
- Exact mode under ``ecrl launch`` (its torchrun starts the processes, Accelerate takes their
  count from torchrun's environment), two injected failures, world sizes 2→1→2, each resume the
  script's ``load_state``: PASS with windows checked; the LR scheduler Accelerate restores has
  stepped once per step (not once per process and step) and the loop's step is ECRL's.

The runs are made once per module, two chains at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("accelerate")

import torch
from framework_runs import (
    ROOT,
    assert_launch_ended,
    assert_resumed_by_the_framework,
    ecrl_launch,
    framework_env,
    run_script,
)

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from verifier import render_text, verify_run

pytestmark = pytest.mark.torchrun

SCRIPT = ROOT / "docs" / "examples" / "accelerate_train.py"
PREFIX = "ACCELERATE_"
STEPS = 24  # 64 samples, global batch 8: 8 steps per epoch, 3 epochs
FAIL_AT = 12  # checkpoints every 3 steps: the resume starts after step 11 (epoch 1, cursor 3)


def _launch(out: Path, *args: str, processes: int = 2) -> subprocess.CompletedProcess[str]:
    several = ["--multi_gpu"] if processes > 1 else []  # torchrun; the script asks for the CPU
    # Port 0: Accelerate picks a free one. Its default (29500) is checked before torchrun binds
    # it, seconds later: two launches of this module's parallel chains (or another worker's)
    # could both take it, and one fails at start-up.
    return run_script([sys.executable, "-m", "accelerate.commands.launch", *several,
                       "--main_process_port", "0",
                       "--num_processes", str(processes), "--num_machines", "1",
                       "--mixed_precision", "no", "--dynamo_backend", "no", str(SCRIPT),
                       "--out", str(out), "--steps", str(STEPS), *args], framework_env(PREFIX))


def _audit_and_reference(base: Path) -> None:
    audit = base / "audit"
    assert_launch_ended(_launch(audit, "--fail-at", str(FAIL_AT)), killed=True)
    assert_launch_ended(_launch(audit))
    assert_launch_ended(_launch(base / "reference", "--exact"))


def _exact(base: Path) -> None:
    exact = base / "exact"
    assert_launch_ended(_launch(exact, "--exact", "--fail-at", str(FAIL_AT)), killed=True)
    assert_launch_ended(_launch(exact, "--exact"))
    # The documented resume at an epoch's end: save_state every 8 steps (an epoch), killed
    # after step 9, resumed after step 7.
    end = base / "audit-epoch-end"
    assert_launch_ended(_launch(end, "--ckpt-every", "8", "--fail-at", "9"), killed=True)
    assert_launch_ended(_launch(end, "--ckpt-every", "8"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("accelerate")
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(_audit_and_reference, base), pool.submit(_exact, base)]:
            future.result()
    return base


def test_accelerates_documented_resume_fails_the_audit(runs: Path) -> None:
    run = runs / "audit"
    records = [read_json_record(RunPaths.of(run).attempt_record(k), AttemptRecord)
               for k in range(2)]
    assert [r.resumed_from_step for r in records] == [None, FAIL_AT - 1]
    result = verify_run(run)
    assert result.verdict == "FAIL", render_text(result)
    assert not result.windows_checked
    assert {"duplicate_sample", "missing_sample"} <= {a.kind for a in result.anomalies}
    duplicates = [a for a in result.anomalies if a.kind == "duplicate_sample"]
    assert all(a.epoch == 1 and a.attempt == 1 for a in duplicates)


def test_accelerates_documented_resume_at_an_epochs_end_fails_the_audit(runs: Path) -> None:
    """At an epoch's end Accelerate's documented resume loads no position to skip to, yet the
    replayed steps compute other losses than the failed attempt did at the same world size
    (docs/frameworks.md's table): the resumed epoch is not the one the run would have had."""
    run = runs / "audit-epoch-end"
    last = read_json_record(RunPaths.of(run).attempt_record(1), AttemptRecord)
    assert last.resumed_from_step == 7 and last.status == "completed"
    result = verify_run(run)
    assert result.verdict == "FAIL", render_text(result)
    assert not result.windows_checked and result.checked["committed_steps"] == STEPS
    diverged = [a for a in result.anomalies if a.kind == "replay_divergence"]
    assert [a.step for a in diverged] == [8, 9], render_text(result)


def test_ecrl_sampler_resumes_accelerate_bit_identically(runs: Path) -> None:
    result = verify_run(runs / "exact")
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == STEPS
    assert result.metrics.restarts == 1
    ours = torch.load(runs / "exact" / "final.pt", weights_only=True)
    theirs = torch.load(runs / "reference" / "final.pt", weights_only=True)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)


# Under ecrl launch, the fewest steps that resume once mid-epoch and once at an epoch's end:
# 16 samples, global batch 4 (4 steps per epoch), 6 steps, save_state after steps 1 and 3;
# failures after step 2 (resume after 1: epoch 0, cursor 2) and after step 4 (resume after 3:
# the end of epoch 0).
LAUNCHED = ("--dataset-size", "16", "--batch", "4", "--steps", "6", "--ckpt-every", "2")


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    return ecrl_launch(tmp_path_factory.mktemp("accelerate-launch") / "run",
                       ["--world-sizes", "2,1,2", "--fail-at", "2,4"], SCRIPT,
                       ["--exact", *LAUNCHED], framework_env(PREFIX))


def test_ecrl_launch_drives_accelerate_through_two_failures_and_2_to_1_to_2(
        launched: tuple[Path, str]) -> None:
    run, stdout = launched
    assert_resumed_by_the_framework(run, stdout, "accelerate", steps=6,
                                    attempts=[(2, None), (1, 1), (2, 3)], failures=[2, 4])
    # Accelerate's restored counter (the LR scheduler's steps) is ECRL's step count, whatever
    # the process count of the attempts that stepped it, and the loop ended at the run's end.
    final = json.loads((run / "accelerate-final.json").read_text())
    assert final == {"scheduler_steps": 6, "next_step": 6}
