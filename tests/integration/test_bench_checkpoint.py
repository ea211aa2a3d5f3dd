"""`ecrl bench checkpoint --quick` runs the three strategies for real and reports ratios."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ecrl

pytestmark = pytest.mark.torchrun


def test_quick_benchmark_reports_both_ratios(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:checkpoint:start -->\nold\n"
                   "<!-- bench:checkpoint:end -->\n")
    out = ecrl("bench", "checkpoint", "--quick", "--format", "json", "--write-docs", str(doc))
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    metrics = [row["metric"] for row in report["rows"]]
    assert any("stall per checkpoint" in m for m in metrics)
    assert any("steady-state steps/s" in m for m in metrics)
    for row in report["rows"]:
        assert row["candidate_value"] > 0 and row["alternative_value"] > 0
        assert row["ratio"] == pytest.approx(row["candidate_value"] / row["alternative_value"])
    # overlapped (2), jit (1), sharded-async vs overlapped at 1 and 2 ranks (2)
    assert len(report["targets"]) == 5
    assert any(row["candidate"].startswith("jit") for row in report["rows"])
    sharded = [row for row in report["rows"] if row["candidate"].startswith("sharded")]
    assert sorted((row["candidate"], row["metric"].split(":")[0]) for row in sharded) == [
        ("sharded", "tiny-cnn, 1 rank"), ("sharded", "tiny-cnn, 2 ranks"),
        ("sharded-async", "tiny-cnn, 1 rank"), ("sharded-async", "tiny-cnn, 2 ranks")]
    text = doc.read_text()
    assert "old" not in text and "tiny-cnn" in text and text.count("bench:checkpoint:start") == 1
