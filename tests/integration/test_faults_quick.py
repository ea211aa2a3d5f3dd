"""``ecrl faults --quick``: the crash campaign's small profile, for real (issue 12.4).

Four cases, each a real two-rank ``ecrl run``: a rank killed after a step (sharded-async), a crash
during DCP's metadata write (sharded), a flipped bit in a part of the newest checkpoint and a
dangling ``latest.json``. Each must end safe: a completed run that ``ecrl-verify`` passes with the
parameters of the run without faults, damaged checkpoints resumed from the newest valid one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.torchrun


def test_quick_campaign_is_safe_and_reports_markdown_and_json(tmp_path: Path) -> None:
    out = tmp_path / "campaign"
    proc = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "faults", "--quick", "--out",
                           str(out), "--format", "json"], capture_output=True, text=True,
                          timeout=900, env=dict(os.environ))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["profile"] == "quick"
    results = {r["case"]: r for r in report["cases"]}
    assert len(results) == 4
    assert {r["verdict"] for r in results.values()} == {"safe"}
    assert {r["strategy"] for r in results.values()} == {"sharded", "sharded-async"}
    flip = results["flip a bit of __1_0.distcp"]
    assert flip["checkpoint_used"].endswith("(fallback)") and flip["replayed"] > 0
    dangling = results["latest.json dangling"]
    assert "(fallback)" in dangling["checkpoint_used"]
    crashed = results["crash sharded:during-metadata (rank 0)"]
    # the 2nd checkpoint (step 5) died during its metadata write: the 1st (step 2) is used
    assert crashed["checkpoint_used"] == "step-00000002.dcp"
    table = (out / "faults.md").read_text()
    assert table.startswith("| case | strategy | outcome | checkpoint used | replayed steps |")
    assert "4/4 cases safe." in table
    assert json.loads((out / "faults.json").read_text()) == report
