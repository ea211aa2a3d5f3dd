"""Replay consistency: a replayed step's global loss must match across the failed attempt and its
successor (bit for bit at the same world size, within the tolerance at another)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from verifier_helpers import assert_verdict, make_run

from verifier import render_json, render_text, verify
from verifier._mutations import apply, judge
from verifier.explain import explain
from verifier.replay import DEFAULT_TOLERANCE, ReplayTracker

# Two failures at one world size: replayed steps after each resume (chaos 8: ranks ran past
# the checkpoint their successor resumed from).
SAME = dict(dataset_size=40, global_batch=4, target_steps=24, world_sizes=(2,), fail_at=(7, 15),
            ckpt_every=3, chaos=8, torn=False, seed=11)
ELASTIC = dict(SAME, world_sizes=(2, 1))


def _scale_replayed_loss(root: Path, factor: float) -> tuple[int, int]:
    """Multiply attempt 0's loss of its first replayed step (after attempt 1's resume point)
    on every rank; returns (step, resume point)."""
    supervisor = json.loads((root / "supervisor.json").read_text())
    resume = supervisor["attempts"][1]["resumed_from_step"]
    steps = []
    for path in sorted((root / "logs" / "attempt-000").glob("rank-*.jsonl")):
        records = [json.loads(x) for x in path.read_text().splitlines()]
        steps.append({r["global_step"] for r in records if r["global_step"] > resume})
    step = min(set.intersection(*steps))
    for path in sorted((root / "logs" / "attempt-000").glob("rank-*.jsonl")):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            record = json.loads(line)
            if record["global_step"] == step:
                record["loss"] = record["loss"] * factor
                lines[i] = json.dumps(record, separators=(",", ":"))
        path.write_text("\n".join(lines) + "\n")
    return step, resume


def _declare_nondeterministic(root: Path) -> None:
    manifest = json.loads((root / "run.json").read_text())
    manifest["deterministic"] = False
    (root / "run.json").write_text(json.dumps(manifest))


def test_replays_at_the_same_world_size_are_compared_bit_for_bit(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **SAME).root
    result = verify(run)
    assert_verdict(result, "PASS")
    replay = result.runs[0].replay
    assert replay is not None and replay.compared == replay.exact > 0 and replay.tolerant == 0
    assert "bit for bit at the same world size" in render_text(result)


def test_a_tiny_difference_at_the_same_world_size_is_a_divergence(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **SAME).root
    step, resume = _scale_replayed_loss(run, 1 + 1e-12)
    result = verify(run)
    assert_verdict(result, "FAIL", {"replay_divergence"}, exact=True)
    witness = result.runs[0].anomalies[0]
    assert witness.step == step and witness.attempt == 1
    assert witness.file == "logs/attempt-001/rank-000.jsonl" and witness.line is not None
    assert witness.related[0].attempt == 0 and witness.related[0].file is not None
    assert witness.expected != witness.actual
    assert f"resumed from the checkpoint at step {resume}" in explain(witness)
    # the largest difference counts the divergent step (it was null beside them: issue 25, 8)
    replay = result.runs[0].replay
    assert replay is not None and replay.max_rel_diff is not None
    assert replay.max_rel_diff == pytest.approx(1e-12, rel=0.5)


def test_a_divergence_after_an_attested_restore_blames_the_data_not_the_state(
        tmp_path: Path) -> None:
    """When the state digests prove the successor loaded exactly the saved state, the witness
    does not say the resume failed to restore it (issue 25, item 8)."""
    run = make_run(tmp_path / "run", **dict(SAME, digests=True)).root
    _scale_replayed_loss(run, 1 + 1e-6)
    result = verify(run)
    assert_verdict(result, "FAIL", {"replay_divergence"}, exact=True)
    said = explain(result.runs[0].anomalies[0])
    assert "matched every saved digest" in said and "did not restore" not in said
    plain = make_run(tmp_path / "plain", **SAME).root
    _scale_replayed_loss(plain, 1 + 1e-6)
    said = explain(verify(plain).runs[0].anomalies[0])
    assert "did not restore the training state, or not the data position" in said


def test_declared_nondeterminism_uses_the_tolerance_at_every_world_size(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **SAME).root
    _scale_replayed_loss(run, 1 + 1e-3)
    _declare_nondeterministic(run)
    result = verify(run)
    assert_verdict(result, "PASS")
    replay = result.runs[0].replay
    assert replay is not None and replay.exact == 0 and replay.tolerant == replay.compared > 0
    assert replay.max_rel_diff is not None and 5e-4 < replay.max_rel_diff < 2e-3
    assert_verdict(verify(run, replay_tolerance=1e-4), "FAIL", {"replay_divergence"})


def test_another_world_size_is_compared_within_the_tolerance(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **ELASTIC).root
    clean = verify(run)
    assert_verdict(clean, "PASS")
    replay = clean.runs[0].replay
    assert replay is not None and replay.tolerant > 0
    assert replay.tolerance == DEFAULT_TOLERANCE
    _scale_replayed_loss(run, 1.3)  # 30 %: within the default, not within 10 %
    assert_verdict(verify(run), "PASS")
    assert_verdict(verify(run, replay_tolerance=0.1), "FAIL", {"replay_divergence"})
    _scale_replayed_loss(run, 3.0)  # now 3.9 times the successor's loss
    assert_verdict(verify(run), "FAIL", {"replay_divergence"})


def test_a_run_without_replays_says_state_restoration_was_not_tested(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **dict(SAME, fail_at=())).root
    result = verify(run)
    assert_verdict(result, "PASS")
    assert result.runs[0].replay is not None and not result.runs[0].replay.tested
    assert "not tested: state restoration (no step was replayed" in render_text(result)
    data = json.loads(render_json(result))["runs"][0]["replay"]
    assert data["compared"] == 0 and data["replayed_steps"] == 0


def test_the_replay_mutation_is_killed_and_a_loss_change_elsewhere_is_benign(
        tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", **SAME).root
    for seed in range(3):
        outcome = apply("perturb_replayed_loss", run, tmp_path / f"p{seed}",
                        random.Random(seed))
        assert outcome is not None and outcome.verdict == "FAIL"
        result = verify(tmp_path / f"p{seed}")
        assert judge(outcome, result.verdict, list(result.runs[0].anomaly_counts))
        benign = apply("change_loss", run, tmp_path / f"c{seed}", random.Random(seed))
        assert benign is not None and benign.verdict == "PASS"
        assert verify(tmp_path / f"c{seed}").verdict == "PASS"


def test_only_the_replay_windows_are_kept(tmp_path: Path) -> None:
    from verifier.ingest import Ingest
    from verifier.judge import Judge
    from verifier.lineage import lineage_of
    from verifier.schema import read_inputs

    run = make_run(tmp_path / "run", **dict(SAME, target_steps=60, fail_at=(7, 15, 40))).root
    inputs = read_inputs(run)
    check = Ingest(inputs, lineage_of(inputs), want_series=False, reference_loss=None,
                   progress=None)
    held: list[int] = []

    class Spy(ReplayTracker):
        def attempt_done(self, attempt: int) -> None:
            held.append(sum(len(w) for w in self.old.values()) + len(self.new))
            super().attempt_done(attempt)

    check.replay = Spy(plans=check.lineage.plans, global_batch=4, deterministic=True,
                       tolerance=DEFAULT_TOLERANCE, sink=check.sink)
    check.scan()
    assert Judge(check).finish().verdict == "PASS"
    assert not check.replay.old and not check.replay.new
    # Never more than two attempts' replay windows (a few steps each), not the run's 60 steps.
    assert 0 < max(held) <= 12


@pytest.mark.parametrize("value", ["-1", "nan", "inf"])
def test_a_bad_tolerance_is_one_line(tmp_path: Path, value: str) -> None:
    run = make_run(tmp_path / "run", **SAME).root
    out = subprocess.run([sys.executable, "-m", "verifier.cli", str(run),
                          f"--replay-tolerance={value}"], capture_output=True, text=True)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "--replay-tolerance" in out.stderr
