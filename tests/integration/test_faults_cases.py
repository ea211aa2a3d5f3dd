"""``ecrl faults``: the case list and the table, without running anything (fast)."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from ecrl.apps import faults
from ecrl.contract.runformat import STRATEGIES
from ecrl.runtime.checkpoint.persist import SHARDED_POINTS


def test_every_strategy_gets_every_kind_of_fault() -> None:
    full = faults.cases(quick=False)
    assert len({(c.strategy, c.name) for c in full}) == len(full)  # no duplicates
    assert set(faults.STRATEGIES) <= set(STRATEGIES)
    for strategy in faults.STRATEGIES:
        kinds = Counter(c.kind for c in full if c.strategy == strategy)
        assert kinds["kill"] == 2 and kinds["sigkill"] == 2  # rank 0 and rank 1
        assert kinds["latest"] == 4 and kinds["enospc"] == 1 and kinds["hang"] == 1
        assert kinds["damage"] >= 3 and kinds["crash"] >= 7
    sharded = {c.name for c in full if c.strategy == "sharded-async" and c.kind == "crash"}
    for point in SHARDED_POINTS:  # every point of the sharded protocol is a case
        assert any(f"sharded:{point} " in name for name in sharded), point
    for rank in (0, 1):
        assert f"crash sharded:after-parts (rank {rank})" in sharded
    # interleaved: any prefix covers every strategy alike
    assert [c.strategy for c in full[:4]] == list(faults.STRATEGIES)


def test_every_strategy_meets_a_forger() -> None:
    from ecrl.runtime.checkpoint.registry import strategy_entry

    full = faults.cases(quick=False)
    for strategy in faults.STRATEGIES:
        forged = {c.damage: c for c in full if c.strategy == strategy and c.kind == "forge"}
        want = {"pickle", "relative-path", "recycled-link"} if strategy_entry(strategy).sharded \
            else {"pickle"}
        fifos = {f"fifo:{log}" for log in ("rank-001.jsonl", "checkpoint_rank0.jsonl")}
        assert set(forged) == want | fifos, strategy
        assert all(c.expect == "previous" for k, c in forged.items() if k in want - {
            "recycled-link"})
        assert all(c.expect is None for k, c in forged.items() if k in fifos)  # refused


def test_quick_profile_is_a_small_subset_of_the_kinds() -> None:
    quick = faults.cases(quick=True)
    assert len(quick) == 4
    assert {c.kind for c in quick} == {"kill", "crash", "damage", "latest"}


def test_table_has_the_columns_and_counts_safe_cases() -> None:
    results = [
        faults.CaseResult(case="a", strategy="sharded", outcome="completed",
                          checkpoint_used="step-00000005.dcp", replayed=2, verdict="safe",
                          seconds=1.0),
        faults.CaseResult(case="b", strategy="blocking", outcome="exit 1",
                          checkpoint_used="—", replayed=None, verdict="UNSAFE", seconds=1.0,
                          detail="run ended with exit 1"),
    ]
    table = faults.render_markdown(results)
    lines = table.splitlines()
    assert lines[0] == ("| case | strategy | outcome | checkpoint used | replayed steps | "
                        "verdict |")
    assert "| a | sharded | completed | step-00000005.dcp | 2 | safe |" in lines
    assert "| b | blocking | exit 1 | — | — | UNSAFE: run ended with exit 1 |" in lines
    assert lines[-1] == "1/2 cases safe."


def test_replayed_steps_and_checkpoints_used_come_from_supervisor_json() -> None:
    state = {"attempts": [{"attempt": 0, "last_step": 7, "resumed_from_step": None},
                          {"attempt": 1, "last_step": 9, "resumed_from_step": 5},
                          {"attempt": 2, "last_step": 11, "resumed_from_step": 8}],
             "resume_points": {"1": {"global_step": 5, "path": "step-00000005.dcp",
                                     "reason": "latest"},
                               "2": {"global_step": 8, "path": "step-00000008.dcp",
                                     "reason": "fallback"}}}
    assert faults._replayed(state) == (7 - 5) + (9 - 8)
    used, steps = faults._used(state)
    assert used == "step-00000005.dcp, step-00000008.dcp (fallback)" and steps == [5, 8]


def test_cli_lists_the_campaign() -> None:
    out = subprocess.run([sys.executable, "-m", "ecrl.apps.cli", "faults", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    for flag in ("--quick", "--out", "--jobs", "--format"):
        assert flag in out.stdout
