"""End to end: real `ecrl run` output, checked by the verifier (issues #3 and #4 together).

The runtime's own oracle (lineage_check.py) checks the same runs independently; here the product's
checker must agree, must catch every harmful mutation of a real run, and the CLI must give the
documented exit codes on real directories.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Run

from verifier import render_text, verify
from verifier.mutations import self_test

pytestmark = pytest.mark.torchrun


@pytest.mark.parametrize("name", ["reference_run", "blocking_run", "overlapped_run", "demo_run",
                                  "elastic_up_run", "writer_crash_run"])
def test_verifier_passes_every_completed_run(name: str, request: pytest.FixtureRequest) -> None:
    run: Run = request.getfixturevalue(name)
    result = verify(str(run.root))
    assert result.exit_code == 0, render_text(result)
    metrics = result.runs[0].metrics
    assert metrics.committed_steps > 0


def test_restarts_and_replays_are_counted_on_a_real_failure_run(blocking_run: Run) -> None:
    result = verify(str(blocking_run.root))
    supervisor = json.loads((blocking_run.root / "supervisor.json").read_text())
    assert result.runs[0].metrics.restarts == supervisor["restarts"] > 0


def test_mutations_of_a_real_run_are_caught(demo_run: Run, tmp_path: Path) -> None:
    outcome = self_test(demo_run.root, workdir=tmp_path)
    assert outcome.harmful > 0 and outcome.benign > 0
    missed = [t for t in outcome.trials if t.harmful and not t.ok]
    alarms = [t for t in outcome.trials if not t.harmful and not t.ok]
    assert not missed, f"harmful mutations that passed: {missed}"
    assert not alarms, f"benign mutations that failed: {alarms}"


def test_cli_exit_codes_on_real_runs(overlapped_run: Run, tmp_path: Path) -> None:
    ok = subprocess.run([sys.executable, "-m", "verifier.cli", str(overlapped_run.root),
                         "--format", "json"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert json.loads(ok.stdout)["verdict"] == "PASS"
    broken = tmp_path / "broken"
    shutil.copytree(overlapped_run.root, broken)
    # drop the last committed step of rank 0: a real, harmful corruption
    log = sorted((broken / "logs").glob("attempt-*/rank-000.jsonl"))[-1]
    lines = log.read_bytes().splitlines(keepends=True)
    log.write_bytes(b"".join(lines[:-1]))
    bad = subprocess.run([sys.executable, "-m", "verifier.cli", str(broken)],
                         capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "Traceback" not in bad.stderr
