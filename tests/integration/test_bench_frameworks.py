"""`ecrl bench frameworks --quick` runs Lightning, Accelerate and the transformers `Trainer` with
and without ECRL's integration and writes its rows (docs/benchmarks.md's section)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ecrl

pytest.importorskip("lightning")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")

FRAMEWORKS = ("lightning", "accelerate", "transformers")

pytestmark = pytest.mark.torchrun


def test_quick_benchmark_times_each_integration_against_its_framework(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\n<!-- bench:frameworks:start -->\nold\n"
                   "<!-- bench:frameworks:end -->\n")
    out = ecrl("bench", "frameworks", "--quick", "--format", "json", "--write-docs", str(doc),
               env={"PYTHONWARNINGS": "ignore"})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    # Each framework and mode: ECRL's own calls timed, and whole steps, against the framework
    # alone in the same process.
    pairs = sorted((row["candidate"], row["alternative"]) for row in report["rows"])
    assert pairs == sorted([
        *[(f"{fw} step + ECRL {mode}", f"{fw} step") for fw in FRAMEWORKS
          for mode in ("audit", "exact")],
        *[(f"{fw} + ECRL {mode}", fw) for fw in FRAMEWORKS
          for mode in ("audit", "exact")]])
    for row in report["rows"]:
        assert row["candidate_value"] > 0 and row["alternative_value"] > 0
        assert row["ratio"] == pytest.approx(row["candidate_value"] / row["alternative_value"])
    own = [row for row in report["rows"] if "own calls" in row["metric"]]
    # What ECRL adds is measured (a positive cost), not assumed.
    assert all(row["candidate_value"] > row["alternative_value"] for row in own)
    assert len(report["targets"]) == 2 * len(FRAMEWORKS)
    text = doc.read_text()
    assert "old" not in text and "lightning step + ECRL exact" in text
    assert text.count("bench:frameworks:start") == 1
