"""A full disk while checkpointing or logging (issue 11.3, issue 12.3): one clear line, no
relaunch loop, consistent files, and a clean continuation once space is freed.

The full disk is real where the machine allows it: a 20 MB tmpfs mounted for the test (root
only; the test is skipped elsewhere) and filled up to a few hundred kilobytes. A step log that
cannot be written is a link to ``/dev/full``, whose every write fails with ``ENOSPC``; the
supervisor's own ``supervisor.json`` gets an ``OSError(ENOSPC)`` injected at its write call
(``ECRL_CRASH_AT=supervisor:enospc:N``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import TINY, ecrl
from lineage_check import check_exactly_once, load_run

from ecrl.contract.ckptfile import read_verified

pytestmark = pytest.mark.torchrun

ARGS = [*TINY, "--world-sizes", "2"]


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20m", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _verify(out: Path) -> None:
    verdict = subprocess.run([sys.executable, "-m", "verifier.cli", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr
    assert "PASS" in verdict.stdout


def _no_temporaries(out: Path) -> None:
    leftovers = [p for p in out.rglob(".*.tmp")]
    assert leftovers == []


def _latest_is_whole(out: Path) -> None:
    latest = out / "checkpoints" / "latest.json"
    if latest.exists():
        pointer = json.loads(latest.read_text())
        read_verified(out / "checkpoints" / pointer["path"], expected_checksum=pointer["checksum"])


@pytest.mark.parametrize("strategy", ["blocking", "overlapped"])
def test_full_disk_while_checkpointing(small_disk: Path, strategy: str) -> None:
    out = small_disk / "run"
    free = os.statvfs(small_disk)
    # Room for two checkpoints (about 230 kB each) and the logs, not for the third one that
    # exists for a moment before retention removes the oldest.
    filler = free.f_bavail * free.f_frsize - 600_000
    (small_disk / "filler").write_bytes(b"\0" * filler)
    result = ecrl("run", "--out", str(out), *ARGS, "--strategy", strategy)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ecrl run: error")]
    assert len(errors) == 1, result.stderr
    assert f"no space left on device: {out}" in errors[0]
    assert "Traceback" not in result.stdout + result.stderr
    state = json.loads((out / "supervisor.json").read_text())
    assert len(state["attempts"]) == 1 and not (out / "logs" / "attempt-001").exists()
    assert state["status"] in ("failed", "running")  # running: supervisor.json could not move
    _latest_is_whole(out)
    _no_temporaries(out)

    (small_disk / "filler").unlink()  # space is freed: the same command continues
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["failed", "completed"]
    check_exactly_once(view)
    _verify(out)


def test_full_disk_while_logging_steps(small_disk: Path) -> None:
    out = small_disk / "run"
    free = os.statvfs(small_disk)
    # 40 kB: run.json, supervisor.json and the first steps' records fit; 200 steps do not.
    (small_disk / "filler").write_bytes(b"\0" * (free.f_bavail * free.f_frsize - 40_000))
    result = ecrl("run", "--out", str(out), "--dataset-size", "256", "--global-batch", "8",
                  "--steps", "200", "--world-sizes", "2", "--strategy", "none")
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ecrl run: error")]
    assert len(errors) == 1 and f"no space left on device: {out}" in errors[0], result.stderr
    assert "background checkpoint writer" not in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    state = json.loads((out / "supervisor.json").read_text())  # whole, never half-written
    assert len(state["attempts"]) == 1 and not (out / "logs" / "attempt-001").exists()
    _no_temporaries(out)

    (small_disk / "filler").unlink()
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["failed", "completed"]
    check_exactly_once(view)
    _verify(out)


def test_supervisor_json_that_cannot_be_written_keeps_its_previous_version(
        tmp_path: Path) -> None:
    out = tmp_path / "run"
    # Writes: 1 run.json, 2 run opened, 3 attempt 0 launched, 4 attempt 0 ended (its failure).
    result = ecrl("run", "--out", str(out), *ARGS, "--strategy", "blocking", "--fail-at", "13",
                  env={"ECRL_CRASH_AT": "supervisor:enospc:4"})
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ecrl run: error")]
    assert len(errors) == 1, result.stderr
    assert f"no space left on device: {out / 'supervisor.json'}" in errors[0]
    assert "previous version of the file is intact" in errors[0]
    assert "Traceback" not in result.stderr
    state = json.loads((out / "supervisor.json").read_text())  # whole, the version before
    assert [a["status"] for a in state["attempts"]] == ["running"]
    assert not (out / "logs" / "attempt-001").exists()  # stopped after the first attempt
    _no_temporaries(out)

    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    view = load_run(out)
    assert [a.status for a in view.state.attempts] == ["failed", "completed"]
    check_exactly_once(view)
    _verify(out)


def test_injected_enospc_at_the_checkpoint_write(tmp_path: Path) -> None:
    """The same without a tmpfs: the 3rd checkpoint write gets ENOSPC after its bytes reached
    the temporary file (attempt 0 only). The background writer's path: the rank's own write
    (blocking) is the one the mounted full disk above already fills for real."""
    strategy = "overlapped"
    out = tmp_path / "run"
    result = ecrl("run", "--out", str(out), *ARGS, "--strategy", strategy,
                  env={"ECRL_CRASH_AT": "checkpoint:enospc:3:0"})
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("ecrl run: error")]
    assert len(errors) == 1, result.stderr
    assert f"no space left on device: {out / 'checkpoints' / 'step-00000011.ckpt'}" in errors[0]
    state = json.loads((out / "supervisor.json").read_text())
    assert state["status"] == "failed" and len(state["attempts"]) == 1
    pointer = json.loads((out / "checkpoints" / "latest.json").read_text())
    assert pointer["global_step"] == 7  # the half-written step 11 was never published
    _latest_is_whole(out)
    _no_temporaries(out)
    resumed = ecrl("run", "--out", str(out))
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    check_exactly_once(load_run(out))
    _verify(out)
