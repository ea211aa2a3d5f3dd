"""The commit protocol: a crash at any point leaves latest.json naming a whole checkpoint."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ckpt_images import make_image

from ecrl.contract.atomicio import CRASH_POINTS
from ecrl.contract.ckptfile import read_verified
from ecrl.contract.runformat import RunPaths
from ecrl.runtime.checkpoint.persist import (
    CRASH_ENV,
    CrashHook,
    apply_retention,
    checkpoint_name,
    checkpoint_step,
    clean_temporaries,
    commit_checkpoint,
    read_latest,
)

HERE = Path(__file__).parent

_COMMITTER = """
import sys
sys.path.insert(0, {here!r})
from ckpt_images import make_image
from ecrl.runtime.checkpoint.persist import CrashHook, commit_checkpoint
from ecrl.contract.runformat import RunPaths
paths = RunPaths.of({root!r})
paths.checkpoints.mkdir(parents=True, exist_ok=True)
crash = CrashHook.from_env(attempt=0)
for step in (3, 7, 11):
    image, size = make_image(step)
    commit_checkpoint(paths, memoryview(image), size, global_step=step, epoch=0,
                      cursor_step=step, world_size=2, keep=2, crash=crash)
"""


def _commit(paths: RunPaths, step: int, keep: int = 2) -> None:
    image, size = make_image(step)
    commit_checkpoint(paths, memoryview(image), size, global_step=step, epoch=0,
                      cursor_step=step, world_size=1, keep=keep)


@pytest.mark.parametrize("target", ["checkpoint", "latest"])
@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_any_point_leaves_a_valid_latest(tmp_path: Path, target: str,
                                                  point: str) -> None:
    code = _COMMITTER.format(here=str(HERE), root=str(tmp_path))
    # crash inside the 2nd commit (step 7); the 1st (step 3) completed
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={CRASH_ENV: f"{target}:{point}:2", "PATH": ""})
    assert proc.returncode == 137, proc.stderr
    paths = RunPaths.of(tmp_path)
    latest = read_latest(paths)
    assert latest is not None
    renamed = target == "latest" and point in ("before-dir-fsync", "done")
    assert latest.global_step == (7 if renamed else 3)
    ckpt = read_verified(paths.checkpoints / latest.path, expected_checksum=latest.checksum)
    assert ckpt.meta["global_step"] == latest.global_step
    assert latest.path == checkpoint_name(latest.global_step)


def test_latest_advances_and_retention_keeps_the_newest(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    paths.checkpoints.mkdir()
    for step in (3, 7, 11, 15):
        _commit(paths, step, keep=3)
        latest = read_latest(paths)
        assert latest is not None and latest.global_step == step
    kept = sorted(checkpoint_step(p.name) for p in paths.checkpoints.glob("step-*.ckpt"))
    assert kept == [7, 11, 15]


def test_retention_never_touches_newer_orphans_or_latest(tmp_path: Path) -> None:
    directory = tmp_path
    for step in (1, 2, 3, 9):
        (directory / checkpoint_name(step)).write_bytes(b"x")
    (directory / "notes.txt").write_text("kept")
    removed = apply_retention(directory, latest_step=3, keep=2)
    assert removed == [checkpoint_name(1)]
    names = sorted(p.name for p in directory.iterdir())
    expected = [checkpoint_name(2), checkpoint_name(3), checkpoint_name(9), "notes.txt"]
    assert names == sorted(expected)


def test_temporaries_of_a_crashed_writer_are_cleaned(tmp_path: Path) -> None:
    (tmp_path / ".step-00000003.ckpt.abc.tmp").write_bytes(b"half")
    (tmp_path / checkpoint_name(3)).write_bytes(b"whole")
    assert clean_temporaries(tmp_path) == [".step-00000003.ckpt.abc.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == [checkpoint_name(3)]


def test_crash_hook_spec() -> None:
    hook = CrashHook("latest:before-rename:2:1", attempt=0)
    assert hook.target is None  # another attempt: never fires
    hook = CrashHook("checkpoint:done", attempt=5)
    assert hook.target == "checkpoint" and hook.nth == 1
    assert hook.for_write("latest") is None and hook.for_write("checkpoint") is not None
    for bad in ("checkpoint", "disk:done", "latest:after-lunch", "latest:done:x"):
        with pytest.raises(ValueError, match=CRASH_ENV):
            CrashHook(bad, attempt=0)


def test_the_event_hook_runs_after_the_file_is_durable_and_before_latest_moves(
        tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    _commit(paths, 3)
    seen: list[tuple[int | None, bool]] = []

    def record(written: object) -> None:
        latest = read_latest(paths)
        seen.append((latest.global_step if latest else None,
                     (paths.checkpoints / checkpoint_name(7)).exists()))

    image, size = make_image(7)
    commit_checkpoint(paths, memoryview(image), size, global_step=7, epoch=0, cursor_step=7,
                      world_size=1, keep=2, before_publish=record)
    # during the hook the new file was already in place and latest.json still named step 3
    assert seen == [(3, True)]
    latest = read_latest(paths)
    assert latest is not None and latest.global_step == 7


def test_a_failing_event_hook_publishes_nothing(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    _commit(paths, 3)

    def broken(written: object) -> None:
        raise OSError("disk full")

    image, size = make_image(7)
    with pytest.raises(OSError):
        commit_checkpoint(paths, memoryview(image), size, global_step=7, epoch=0,
                          cursor_step=7, world_size=1, keep=2, before_publish=broken)
    latest = read_latest(paths)
    assert latest is not None and latest.global_step == 3
