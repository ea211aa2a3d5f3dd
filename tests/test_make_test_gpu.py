"""`make test-gpu` on a machine without CUDA: one line that says so, and a non-zero exit."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_gpu_refuses_in_one_line_without_cuda() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: `make test-gpu` runs there instead of refusing")
    # GPU_PYTHON: this interpreter, so that the target does not set up the .venv first.
    done = subprocess.run(["make", "--no-print-directory", "-s", "test-gpu",
                           f"GPU_PYTHON={sys.executable}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode != 0
    # make's own note of the failed recipe ("make[1]: ***" when make test runs this test)
    ours = [line for line in (done.stdout + done.stderr).splitlines()
            if not re.match(r"make(\[\d+\])?: \*\*\*", line)]
    assert len(ours) == 1, ours
    assert ours[0].startswith("make test-gpu: no CUDA device here"), ours
