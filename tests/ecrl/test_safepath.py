"""Paths in a run directory (``ecrl.contract.safepath``) and the checkpoint readers that use it:
a link or a special file planted where a checkpoint, ``latest.json`` or ``checkpoints/`` should
be is refused in one line, before anything is read through it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from ckpt_images import make_image

from ecrl.contract import safepath
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import RunPaths
from ecrl.runtime import _attempt
from ecrl.runtime.checkpoint.persist import commit_checkpoint, read_checkpoint, read_latest


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("ECRL_")]:
        monkeypatch.delenv(key)
    _attempt._CACHE.clear()


def _committed(root: Path, step: int = 3) -> RunPaths:
    paths = RunPaths.of(root)
    paths.checkpoints.mkdir(parents=True)
    image, size = make_image(step)
    commit_checkpoint(paths, memoryview(image), size, global_step=step, epoch=0,
                      cursor_step=step, world_size=1, keep=2)
    return paths


def test_a_checkpoint_file_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = _committed(tmp_path / "elsewhere")
    paths = RunPaths.of(tmp_path / "run")
    paths.checkpoints.mkdir(parents=True)
    (paths.checkpoints / "step-00000003.ckpt").symlink_to(
        elsewhere.checkpoints / "step-00000003.ckpt")
    with pytest.raises(CheckpointError, match=r"step-00000003\.ckpt: is a symbolic link \(to "
                                              r".*elsewhere.*\); refused") as info:
        read_checkpoint(paths.checkpoints / "step-00000003.ckpt")
    assert "\n" not in str(info.value)


def test_a_checkpoints_directory_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = _committed(tmp_path / "elsewhere")
    paths = RunPaths.of(tmp_path / "run")
    paths.root.mkdir()
    paths.checkpoints.symlink_to(elsewhere.checkpoints, target_is_directory=True)
    with pytest.raises(CheckpointError, match=r"checkpoints: is a symbolic link"):
        read_checkpoint(paths.checkpoints / "step-00000003.ckpt")


def test_a_checkpoint_that_is_a_fifo_is_refused_not_read(tmp_path: Path) -> None:
    paths = RunPaths.of(tmp_path)
    paths.checkpoints.mkdir(parents=True)
    fifo = paths.checkpoints / "step-00000003.ckpt"
    os.mkfifo(fifo)
    # A writer holds the FIFO open (so that a reader that opens it does not block forever).
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        os.write(writer, b"ECRLCKP1" + bytes(100))
        with pytest.raises(CheckpointError, match=r"step-00000003\.ckpt: is a FIFO, not a file; "
                                                  r"refused"):
            read_checkpoint(fifo)
        assert os.read(writer, 200) == b"ECRLCKP1" + bytes(100)  # nothing was read from it
    finally:
        os.close(writer)


def test_latest_json_that_is_a_link_is_refused(tmp_path: Path) -> None:
    elsewhere = _committed(tmp_path / "elsewhere")
    paths = RunPaths.of(tmp_path / "run")
    paths.checkpoints.mkdir(parents=True)
    paths.latest.symlink_to(elsewhere.latest)
    with pytest.raises(RunFormatError, match=r"latest\.json: is a symbolic link"):
        read_latest(paths)


def test_removing_a_link_never_touches_its_target(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / "link"
    link.symlink_to(target, target_is_directory=True)
    safepath.remove_entry(link)
    assert not os.path.lexists(link) and (target / "keep").read_text() == "x"
    with pytest.raises(safepath.UnsafePathError, match="is a symbolic link"):
        link.symlink_to(target / "keep")
        safepath.open_regular(link, write=True)
    assert (target / "keep").read_text() == "x"
    for bad in ("/etc/passwd", "../x", "a/../../b"):
        with pytest.raises(safepath.UnsafePathError):
            safepath.check_relative(bad, where="here")
