"""`ecrl bench recovery --quick` runs jit, overlapped and blocking for real, side by side."""

from __future__ import annotations

import json

import pytest
from conftest import ecrl

pytestmark = [pytest.mark.torchrun, pytest.mark.slow]  # three 2-rank runs: minutes


def test_quick_recovery_benchmark_reports_jit_against_periodic() -> None:
    out = ecrl("bench", "recovery", "--quick", "--format", "json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = report["rows"]
    assert {row["alternative"] for row in rows} == {
        "overlapped every 20", "blocking every 20", "jit, torchrun launched at the failure"}
    periodic = [row for row in rows if row["alternative"].endswith("every 20")]
    assert periodic and all(row["candidate"] == "jit" and row["candidate_value"] >= 0
                            for row in periodic)
    standby = [row for row in rows if row["alternative"].startswith("jit, torchrun")]
    assert standby and all(row["candidate"] == "jit, warm standby" for row in standby)
    assert all("verdicts PASS/PASS" in row["note"] for row in periodic
               if "time lost to one failure" in row["metric"])
    replay = next(t for t in report["targets"] if "replays at most 1 step" in t["description"])
    assert replay["met"], replay
