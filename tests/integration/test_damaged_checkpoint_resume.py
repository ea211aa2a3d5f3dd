"""A damaged checkpoint state never restarts a run from step 0 (issue 11.1, issue 12.2).

One real run is made once: two ranks, blocking checkpoints every 4 steps, a failure injected
after step 21 and ``--max-restarts 0``, so it stops as ``failed`` with checkpoints at steps
3 … 19 behind it (retention keeps 19 and 15). Each test copies it, damages it the way a user
would, continues it with ``ecrl run --out R`` and checks the result with ``ecrl-verify``, the
runtime's own lineage oracle and the parameters of the uninterrupted reference run.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY, Run, RunCache, ecrl
from lineage_check import check_exactly_once, load_run

pytestmark = pytest.mark.torchrun

ARGS = [*TINY, "--world-sizes", "2", "--strategy", "blocking", "--fail-at", "21",
        "--max-restarts", "0"]


@pytest.fixture(scope="module")
def stopped_run(runs: RunCache) -> Run:
    run = runs.get("hardening-failed-at-21", ARGS)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "restart limit reached" in run.stderr
    return run


def _copy(run: Run, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run.root, out, ignore=shutil.ignore_patterns(".supervisor.lock"))
    return out


def _verify(out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "verifier.cli", str(out)], capture_output=True,
                          text=True, timeout=300)


def _continue_and_check(out: Path, reference_run: Run, *, resumed_from: int, reason: str
                        ) -> subprocess.CompletedProcess[str]:
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "(1 earlier attempt)" in resumed.stdout
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["failed", "completed"]
    assert view.state.attempts[1].resumed_from_step == resumed_from
    point = view.state.extra["resume_points"]["1"]
    assert point["global_step"] == resumed_from and point["reason"] == reason
    assert point["path"] == f"step-{resumed_from:08d}.ckpt"
    check_exactly_once(view)
    verdict = _verify(out)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "PASS" in verdict.stdout
    # the same parameters as the run that was never interrupted: nothing lost, nothing repeated
    assert view.final_digest() == load_run(reference_run.root).final_digest()
    return resumed


def test_deleted_latest_json_is_rebuilt_from_the_newest_valid_checkpoint(
        stopped_run: Run, reference_run: Run, tmp_path: Path) -> None:
    out = _copy(stopped_run, tmp_path)
    latest = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert latest["global_step"] == 19
    (out / "checkpoints" / "latest.json").unlink()
    resumed = _continue_and_check(out, reference_run, resumed_from=19, reason="rebuilt")
    notes = [line for line in resumed.stderr.splitlines() if "rebuilt" in line]
    assert len(notes) == 1 and "latest.json is missing" in notes[0]
    assert "step-00000019.ckpt (step 19)" in notes[0]
    assert "fresh start" not in resumed.stdout


# A flipped byte (checksum mismatch) in the newest checkpoint: the same checks on the Ctrl-C'd run
# of test_elastic_and_crashes (test_ctrl_c_stops_cleanly_then_resume_falls_back_past_corruption_
# and_completes), whose continuation is needed there anyway.
@pytest.mark.parametrize("damage", ["truncate", "delete"])
def test_damaged_newest_checkpoint_falls_back_to_the_earlier_one(
        stopped_run: Run, reference_run: Run, tmp_path: Path, damage: str) -> None:
    out = _copy(stopped_run, tmp_path)
    newest = out / "checkpoints" / "step-00000019.ckpt"
    data = bytearray(newest.read_bytes())
    if damage == "truncate":
        newest.write_bytes(bytes(data[: len(data) // 3]))
    else:
        newest.unlink()
    resumed = _continue_and_check(out, reference_run, resumed_from=15, reason="fallback")
    notes = [line for line in resumed.stderr.splitlines() if "valid earlier checkpoint" in line]
    assert len(notes) == 1 and "step-00000019.ckpt" in notes[0]
    assert "step-00000015.ckpt (step 15)" in notes[0]
    point = load_run(out).state.extra["resume_points"]["1"]
    assert "step-00000019.ckpt" in point["problem"]
    # the pointer was repaired to the checkpoint really loaded, then moved on by the new attempt
    assert json.loads((out / "checkpoints" / "latest.json").read_text())["global_step"] > 15


def test_no_valid_checkpoint_left_stops_with_the_command_and_writes_nothing(
        stopped_run: Run, tmp_path: Path) -> None:
    out = _copy(stopped_run, tmp_path)
    (out / "checkpoints" / "latest.json").unlink()
    for ckpt in (out / "checkpoints").glob("step-*.ckpt"):
        data = bytearray(ckpt.read_bytes())
        data[-40] ^= 0xFF
        ckpt.write_bytes(bytes(data))
    before = (out / "supervisor.json").read_bytes()
    refused = ecrl("run", "--out", str(out))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert "no valid checkpoint is left" in refused.stderr
    assert "up to step 19" in refused.stderr
    assert f"`ecrl run --out {out}`" in refused.stderr
    assert "--fail-at 21" in refused.stderr  # the command that starts the same run over
    assert (out / "supervisor.json").read_bytes() == before
    assert not (out / "logs" / "attempt-001").exists()


def test_latest_json_pointing_outside_checkpoints_is_never_followed(
        stopped_run: Run, reference_run: Run, tmp_path: Path) -> None:
    out = _copy(stopped_run, tmp_path)
    pointer_file = out / "checkpoints" / "latest.json"
    pointer = json.loads(pointer_file.read_text())
    outside = out / "elsewhere"
    outside.mkdir()
    shutil.copy(out / "checkpoints" / pointer["path"], outside / "step-00000019.ckpt")
    pointer["path"] = "sub/step-00000019.ckpt"
    (out / "checkpoints" / "sub").symlink_to(outside)
    pointer_file.write_text(json.dumps(pointer))
    resumed = _continue_and_check(out, reference_run, resumed_from=19, reason="rebuilt")
    assert "not the checkpoint file of step 19" in resumed.stderr
