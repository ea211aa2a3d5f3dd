"""The real crash reason, in one or two lines, and no retries of what a restart cannot fix
(issue 11.2). Real ``ecrl run`` processes under torchrun; the data sets are real files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ecrl
from dataset_files import write_image_folder

pytestmark = pytest.mark.torchrun


def _images(tmp_path: Path) -> Path:
    root = tmp_path / "images"
    write_image_folder(root)
    return root


def _attempts(out: Path) -> list[dict[str, object]]:
    return list(json.loads((out / "supervisor.json").read_text())["attempts"])


def test_a_broken_image_is_fatal_at_once_with_its_own_message(tmp_path: Path) -> None:
    images = _images(tmp_path)
    (images / "class1" / "broken.png").write_bytes(b"not a png")
    out = tmp_path / "run"
    result = ecrl("run", "--out", str(out), "--dataset", "imagefolder", "--data-dir",
                  str(images), "--global-batch", "8", "--steps", "12", "--world-sizes", "2")
    assert result.returncode == 1, result.stdout + result.stderr
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "ChildFailedError" not in text
    errors = [line for line in result.stderr.splitlines() if line.startswith("ecrl run: error")]
    assert len(errors) == 1
    assert "PIL.UnidentifiedImageError" in errors[0] and "broken.png" in errors[0]
    assert len(_attempts(out)) == 1  # not retried
    assert json.loads((out / "supervisor.json").read_text())["status"] == "failed"


def test_a_model_larger_than_the_machine_is_refused_before_any_launch(tmp_path: Path) -> None:
    # Once an attempt that died at its first allocation (fatal, not retried); now the run's
    # memory is checked before anything is written or launched (ecrl.runtime.supervision.rundir).
    out = tmp_path / "run"
    result = ecrl("run", "--out", str(out), "--image-size", "100000", "--steps", "2")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert "one rank needs at least" in line and "--image-size 100000" in line
    assert not out.exists()


def test_the_same_crash_at_the_same_step_twice_stops_the_run(tmp_path: Path) -> None:
    images = _images(tmp_path)
    # A dangling link: listed by ImageFolder, fails with FileNotFoundError when read. A missing
    # file may be a passing storage hiccup, so the first occurrence is retried; the second, at
    # the same step from the same starting point, is not.
    (images / "class2" / "gone.png").symlink_to(tmp_path / "nowhere.png")
    out = tmp_path / "run"
    result = ecrl("run", "--out", str(out), "--dataset", "imagefolder", "--data-dir",
                  str(images), "--global-batch", "4", "--steps", "30", "--ckpt-every", "0",
                  "--strategy", "blocking", "--max-restarts", "5")
    assert result.returncode == 1, result.stdout + result.stderr
    attempts = _attempts(out)
    assert len(attempts) == 2, result.stdout + result.stderr
    assert attempts[0]["last_step"] == attempts[1]["last_step"]
    shown = [line for line in result.stderr.splitlines() if "FileNotFoundError" in line]
    assert len(shown) == 2 and all(line.startswith("  rank 0: ") for line in shown)
    assert all("gone.png" in line for line in shown)
    assert "the same error ended attempts 0 and 1" in result.stderr
    assert "ChildFailedError" not in result.stderr and "after step None" not in result.stderr
    crashes = json.loads((out / "supervisor.json").read_text())["crashes"]
    assert crashes["0"]["exception"] == crashes["1"]["exception"]
