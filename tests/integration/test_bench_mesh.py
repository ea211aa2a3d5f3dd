"""`ecrl bench mesh --quick`: real FSDP2 runs at 2 ranks (blocking, sharded, sharded-async, and
a sharded run resumed at DP 2 and at DP 1) reported as ratios with both targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ecrl

pytestmark = pytest.mark.torchrun


def test_quick_mesh_benchmark_reports_the_write_stall_and_load_rows(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    out = ecrl("bench", "mesh", "--quick", "--format", "json", "--write-docs", str(doc))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = {row["candidate"].split(" ")[0]: row for row in report["rows"]}
    assert set(rows) == {"sharded", "sharded-async", "load"}
    for row in report["rows"]:
        assert row["candidate_value"] > 0 and row["alternative_value"] > 0
        assert row["ratio"] == pytest.approx(row["candidate_value"] / row["alternative_value"])
    assert rows["sharded"]["alternative"].startswith("blocking (gather to rank 0")
    assert "FSDP2, 2 ranks" in rows["sharded"]["metric"]
    assert rows["load"]["alternative"] == "load at DP 2 (same degree)"
    assert [t["description"].split(":")[0] for t in report["targets"]] == [
        "FSDP2 at 2 ranks", "async sharded stall <= 0.05x the blocking sharded stall"]
    text = doc.read_text()
    assert "<!-- bench:mesh:start -->" in text and "load at DP 1 (resharded)" in text
