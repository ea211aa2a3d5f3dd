"""A resume that restores the data position but not the training state must FAIL in
``ecrl-verify`` (issue 16): real ``ecrl run`` processes of the tiny CNN (it has dropout), each with
one test-only fault in the restore path (``ECRL_TEST_RESTORE_FAULT``,
ecrl/runtime/checkpoint/digests.py), and the same runs untouched (blocking, elastic 2 → 1 → 2),
which must PASS, as must the session's overlapped run (conftest ``overlapped_run``).

The runs are made concurrently, once per session (RunCache), and shared by every assert. The
faulted runs and their control differ only after the failure: their first attempt is made once
(``--max-restarts 0`` stops the run there), and each continues its own copy with ``ecrl run --out
R``, the fault (or none) in the environment of the resume.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from conftest import Run, RunCache, ecrl, shared

from ecrl.runtime.checkpoint.digests import RESTORE_FAULT_ENV, RESTORED_FILE

pytestmark = pytest.mark.torchrun

# D=96, B=8, checkpoints after steps 2, 5, 8; the failure after step 7 makes the successor resume
# from step 5 and run steps 6 and 7 again (2 replayed steps at the same world size).
SMALL = ["--dataset-size", "96", "--global-batch", "8", "--steps", "12", "--ckpt-every", "3",
         "--seed", "7", "--model", "tiny-cnn"]
FAULTED = [*SMALL, "--world-sizes", "1", "--strategy", "blocking", "--fail-at", "7"]

UNTOUCHED: dict[str, list[str]] = {
    # the faulted runs' own settings, without a fault: the fault, not the settings, fails them
    # (continued from the faulted runs' shared first attempt, like them)
    "restore-control": FAULTED,
    # 2 → 1 after step 4 (resume from 2), 1 → 2 after step 7 (resume from 5)
    "restore-elastic": [*SMALL, "--world-sizes", "2,1,2", "--strategy", "blocking",
                        "--fail-at", "4,7"],
}
RESUMES = {"restore-control": 1, "restore-overlapped": 2, "restore-elastic": 2}
# Overlapped checkpoints at world size 2 (rank 1 fails) are the session's ``overlapped_run``
# (conftest.py: --max-inflight 1, failures after steps 9 and 21, so two resumes, each from a
# checkpoint however loaded the machine), made for other tests anyway: no run of its own here.
UNTOUCHED_NAMES = sorted([*UNTOUCHED, "restore-overlapped"])

FAULTS = ("drop_optimizer", "skip_scheduler", "skip_rng", "previous_checkpoint")


def _continued(runs: RunCache, first: Run, name: str, env: dict[str, str] | None) -> Run:
    """A copy of the stopped run ``first``, continued with ``env`` (made once per session)."""

    def make(directory: Path) -> tuple[int, str, str]:  # plain data: pickled for other workers
        shutil.copytree(first.root, directory, ignore=shutil.ignore_patterns(".supervisor.lock"))
        proc = ecrl("run", "--out", str(directory), env=env)
        return proc.returncode, proc.stdout, proc.stderr

    returncode, stdout, stderr = shared(runs, name, make)
    return Run(root=runs.root / name, returncode=returncode, stdout=stdout, stderr=stderr)


@pytest.fixture(scope="module")
def restore_runs(runs: RunCache, overlapped_run: Run) -> dict[str, Run]:
    def faulted(name: str, env: dict[str, str] | None) -> Run:
        first = runs.get("restore-first-attempt", [*FAULTED, "--max-restarts", "0"])
        assert first.returncode == 1 and "restart limit reached" in first.stderr, first.stderr
        return _continued(runs, first, name, env)

    jobs = {name: (runs.get, name, args) for name, args in UNTOUCHED.items()
            if name != "restore-control"}
    jobs["restore-control"] = (faulted, "restore-control", None)
    jobs.update({f"restore-{fault}": (faulted, f"restore-{fault}", {RESTORE_FAULT_ENV: fault})
                 for fault in FAULTS})
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(*job) for name, job in jobs.items()}
        made = {name: future.result() for name, future in futures.items()}
    made["restore-overlapped"] = overlapped_run
    for name, run in made.items():
        # A wrong resume exits 0 like a right one: only the verifier can tell them apart.
        assert run.returncode == 0, f"{name}: ecrl exited {run.returncode}\n{run.stderr}"
    return made


def _verify(root: Path) -> tuple[int, dict[str, Any]]:
    out = subprocess.run([sys.executable, "-m", "verifier.cli", str(root), "--format", "json"],
                         capture_output=True, text=True)
    assert "Traceback" not in out.stderr, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)["runs"][0]
    return out.returncode, report


def _kinds(report: dict[str, Any]) -> set[str]:
    return {a["kind"] for a in report["anomalies"]}


@pytest.mark.parametrize("name", UNTOUCHED_NAMES)
def test_untouched_resumes_pass_with_every_object_attested(
        name: str, restore_runs: dict[str, Run]) -> None:
    run = restore_runs[name]
    code, report = _verify(run.root)
    assert (code, report["verdict"]) == (0, "PASS"), report["anomalies"]
    resumes = RESUMES[name]
    # every resume was attested: 5 objects (model, optimizer, scheduler, sampler, rng) each
    assert report["state"] == {"resumes_checked": resumes, "objects_compared": 5 * resumes,
                               "unattested": [], "undigested": [],
                               "undigested_strategies": []}
    assert report["replay"]["compared"] >= 2
    for attempt in range(1, resumes + 1):
        restored = json.loads(
            (run.root / "logs" / f"attempt-{attempt:03d}" / RESTORED_FILE).read_text())
        assert sorted(restored["digests"]) == ["model", "optimizer", "rng", "sampler",
                                               "scheduler"]
    assert not (run.root / "logs" / "attempt-000" / RESTORED_FILE).exists()  # a fresh start


# The anomalies each fault must produce, exactly. replay_divergence comes from the losses alone
# (no digest involved); a fault it misses is still caught by the digests.
EXPECTED: dict[str, tuple[set[str], str]] = {
    # the momentum buffers are gone: the update of step 6 differs, so the loss of step 7
    "drop_optimizer": ({"state_digest_mismatch", "replay_divergence"}, "restored optimizer"),
    # the LR of step 6 comes from the optimizer's (restored) param groups; the fresh scheduler's
    # LR is used from step 7's update on, so first changes the loss of step 8, after the replayed
    # window: only the digest sees it
    "skip_scheduler": ({"state_not_restored"}, "which saved scheduler"),
    # other dropout masks from step 6 on
    "skip_rng": ({"state_not_restored", "replay_divergence"}, "which saved rng"),
    # the state of step 2 instead of step 5: steps 3..5 run twice
    "previous_checkpoint": ({"state_digest_mismatch", "resume_mismatch", "duplicate_step"},
                            "the state of step 2"),
}


@pytest.mark.parametrize("fault", FAULTS)
def test_each_restore_fault_fails_with_its_anomaly(fault: str,
                                                   restore_runs: dict[str, Run]) -> None:
    code, report = _verify(restore_runs[f"restore-{fault}"].root)
    assert (code, report["verdict"]) == (1, "FAIL")
    kinds, words = EXPECTED[fault]
    assert _kinds(report) == kinds
    state = [a for a in report["anomalies"] if a["obligation"] == "state"]
    assert len(state) == 1 and state[0]["attempt"] == 1 and state[0]["step"] == 5
    assert state[0]["file"] == f"logs/attempt-001/{RESTORED_FILE}"
    assert words in state[0]["message"] + " " + str(state[0]["actual"]), state[0]
