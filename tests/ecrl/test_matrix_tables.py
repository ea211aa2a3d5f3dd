"""Matrix tables from unit records: comparisons per seed, Student-t intervals, stable outputs."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from ecrl.apps.matrix import build_tables, estimate, load_matrix, t_quantile, write_outputs

CONFIG = """\
[matrix]
seeds = 2
[run]
steps = 40
global-batch = 8
[datasets.fake]
dataset-size = 128
[models.tiny]
model = "tiny-cnn"
[schedules.a]
fail-at = [9]
[schedules.b]
fail-at = [5, 20]
"""

@pytest.fixture(autouse=True)
def _two_strategies(monkeypatch: pytest.MonkeyPatch) -> None:
    """The expected tables below were written for blocking and overlapped; a strategy the runtime
    gains later must not change them (test_variants_follow_the_runtimes_strategy_list checks that
    new strategies do appear)."""
    from ecrl.runtime import runconfig

    monkeypatch.setattr(runconfig, "BUILT_STRATEGIES", ("none", "blocking", "overlapped"))



@pytest.mark.parametrize(("df", "value"), [(1, 12.7062047), (2, 4.3026527), (4, 2.7764451),
                                           (9, 2.2621572), (30, 2.0422725), (1000, 1.9623391)])
def test_t_quantile_matches_published_values(df: int, value: float) -> None:
    assert t_quantile(0.975, df) == pytest.approx(value, abs=1e-6)


def test_estimate_is_the_student_t_interval() -> None:
    e = estimate([1.0, 2.0, 3.0, None])
    assert e.n == 3 and e.mean == 2.0
    assert e.ci95 == pytest.approx(4.3026527 * 1.0 / math.sqrt(3))
    assert estimate([5.0]).ci95 is None and estimate([]).mean is None


def _record(uid: str, goodput: float, stall: float, *, digest: str = "sha256:x",
            verdict: str = "PASS", restarts: int = 0) -> dict[str, Any]:
    suite, rest = uid.split("/")
    variant, seed = rest.rsplit("-seed", 1)
    return {"uid": uid, "suite": suite, "dataset": "fake", "model": "tiny",
            "schedule": None if variant == "reference" else suite.rsplit("-", 1)[1],
            "variant": variant, "strategy": variant, "seed": int(seed), "verdict": verdict,
            "exit_code": 0, "complete": True, "fail_at": [], "run_dir": f"runs/{uid}",
            "params_digest": digest, "world_sizes": [1] * (restarts + 1),
            "metrics": {"goodput": goodput, "stall_s": stall, "restarts": restarts,
                        "replayed_steps": 3, "wall_s": 40 / goodput, "write_s": 1.0,
                        "snapshot_s": 0.1, "loss_mean_abs_diff": 0.0,
                        "loss_max_abs_diff": 0.0}}


@pytest.fixture
def config(tmp_path: Path) -> Any:
    path = tmp_path / "m.toml"
    path.write_text(CONFIG)
    return load_matrix(path)


@pytest.fixture
def records() -> dict[str, dict[str, Any]]:
    rs = [_record("fake-tiny/reference-seed0", 10.0, 2.0),
          _record("fake-tiny/reference-seed1", 12.0, 2.0),
          _record("fake-tiny-a/blocking-seed0", 8.0, 2.0, restarts=1),
          _record("fake-tiny-a/blocking-seed1", 9.0, 3.0, restarts=1),
          _record("fake-tiny-a/overlapped-seed0", 9.0, 0.5, restarts=1),
          _record("fake-tiny-a/overlapped-seed1", 9.9, 1.0, restarts=1),
          _record("fake-tiny-b/blocking-seed0", 6.0, 2.0, restarts=2, verdict="FAIL"),
          _record("fake-tiny-b/overlapped-seed0", 5.0, 1.0, restarts=2, digest="sha256:y")]
    return {r["uid"]: r for r in rs}


def test_comparisons_are_per_seed_with_intervals(config: Any, records: Any) -> None:
    tables = build_tables(config, records)
    rows = {(r.suite, r.variant): r for r in tables.suites}
    ovl = rows[("fake-tiny-a", "overlapped")]
    drops = [100 * (9.0 / 10.0 - 1), 100 * (9.9 / 12.0 - 1)]
    assert ovl.drop_pct.mean == pytest.approx(sum(drops) / 2)
    assert ovl.drop_pct.ci95 == pytest.approx(12.7062047 * abs(drops[0] - drops[1]) / 2,
                                              rel=1e-6)
    assert ovl.gain_pct.mean == pytest.approx((100 * (9 / 8 - 1) + 100 * (9.9 / 9 - 1)) / 2)
    assert ovl.stall_reduction_s.mean == pytest.approx((1.5 + 2.0) / 2)
    assert ovl.bit_identical is True and ovl.verdict == "PASS" and ovl.rank == 2
    assert rows[("fake-tiny-a", "reference")].rank == 1
    assert rows[("fake-tiny-a", "blocking")].expected_restarts == 1
    assert rows[("fake-tiny-b", "blocking")].expected_restarts == 2
    # one seed missing: MISSING unless a present one failed; a different digest is not identical
    assert rows[("fake-tiny-b", "blocking")].verdict == "FAIL"
    assert rows[("fake-tiny-b", "overlapped")].verdict == "MISSING"
    assert rows[("fake-tiny-b", "overlapped")].bit_identical is None  # a seed has no record
    assert set(tables.missing) == {"fake-tiny-b/blocking-seed1", "fake-tiny-b/overlapped-seed1"}
    overall = {o.variant: o for o in tables.overall}
    assert overall["overlapped"].positive_gain == "1/2"
    assert overall["blocking"].pass_rate == pytest.approx(2 / 3)
    assert [r.suite for r in tables.ranking()] == ["fake-tiny-a", "fake-tiny-b"]
    slices = {(s.axis, s.group, s.variant): s for s in tables.slices}
    assert slices[("schedule", "a", "overlapped")].gain_pct == pytest.approx(ovl.gain_pct.mean)


def test_a_different_digest_is_reported(config: Any, records: Any) -> None:
    records["fake-tiny-a/overlapped-seed1"]["params_digest"] = "sha256:other"
    rows = {(r.suite, r.variant): r for r in build_tables(config, records).suites}
    assert rows[("fake-tiny-a", "overlapped")].bit_identical is False


def test_outputs_depend_on_the_records_only(config: Any, records: Any, tmp_path: Path) -> None:
    names = ["summary.csv", "summary.md", "summary.json", "units.csv", "figures/goodput.png",
             "figures/gain.png", "figures/stall_vs_gain.png"]
    write_outputs(config, tmp_path / "a", records)
    write_outputs(config, tmp_path / "b", records)
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    with open(tmp_path / "a" / "summary.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 * 3 and {r["variant"] for r in rows} == {
        "reference", "blocking", "overlapped"}
    data = json.loads((tmp_path / "a" / "summary.json").read_text())
    assert {"overall", "suites", "ranking", "slices", "units", "missing"} <= set(data)
    assert "Incomplete" in (tmp_path / "a" / "summary.md").read_text()


def test_the_seeds_published_aggregates_follow_from_its_suites() -> None:
    # Seed 000, Table 5 from its Tables 6 and 8: the drop and gain definitions here are the
    # seed's (per suite, then averaged).
    from ecrl.apps.matrix._seed import seed_tables

    rows = seed_tables().suites

    def mean(variant: str, attr: str) -> float:
        values = [getattr(r, attr).mean for r in rows if r.variant == variant]
        return sum(values) / len(values)

    assert mean("blocking", "drop_pct") == pytest.approx(-13.2466, abs=1e-4)
    assert mean("overlapped", "drop_pct") == pytest.approx(-11.5026, abs=1e-4)
    assert mean("overlapped", "gain_pct") == pytest.approx(1.9931, abs=1e-4)
    assert mean("overlapped", "stall_reduction_s") == pytest.approx(10.2205, abs=1e-3)
    assert mean("overlapped", "goodput") == pytest.approx(9.6433, abs=1e-4)
    assert all(r.gain_pct.mean > 0 for r in rows if r.variant == "overlapped")  # 8/8
