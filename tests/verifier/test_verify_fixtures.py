"""Every fixture run under fixtures/runs/ gets exactly the verdict and anomaly kinds its
expected.json states (one parametrized test, as Porcupine's test_data and Elle's histories)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixture_cases import CASES

from verifier import KINDS, render_text, verify

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
DIRS = sorted(p for p in FIXTURES.iterdir() if (p / "expected.json").is_file())


@pytest.mark.parametrize("case", DIRS, ids=[p.name for p in DIRS])
def test_fixture(case: Path) -> None:
    expected = json.loads((case / "expected.json").read_text())
    other = expected.get("same_order")
    result = verify(case, same_order=FIXTURES / other if other else None)
    text = render_text(result)
    assert result.verdict == expected["verdict"], text
    assert result.exit_code == {"PASS": 0, "FAIL": 1, "UNKNOWN": 2}[expected["verdict"]]
    found = {k for run in result.runs for k in run.anomaly_counts}
    assert found == set(expected["kinds"]), text
    if expected["verdict"] == "UNKNOWN":
        assert all(run.unknown for run in result.runs), text
    unfinished = expected.get("unfinished")
    run = result.runs[0]
    if unfinished is None:
        assert run.unfinished is None, text
    else:
        assert run.unfinished is not None, text
        got = {key: getattr(run.unfinished, key) for key in unfinished}
        assert got == unfinished, text
        if expected["verdict"] == "UNKNOWN":
            # Unfinished and nothing else wrong: one reason, the run's account.
            assert run.unknown == (run.unfinished.message,), text


def test_fixtures_match_their_cases() -> None:
    assert [p.name for p in DIRS] == sorted(c.name for c in CASES)


def test_every_kind_and_benign_case_has_a_fixture() -> None:
    kinds = {k for p in DIRS for k in json.loads((p / "expected.json").read_text())["kinds"]}
    assert kinds == set(KINDS)
    names = {p.name for p in DIRS}
    for benign in ("pass-replayed-steps", "pass-torn-tail", "pass-elastic-2-to-1",
                   "pass-elastic-1-to-2", "pass-hash-only", "unknown-stopped", "unknown-running",
                   "unknown-gave-up", "unknown-stopped-before-checkpoint"):
        assert benign in names


def _run(name: str) -> object:
    return verify(FIXTURES / name).runs[0]


def test_benign_fixtures_show_what_they_claim() -> None:
    from verifier._testing.generate import RunSpec, plan_run

    cases = {c.name: c for c in CASES}
    assert _run("pass-replayed-steps").metrics.replayed_steps > 0  # type: ignore[attr-defined]
    torn = _run("pass-torn-tail").warnings  # type: ignore[attr-defined]
    assert any(w.kind == "torn_line" for w in torn)
    for name, sizes in (("pass-elastic-2-to-1", [2, 1]), ("pass-elastic-1-to-2", [1, 2]),
                        ("pass-hash-only", [4, 2, 4])):
        assert [a.world_size for a in _run(name).lineage] == sizes  # type: ignore[attr-defined]
    assert _run("pass-hash-only").log_ids is False  # type: ignore[attr-defined]
    plan = plan_run(RunSpec(**cases["pass-lost-overlapped-write"].spec))
    assert any(a.lost is not None for a in plan)
    fresh = _run("pass-fresh-restart").lineage  # type: ignore[attr-defined]
    assert fresh[1].resumed_from_step is None and fresh[0].committed is None


def test_unfinished_fixtures_show_what_they_claim() -> None:
    stopped = _run("unknown-stopped")
    final = stopped.lineage[-1]  # type: ignore[attr-defined]
    # A stop mid-step: the ranks' last steps differ, and a line was cut.
    assert final.status == "stopped" and final.tentative_steps == 2
    assert any(w.kind == "torn_line" and "attempt-002" in (w.file or "")
               for w in stopped.warnings)  # type: ignore[attr-defined]
    message = stopped.unfinished.message  # type: ignore[attr-defined]
    assert message.startswith("run not finished (status 'stopped' after step 18): steps 0..17 "
                              "proved exactly once up to the last durable checkpoint; steps "
                              "18..23 not committed yet — continue it with `ecrl run --out ")
    assert "continue it" in _run("unknown-gave-up").unfinished.message  # type: ignore[attr-defined]
    running = _run("unknown-running").unfinished.message  # type: ignore[attr-defined]
    assert "status 'running'" in running and "verify again when it has finished" in running
    nothing = _run("unknown-stopped-before-checkpoint")
    assert nothing.checked["committed_records"] == 0  # type: ignore[attr-defined]
    assert "no durable checkpoint yet, so nothing is committed" in \
        nothing.unfinished.message  # type: ignore[attr-defined]
    # A FAIL in an unfinished run keeps the account as a warning.
    failed = _run("unfinished-missing-record")
    assert failed.warnings[0].kind == "unfinished"  # type: ignore[attr-defined]
    assert not failed.unknown  # type: ignore[attr-defined]


def test_an_unfinished_launch_is_continued_with_ecrl_launch(tmp_path: Path) -> None:
    """A run ``ecrl launch`` supervises (its supervisor.json holds the launch) is continued with
    ``ecrl launch --out``; ``ecrl run --out`` fails on it (issue 25, item 8)."""
    import shutil

    root = tmp_path / "run"
    shutil.copytree(FIXTURES / "unknown-stopped", root)
    supervisor = root / "supervisor.json"
    data = json.loads(supervisor.read_text())
    data["launch"] = {"program": ["train.py"], "config": {}, "given": {}, "node_rank": 0}
    supervisor.write_text(json.dumps(data))
    unfinished = verify(root).runs[0].unfinished
    assert unfinished is not None and unfinished.command == "launch"
    assert f"continue it with `ecrl launch --out {root}`" in unfinished.message
    assert _run("unknown-stopped").unfinished.command == "run"  # type: ignore[attr-defined]
