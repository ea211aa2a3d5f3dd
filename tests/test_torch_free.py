"""The verifier, the transformer and the shared contract never import torch (ARCHITECTURE.md)."""

from __future__ import annotations

import subprocess
import sys

import pytest

TORCH_FREE = [
    "ecrl",
    "ecrl.integrations",
    "ecrl.contract.semantics",
    "ecrl.contract.runformat",
    "ecrl.contract.atomicio",
    "ecrl.apps.cli",
    "verifier",
    "verifier.cli",
    "transform",
    "transform.cli",
]


@pytest.mark.parametrize("module", TORCH_FREE)
def test_module_does_not_import_torch(module: str) -> None:
    code = (
        f"import sys, importlib; importlib.import_module({module!r}); "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"{module} imported {out.stdout.strip()}"


def test_the_check_can_fail() -> None:
    # Guard against a vacuous check: a module that does import torch is caught.
    code = "import sys, ecrl.apps.bench._common, torch; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"
