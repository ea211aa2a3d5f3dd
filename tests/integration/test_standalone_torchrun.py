"""docs/examples/ddp_train.py under plain ``torchrun`` (no ``ecrl launch``): killed by SIGKILL at
two moments and launched again by hand, the run is proved by ``ecrl-verify`` from the attempts'
own records and ends bit-identical to the uninterrupted run (the script's uninterrupted run at
world size 2 that test_launch.py makes under ``ecrl launch``: the trajectory is the script's,
whoever launches it); finished at world size 1 instead, it is proved with its windows checked
(issue 25, item 1)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import RUN_TIMEOUT_S, Run

from ecrl.contract.runformat import AttemptRecord, RunPaths, read_json_record
from ecrl.runtime.supervision.hung import kill_remaining_workers
from verifier import render_text, verify_run

pytestmark = pytest.mark.torchrun

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "examples" / "ddp_train.py"
STEPS = 30  # checkpoints after steps 9 and 19 (the script's every=10)


def _command(out: Path, world: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={world}", str(SCRIPT), "--steps", str(STEPS), "--workers", "0",
            "--step-delay", "0.05", "--out", str(out)]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECRL_")}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _launch(out: Path, world: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_command(out, world), capture_output=True, text=True, env=_env(),
                          timeout=RUN_TIMEOUT_S)


def _launch_and_kill(out: Path, world: int, after_step: int) -> None:
    """Launch, wait until rank 0 logged ``after_step``, then SIGKILL the ranks and torchrun."""
    before = set(RunPaths.of(out).attempts())
    proc = subprocess.Popen(_command(out, world), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, env=_env(), start_new_session=True)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            new = sorted(set(RunPaths.of(out).attempts()) - before)
            log = RunPaths.of(out).rank_log(new[0], 0) if new else None
            if log is not None and log.exists() and \
                    log.read_bytes().count(b"\n") >= after_step + 1 - _resumed_at(out, new[0]):
                break
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.01)
        else:
            pytest.fail(f"rank 0 did not log step {after_step} in time")
    finally:
        # torchrun starts each rank in a session of its own: the ranks first, while torchrun is
        # still their parent, then torchrun.
        kill_remaining_workers(proc.pid)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _resumed_at(out: Path, attempt: int) -> int:
    """The first step ``attempt`` runs (0 until its record says otherwise)."""
    path = RunPaths.of(out).attempt_record(attempt)
    if not path.exists():
        return 0
    step = read_json_record(path, AttemptRecord).resumed_from_step
    return 0 if step is None else step + 1


def _final(out: Path) -> dict[str, torch.Tensor]:
    return torch.load(out / "final.pt", weights_only=True)


def test_a_plain_torchrun_run_killed_twice_is_proved_and_bit_identical(
        tmp_path: Path, example_whole_run: Run) -> None:
    reference = example_whole_run.root
    run = tmp_path / "run"
    _launch_and_kill(run, 2, after_step=13)
    _launch_and_kill(run, 2, after_step=24)
    shrunk = tmp_path / "shrunk"  # the same run, finished at world size 1 instead
    shutil.copytree(run, shrunk)
    done = _launch(run, 2)
    assert done.returncode == 0, done.stderr
    assert not (run / "supervisor.json").exists()

    records = [read_json_record(RunPaths.of(run).attempt_record(k), AttemptRecord)
               for k in range(3)]
    assert [r.resumed_from_step for r in records] == [None, 9, 19]
    assert [r.status for r in records] == ["running", "running", "completed"]
    result = verify_run(run)
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == STEPS
    assert result.metrics.restarts == 2 and result.metrics.replayed_steps > 0
    ours, theirs = _final(run), _final(reference)
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)

    done = _launch(shrunk, 1)
    assert done.returncode == 0, done.stderr
    result = verify_run(shrunk)
    assert result.verdict == "PASS", render_text(result)
    assert result.windows_checked and result.checked["committed_steps"] == STEPS
    last = read_json_record(RunPaths.of(shrunk).attempt_record(2), AttemptRecord)
    assert (last.world_size, last.resumed_from_step) == (1, 19)
