"""``ecrl bench verify`` runs end to end (on tiny runs: the figures themselves are not tested)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ecrl.apps.bench import verify as bench
from ecrl.apps.bench._common import render_text


def test_bench_runs_and_reports_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ECRL_BENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(bench, "SIZES", {True: (3000,)})
    monkeypatch.setattr(bench, "ID_SIZE", {True: 2000})
    monkeypatch.setattr(bench, "MUTATED_RUNS", {True: 1})
    monkeypatch.setattr(bench, "SCALE_SIZE", {True: 3000})
    messages: list[str] = []
    result = bench.run(quick=True, progress=messages.append)
    assert [r.metric.split(" (")[0] for r in result.rows] == [
        "seconds to read the logs", "peak memory, MiB", "records/s verified, millions",
        "minutes to verify 1e+10 records", "seconds to read the logs"]
    assert all(r.candidate_value and r.alternative_value for r in result.rows)
    descriptions = [t.description for t in result.targets]
    assert any("≤ 2× raw parse" in d for d in descriptions)
    assert any("peak memory ≤ 1 GiB" in d for d in descriptions)
    assert any("--jobs 2 ≥ 1.7×" in d for d in descriptions)
    assert any("IDs mode ≤ 1.3×" in d for d in descriptions)
    assert any(n.startswith("projection: 1e+10 records") for n in result.notes)
    kill = next(t for t in result.targets if "mutation catalogue" in t.description)
    assert kill.met, kill.measured
    assert any("generating" in m for m in messages)
    assert "ecrl-verify" in render_text(result)
    # The second run reuses the cached logs.
    messages.clear()
    bench.run(quick=True, progress=messages.append)
    assert not any("generating" in m for m in messages)
