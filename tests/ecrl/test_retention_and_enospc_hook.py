"""Retention always leaves a fallback; the ENOSPC test hook fails the write, not the process."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from ecrl.runtime.checkpoint.persist import CrashHook, apply_retention, checkpoint_name


def test_retention_keeps_at_least_two_checkpoints(tmp_path: Path) -> None:
    for step in (3, 7, 11, 15):
        (tmp_path / checkpoint_name(step)).write_bytes(b"x")
    removed = apply_retention(tmp_path, latest_step=15, keep=1)
    assert sorted(removed) == [checkpoint_name(3), checkpoint_name(7)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [checkpoint_name(11), checkpoint_name(15)]


def test_enospc_hook_raises_at_the_nth_write_only(tmp_path: Path) -> None:
    hook = CrashHook("supervisor:enospc:2", attempt=None)
    assert hook.for_write("supervisor", tmp_path / "a") is None  # 1st write: untouched
    second = hook.for_write("supervisor", tmp_path / "b")
    assert second is not None
    second("before-write")  # the data is written first, as on a real disk
    with pytest.raises(OSError) as failed:
        second("before-fsync")
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(tmp_path / "b")
    assert hook.for_write("checkpoint") is None
