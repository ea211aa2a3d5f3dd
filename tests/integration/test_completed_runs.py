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


@pytest.mark.parametrize(("flag", "value", "key"), [("--image-size", "64", "image_size"),
                                                    ("--lr", "0.1", "lr")])
def test_a_run_is_not_continued_with_another_image_size_or_lr(
        blocking_run: Run, tmp_path: Path, flag: str, value: str, key: str) -> None:
    out = tmp_path / "run"
    shutil.copytree(blocking_run.root, out, ignore=shutil.ignore_patterns(".supervisor.lock"))
    before = {p.name: p.read_bytes() for p in (out / "run.json", out / "supervisor.json")}
    refused = ecrl("run", "--out", str(out), flag, value)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and f"with {key} " in refused.stderr
    assert {p.name: p.read_bytes() for p in (out / "run.json", out / "supervisor.json")} == before
