"""The supervisor, the background writer and the file formats never import torch."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", [
    "ecrl.runtime.supervision.supervisor", "ecrl.runtime.checkpoint.bgwriter",
    "ecrl.runtime.checkpoint.persist", "ecrl.contract.ckptfile", "ecrl.runtime.failure",
    "ecrl.runtime.supervision.summary", "ecrl.runtime.runconfig", "ecrl.apps.demo",
    "ecrl.runtime.supervision.launcher", "ecrl.runtime.manifest", "ecrl.apps.console"])
def test_no_torch(module: str) -> None:
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", f"{module} imports torch"
