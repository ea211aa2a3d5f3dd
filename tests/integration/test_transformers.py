"""The transformers ``Trainer`` (2 CPU ranks, gloo) with ``ECRLCallback(...).attach(trainer)``
(docs/examples/transformers_train.py, docs/library.md "transformers Trainer"): audit mode under
plain ``torchrun``, exact mode under ``ecrl launch``.

32 samples, global batch 8 (4 steps per epoch), 12 steps, checkpoints every 2 steps; a failure
after step 6 (the resume starts after step 5: epoch 1, cursor 2, in the middle of an epoch) and
again after step 8 (the resume starts after step 7: at the end of epoch 1). Under torchrun every
rank exits 137 (the script's own crash); under ``ecrl launch --fail-at 6,8`` the callback injects
them.

- Audit mode, the Trainer's own sampler and its documented resume (``resume_from_checkpoint=
  True``): ``ecrl-verify`` PASSes the run (audit: windows not checked), and ``--same-order``
  against an uninterrupted run (on one rank, which draws the same global windows) finds the
  same window at every step: transformers 5.24 with Accelerate 1.15 gets both resumes right.
- Exact mode, ECRL's windows as the Trainer's sampler, under ``ecrl launch --world-sizes 2,2,1``:
  the same two failures, injected, the second resume at world size 1, the supervisor resuming
  from the Trainer's own checkpoints: PASS with every window checked; the checkpoint written
  after the first resume at world size 2 is bit-identical to the uninterrupted run's, and the
  Trainer's own ``global_step`` and epoch are ECRL's.

The runs are made once per module, two chains at a time.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from framework_runs import (
    ROOT,
    assert_launch_ended,
    assert_resumed_by_the_framework,
    ecrl_launch,
    framework_env,
    run_script,
)
from safetensors.torch import load_file

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from verifier import render_text, verify, verify_run

pytestmark = pytest.mark.torchrun

SCRIPT = ROOT / "docs" / "examples" / "transformers_train.py"
STEPS = 12  # 32 samples, global batch 8: 4 steps per epoch, 3 epochs
FAILS = (6, 8)  # checkpoints every 2 steps: resumes after step 5 (mid-epoch), 7 (epoch's end)


def _env() -> dict[str, str]:
    return framework_env("ACCELERATE_", HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error")


def _launch(out: Path, *args: str, processes: int = 2) -> subprocess.CompletedProcess[str]:
    return run_script([sys.executable, "-m", "torch.distributed.run", "--standalone",
                       f"--nproc-per-node={processes}", str(SCRIPT), "--out", str(out),
                       "--steps", str(STEPS), *args], _env())


def _audit(base: Path) -> None:
    """Killed after step 6 and after step 8 at 2 ranks, then finished."""
    run = base / "audit"
    assert_launch_ended(_launch(run, "--fail-at", str(FAILS[0])), killed=True)
    assert_launch_ended(_launch(run, "--fail-at", str(FAILS[1])), killed=True)
    assert_launch_ended(_launch(run))
    # Uninterrupted, on one rank: its global windows are those of 2 ranks (the Trainer's
    # sampler draws one order of the data set, and Accelerate deals its batches out in turn).
    assert_launch_ended(_launch(base / "audit-reference", processes=1))


def _exact(base: Path) -> None:
    _, printed = ecrl_launch(base / "exact", ["--world-sizes", "2,2,1", "--fail-at",
                                              ",".join(map(str, FAILS))],
                             SCRIPT, ["--exact", "--steps", str(STEPS)], _env())
    (base / "exact-launch.txt").write_text(printed)
    assert_launch_ended(_launch(base / "exact-reference", "--exact"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("transformers")
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(_audit, base), pool.submit(_exact, base)]:
            future.result()
    return base


def _resumed_from(run: Path) -> list[int | None]:
    return [read_json_record(RunPaths.of(run).attempt_record(k), AttemptRecord).resumed_from_step
            for k in range(3)]


def test_trainers_own_resumes_pass_the_audit(runs: Path) -> None:
    run = runs / "audit"
    # The attempts name the Trainer's checkpoints they resumed from: in the middle of epoch 1
    # (after step 5), then at its end (after step 7), each with its trainer_state.json's digest.
    assert _resumed_from(run) == [None, FAILS[0] - 1, FAILS[1] - 1]
    last = read_json_record(RunPaths.of(run).attempt_record(2), AttemptRecord)
    assert (last.resumed_from_checksum or "").startswith("sha256:")
    assert last.status == "completed"
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert not result.windows_checked and result.checked["committed_steps"] == STEPS
    assert result.metrics.restarts == 2 and result.metrics.replayed_steps == 2
    # The audit does not see order: the uninterrupted run does, step by step.
    compared = verify(run, same_order=runs / "audit-reference").runs[0]
    assert compared.verdict == "PASS", render_text(compared)
    assert compared.same_order is not None
    assert compared.same_order.steps_compared == STEPS
    assert compared.same_order.first_difference is None


def test_ecrl_windows_resume_the_trainer_exactly_at_another_world_size(runs: Path) -> None:
    run = runs / "exact"
    assert _resumed_from(run) == [None, FAILS[0] - 1, FAILS[1] - 1]
    last = read_json_record(RunPaths.of(run).attempt_record(2), AttemptRecord)
    assert last.world_size == 1
    # The failures were injected by the callback, and the supervisor took each resume from the
    # Trainer's own checkpoint the attempt recorded.
    assert_resumed_by_the_framework(
        run, (runs / "exact-launch.txt").read_text(), "transformers", steps=STEPS,
        attempts=[(2, None), (2, FAILS[0] - 1), (1, FAILS[1] - 1)], failures=FAILS)
    # The Trainer's own counters are ECRL's: 12 steps are 3 epochs of ECRL.
    final = json.loads((run / "trainer-final.json").read_text())
    assert final == {"global_step": STEPS, "epoch": STEPS / 4}


def test_ecrl_windows_resume_the_trainer_bit_identically(runs: Path) -> None:
    # checkpoint-8 was written by the attempt that resumed after step 5 at world size 2.
    ours = runs / "exact" / "trainer" / "checkpoint-8"
    theirs = runs / "exact-reference" / "trainer" / "checkpoint-8"
    state = json.loads((ours / "trainer_state.json").read_text())
    assert (state["global_step"], state["epoch"]) == (8, 2.0)
    mine, reference = load_file(ours / "model.safetensors"), load_file(
        theirs / "model.safetensors")
    assert mine.keys() == reference.keys()
    assert all(torch.equal(mine[k], reference[k]) for k in reference)
