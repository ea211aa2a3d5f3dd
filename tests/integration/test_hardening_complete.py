"""A completed run is complete, whatever happened to its checkpoints afterwards (issue 11.10);
the resume message counts attempts in English."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import Run, ecrl

pytestmark = pytest.mark.torchrun


def test_completed_run_with_a_corrupt_newest_checkpoint_is_already_complete(
        blocking_run: Run, tmp_path: Path) -> None:
    out = tmp_path / "run"
    shutil.copytree(blocking_run.root, out, ignore=shutil.ignore_patterns(".supervisor.lock"))
    newest = max((out / "checkpoints").glob("step-*.ckpt"))
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    before = (out / "supervisor.json").read_bytes()
    again = ecrl("run", "--out", str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already complete" in again.stdout and again.stderr == ""
    assert (out / "supervisor.json").read_bytes() == before
