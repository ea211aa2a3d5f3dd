"""Bad ``--out`` and ``--steps`` are one line each, checked before anything is created
(issue 11.8). The real ``ecrl`` command line, in a subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest


def _ecrl(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ecrl.apps.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=120)


def _refused(result: subprocess.CompletedProcess[str], *words: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("ecrl run: error: ")
    for word in words:
        assert word in result.stderr


def test_out_naming_a_file_is_refused_and_the_file_kept(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text("# mine\n")
    _refused(_ecrl("run", "--out", "README.md", cwd=tmp_path), "--out README.md is a file")
    assert readme.read_text() == "# mine\n"


@pytest.mark.parametrize("out", ["/proc/foo", "/proc/ecrl/run"])
def test_out_where_nothing_can_be_created_is_refused(tmp_path: Path, out: str) -> None:
    _refused(_ecrl("run", "--out", out, cwd=tmp_path), f"--out {out}", "writable place")
    assert not Path(out).exists()


@pytest.mark.parametrize("flag", ["--steps", "--epochs", "--ckpt-every", "--fail-at"])
def test_integers_beyond_64_bits_are_refused_before_anything_exists(
        tmp_path: Path, flag: str) -> None:
    out = tmp_path / "run"
    _refused(_ecrl("run", "--out", str(out), flag, "10000000000000000000000", cwd=tmp_path),
             flag, "at most 9223372036854775807")
    assert not out.exists()


def test_epochs_whose_steps_overflow_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "run"
    _refused(_ecrl("run", "--out", str(out), "--epochs", "9223372036854775807", cwd=tmp_path),
             "--epochs", "steps is more than")
    assert not out.exists()
