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


def test_only_the_recorded_attempts_checkpoint_events_make_a_file_count(tmp_path: Path) -> None:
    # A checkpoint file's checksum is not authenticated: whoever can write the run directory can
    # forge one and an event naming it. An event in an attempt folder supervisor.json does not
    # record (or one reached through a link) must not make the forged file a resume point.
    import os

    from ecrl.contract.runformat import (
        CheckpointEvent,
        JsonlWriter,
        SupervisorAttempt,
        SupervisorState,
        write_json_record,
    )
    from ecrl.runtime.checkpoint.persist import choose_resume, recorded_checkpoints

    paths = RunPaths.of(tmp_path / "run")
    paths.checkpoints.mkdir(parents=True)
    for step in (4, 8, 12):
        image, size = make_image(step, meta={"world_size": 1})
        commit_checkpoint(paths, memoryview(image), size, global_step=step, epoch=0,
                          cursor_step=step, world_size=1, keep=3)
    paths.latest.unlink()

    def events(attempt: int, step: int, folder: Path | None = None) -> None:
        folder = folder or paths.attempt_dir(attempt)
        folder.mkdir(parents=True, exist_ok=True)
        with JsonlWriter(folder / paths.checkpoint_log(attempt).name) as log:
            log.write(CheckpointEvent(global_step=step, strategy="blocking", snapshot_s=0.0,
                                      write_s=0.0, enqueue_s=0.0, backpressure_s=0.0,
                                      stall_s=0.0, bytes=1, path=checkpoint_name(step)))

    def attempt(n: int) -> SupervisorAttempt:
        return SupervisorAttempt(attempt=n, world_size=1, resumed_from_step=None,
                                 first_step=None, last_step=None, exit_code=137,
                                 status="failed", start_time=1.0, end_time=2.0)

    events(0, 4)
    events(1, 8)  # stray: supervisor.json records attempts 0 and 2 only
    outside = tmp_path / "outside"
    events(2, 12, folder=outside)
    os.symlink(outside, paths.attempt_dir(2))  # a recorded attempt's folder linked out
    write_json_record(paths.supervisor, SupervisorState(attempts=[attempt(0), attempt(2)],
                                                        restarts=1, status="failed"))
    assert recorded_checkpoints(paths) == {4}
    assert recorded_checkpoints(paths, attempts=[0, 1]) == {4, 8}
    choice = choose_resume(paths, locate=lambda step: (0, step))
    assert choice.pointer is not None and choice.pointer.global_step == 4
    assert choice.reason == "rebuilt"
    given = choose_resume(paths, locate=lambda step: (0, step), attempts=[0, 1]).pointer
    assert given is not None and given.global_step == 8  # the caller's attempts, not the file
