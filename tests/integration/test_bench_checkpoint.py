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
    # overlapped (2), jit in whole runs and in one process (2), sharded-async vs overlapped at
    # 1 and 2 ranks (2)
    assert len(report["targets"]) == 6
    jit_rows = [row for row in report["rows"] if row["candidate"].startswith("jit")]
    assert len(jit_rows) == 2
    # In one process: jit's four calls of each step (forward pre-hook, optimizer pre-hook, the
    # two boundary calls) timed where they are paid.
    in_process, = [row for row in jit_rows if "one process" in row["metric"]]
    assert "jit's own calls (4 per step)" in in_process["note"]
    assert any("jit's own per-step work" in t["description"] for t in report["targets"])
    sharded = [row for row in report["rows"] if row["candidate"].startswith("sharded")]
    assert sorted((row["candidate"], row["metric"].split(":")[0]) for row in sharded) == [
        ("sharded", "tiny-cnn, 1 rank"), ("sharded", "tiny-cnn, 2 ranks"),
        ("sharded", "tiny-cnn, 2 ranks"),
        ("sharded-async", "tiny-cnn, 1 rank"), ("sharded-async", "tiny-cnn, 2 ranks")]
    # at 2 ranks: the write until durable, publication excluded, beside rank 0's whole file
    write, = [row for row in sharded if "until durable" in row["metric"]]
    assert write["alternative"] == "blocking" and "2 ranks wrote parts" in write["note"]
    # the overlapped stall row says how its (pipelined) stall splits
    stall, = [row for row in report["rows"] if row["candidate"] == "overlapped"]
    assert "pipelined 3/3: boundary" in stall["note"]
    text = doc.read_text()
    assert "old" not in text and "tiny-cnn" in text and text.count("bench:checkpoint:start") == 1
