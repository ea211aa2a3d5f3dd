"""The public surface the runtime's ``ecrl demo`` calls, and the torch-free promise."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
from verifier_helpers import assert_verdict, make_run, verify_dir

import verifier

MODULES = ["verifier", "verifier.cli", "verifier.check", "verifier.report",
           "verifier._testing.generate", "verifier._mutations", "verifier.coverage",
           "verifier.lineage", "verifier.goodput", "verifier.ingest", "verifier.judge",
           "verifier.audit", "verifier.replay", "verifier.sameorder",
           "verifier.windows", "verifier.schema", "verifier._scan", "verifier._witness",
           "ecrl.apps.bench.verify"]


def test_public_api(tmp_path: Path) -> None:
    from verifier import render_json, render_junit, render_text, verify

    run = make_run(tmp_path / "run")
    result = verify(run.root)
    assert (result.verdict, result.exit_code) == ("PASS", 0)
    assert result.runs[0].verdict == "PASS" and result.runs[0].metrics.committed_steps == 30
    for render in (render_text, render_json, render_junit):
        assert render(result)
    with pytest.raises(dataclasses.FrozenInstanceError):
        result.runs[0].verdict = "FAIL"  # type: ignore[misc]
    assert set(verifier.__all__) >= {"verify", "render_text", "render_json", "render_junit"}


def test_helpers_for_end_to_end_tests(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", world_sizes=(2, 1), fail_at=(5,))
    assert_verdict(verify_dir(run.root), "PASS")
    (run.root / "logs/attempt-001/rank-000.jsonl").write_bytes(b"")
    with pytest.raises(AssertionError, match="expected PASS"):
        assert_verdict(verify_dir(run.root), "PASS")
    assert_verdict(verify_dir(run.root), "FAIL", {"missing_step", "missing_sample"}, exact=True)


@pytest.mark.parametrize("module", MODULES)
def test_never_imports_torch(module: str) -> None:
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_report_does_not_import_matplotlib_until_it_plots() -> None:
    code = ("import sys, verifier, verifier.report; "
            "print('matplotlib' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_a_run_that_cannot_be_read_claims_no_window_checked(tmp_path: Path) -> None:
    """An unusable run (here: no supervisor.json) is UNKNOWN and says no window was checked
    (an unusable audit run said windows_checked: true; issue 25, item 8)."""
    from verifier import render_json, verify

    run = make_run(tmp_path / "run", log_ids=False)
    (run.root / "supervisor.json").unlink()
    result = verify(run.root)
    assert result.runs[0].verdict == "UNKNOWN" and result.runs[0].windows_checked is False
    assert json.loads(render_json(result))["runs"][0]["windows_checked"] is False
