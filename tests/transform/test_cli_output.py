"""What ``ecrl-transform`` writes around the program: file modes, warnings once, and a reader
that closes the pipe early (issue 10 item 9, issue 11 item 4)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

WARNS = """\
from transform import _checkpoint

for step in range(3):
    n = 0
    while n < step:
        n += 1
    _checkpoint()
print(n)
"""


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "transform.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("source_mode", [0o644, 0o755, 0o640])
def test_output_gets_the_source_mode(tmp_path: Path, source_mode: int) -> None:
    src = tmp_path / "train.py"
    src.write_text(WARNS)
    os.chmod(src, source_mode)
    out = run("train.py", "-o", "out.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert mode(tmp_path / "out.py") == source_mode


def test_existing_output_and_in_place_keep_their_mode(tmp_path: Path) -> None:
    src = tmp_path / "train.py"
    src.write_text(WARNS)
    os.chmod(src, 0o644)
    (tmp_path / "out.py").write_text("old\n")
    os.chmod(tmp_path / "out.py", 0o664)
    assert run("train.py", "-o", "out.py", cwd=tmp_path).returncode == 0
    assert mode(tmp_path / "out.py") == 0o664
    assert run("train.py", "--in-place", cwd=tmp_path).returncode == 0
    assert "_ecrl_runtime" in src.read_text() and mode(src) == 0o644


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_explain_shows_each_warning_once(tmp_path: Path, fmt: str) -> None:
    (tmp_path / "train.py").write_text(WARNS)
    out = run("train.py", "--explain", "--format", fmt, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    both = out.stdout + out.stderr
    assert both.count("train.py:5:5: loop without `_iterations: N`") == 1, both
    # Without --explain the warning goes to stderr, once.
    written = run("train.py", "-o", "out.py", cwd=tmp_path)
    assert written.stderr.count("loop without `_iterations: N`") == 1


def test_closed_output_pipe_stops_quietly(tmp_path: Path) -> None:
    # Big enough that the program and the diff (about 90 kB each) fill the pipe: the writer meets
    # the closed pipe mid-write. Long comments rather than many statements: the output's size is
    # what counts, and each statement costs the analysis time.
    lines = [f"    x{i} = step + {i}  # " + "keeps the output of this line long enough " * 3
             for i in range(500)]
    (tmp_path / "big.py").write_text("from transform import _checkpoint\nfor step in range(3):\n"
                                     + "\n".join(lines) + "\n    _checkpoint()\n")
    for mode_args in (["--diff"], [], ["--explain", "--format", "json"]):
        proc = subprocess.Popen([sys.executable, "-m", "transform.cli", "big.py", "--all-hints",
                                 *mode_args], cwd=tmp_path, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.read(10)  # `| head -c 10`
        proc.stdout.close()
        err = proc.stderr.read().decode()
        code = proc.wait(timeout=120)
        assert "Traceback" not in err and "BrokenPipe" not in err, err
        assert code in (0, 141), (code, err)
