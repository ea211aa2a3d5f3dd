"""``ecrl demo --out DIR`` only ever replaces a directory an earlier demo created (issue 11.5)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import Run, ecrl

from ecrl.apps.demo import _fresh

pytestmark = pytest.mark.torchrun


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_demo_refuses_to_replace_a_run_it_did_not_create(reference_run: Run,
                                                         tmp_path: Path) -> None:
    out = tmp_path / "precious"
    shutil.copytree(reference_run.root, out)
    before = _snapshot(out)
    refused = ecrl("demo", "--out", str(out))
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.count("\n") == 1 and "was not created by ecrl demo" in refused.stderr
    assert _snapshot(out) == before


def test_demo_refuses_any_other_directory(tmp_path: Path) -> None:
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("keep me")
    refused = ecrl("demo", "--out", str(out))
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert (out / "todo.txt").read_text() == "keep me"


def test_demo_replaces_its_own_earlier_directory(demo_run: Run, tmp_path: Path) -> None:
    out = tmp_path / "demo-run"
    shutil.copytree(demo_run.root, out)
    assert '"created_by": "ecrl demo"' in (out / "run.json").read_text()
    _fresh(out)
    assert not out.exists()
