"""Messages that tell the user what is actually wrong (issue 24.9): a run directory another ECRL
process is starting a run in, a run directory that is not writable (not "free some space"), and
an allocation no machine of this size can make (its size and the limit).

Nothing here launches torchrun: a guard fails a test that would, instead of letting it train.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from ecrl.apps.cli import main
from ecrl.contract.runformat import SupervisorState
from ecrl.runtime.failure import fatal_reason
from ecrl.runtime.runlock import LOCK_FILE, take_lock
from ecrl.runtime.supervision.rundir import DiskFull, write_record


@pytest.fixture(autouse=True)
def _never_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    from ecrl.runtime.supervision.supervisor import Supervisor

    def launched(*args: object, **kwargs: object) -> int:
        raise AssertionError("accepted: it went on to launch")

    monkeypatch.setattr(Supervisor, "_start_torchrun", launched)


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("command", [["run"], ["launch"]])
def test_the_second_of_two_fresh_starts_is_told_another_process_is_starting_a_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]) -> None:
    # The first start has created --out and taken its lock, and not yet written run.json: the
    # very moment the second one looks.
    out = tmp_path / "run"
    out.mkdir()
    first = take_lock(out)
    try:
        script = tmp_path / "train.py"
        script.write_text("print('training')\n")
        program = ["--", "python", str(script)] if command == ["launch"] else []
        err = _one_line(capsys, [*command, "--out", str(out), *program])
    finally:
        first.close()
    assert f"another ECRL process is starting or running a run in {out}" in err
    assert "not an ECRL run directory" not in err and "not an ecrl launch run" not in err
    assert [p.name for p in out.iterdir()] == [LOCK_FILE]  # the second one wrote nothing


def test_a_left_lock_file_alone_does_not_make_a_directory_busy(tmp_path: Path) -> None:
    # A supervisor killed between its lock and run.json left the file; nobody holds it.
    from ecrl.runtime.runlock import held_elsewhere

    out = tmp_path / "run"
    out.mkdir()
    take_lock(out).close()
    assert not held_elsewhere(out)
    held = take_lock(out)
    try:
        assert held_elsewhere(out)
    finally:
        held.close()


class _Refusing:
    """Fault injection for the supervisor's writes (as ECRL_CRASH_AT does for a full disk): the
    next write fails with ``code`` after its data was written, as a real file system reports it."""

    def __init__(self, code: int) -> None:
        self.code = code

    def for_write(self, target: str, path: object = None) -> Callable[[str], None]:
        def hook(point: str) -> None:
            if point == "before-fsync":
                raise OSError(self.code, os.strerror(self.code), str(path))
        return hook


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
def test_a_run_directory_that_is_not_writable_says_so(tmp_path: Path, code: int) -> None:
    path = tmp_path / "supervisor.json"
    state = SupervisorState(attempts=[], restarts=0, status="running")
    with pytest.raises(DiskFull) as info:
        write_record(path, state, _Refusing(code))  # type: ignore[arg-type]
    line = info.value.explain("run", tmp_path)
    assert "not writable" in line and "free some space" not in line, line
    assert str(path) in line and f"ecrl run --out {tmp_path}" in line and "\n" not in line
    rank = fatal_reason(OSError(code, os.strerror(code), str(path)), tmp_path)
    assert rank is not None and "not writable" in rank and "free some space" not in rank


def test_a_full_disk_still_says_free_some_space(tmp_path: Path) -> None:
    state = SupervisorState(attempts=[], restarts=0, status="running")
    with pytest.raises(DiskFull) as info:
        write_record(tmp_path / "s.json", state, _Refusing(errno.ENOSPC))  # type: ignore[arg-type]
    assert "no space left on device" in info.value.explain("launch", tmp_path)
    assert "free some space, then run `ecrl launch" in info.value.explain("launch", tmp_path)


def test_an_impossible_array_names_its_shape_size_and_the_limit() -> None:
    try:
        np.empty((10**7, 10**7))  # 800 TB: refused at once, nothing is allocated
    except MemoryError as exc:
        message = fatal_reason(exc)
    else:  # pragma: no cover - a machine with 800 TB
        pytest.skip("this machine can allocate 800 TB")
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert message is not None and "\n" not in message
    assert "shape (10000000, 10000000)" in message and f"{total:,} bytes of memory" in message
    assert "--image-size" in message and "smaller model, batch" not in message
