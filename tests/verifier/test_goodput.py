"""Metrics from the same pass: goodput, restarts, replayed steps, checkpoint time, loss
divergence against a reference run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from verifier_helpers import make_run

from verifier import verify, verify_run
from verifier._testing.generate import committed_steps
from verifier.goodput import loss_divergence


def test_metrics_of_a_run_with_failures(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", dataset_size=60, global_batch=4, target_steps=50,
                   world_sizes=(2, 4, 1), fail_at=(13, 31), ckpt_every=5, chaos=4,
                   strategy="blocking")
    result = verify_run(run.root)
    m = result.metrics
    assert result.verdict == "PASS"
    assert m.committed_steps == 50 == committed_steps(run.attempts)
    assert m.restarts == 2
    assert m.replayed_steps == run.replayed_steps > 0
    supervisor = json.loads((run.root / "supervisor.json").read_text())["attempts"]
    assert m.wall_s == pytest.approx(supervisor[-1]["end_time"] - supervisor[0]["start_time"])
    assert m.goodput == pytest.approx(50 / m.wall_s)
    events = [json.loads(line) for p in sorted(run.root.glob("logs/*/checkpoint_rank0.jsonl"))
              for line in p.read_text().splitlines()]
    assert m.checkpoints == len(events) > 0
    assert m.stall_s == pytest.approx(sum(e["stall_s"] for e in events))
    assert m.write_s == pytest.approx(sum(e["write_s"] for e in events))
    assert m.snapshot_s == pytest.approx(sum(e["snapshot_s"] for e in events))
    # Restart time: each failed attempt's end to the next attempt's first record.
    assert m.restart_s is not None and m.restart_s >= 2 * 3.0
    assert m.lost_s is not None and m.lost_s > 0
    assert [a.committed for a in result.lineage] == [
        (a.start, a.committed_hi) if a.committed_hi >= a.start else None for a in run.attempts]


def test_a_run_without_failures_replays_nothing(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", target_steps=20, world_sizes=(4,), ckpt_every=0,
                   strategy="none")
    m = verify_run(run.root).metrics
    assert (m.committed_steps, m.restarts, m.replayed_steps, m.checkpoints) == (20, 0, 0, 0)
    assert m.lost_s == 0.0 and m.restart_s is None


def test_loss_divergence_against_a_reference(tmp_path: Path) -> None:
    same = dict(dataset_size=60, global_batch=4, target_steps=30, seed=5)
    reference = make_run(tmp_path / "ref", world_sizes=(2,), **same)
    elastic = make_run(tmp_path / "elastic", world_sizes=(2, 1), fail_at=(11,), ckpt_every=4,
                       chaos=1, **same)
    noisy = make_run(tmp_path / "noisy", world_sizes=(2,), loss_noise=0.01, chaos=9, **same)
    result = verify(elastic.root, reference=reference.root)
    m = result.runs[0].metrics
    assert (m.loss_max_abs_diff, m.loss_mean_abs_diff, m.loss_steps_compared) == (0.0, 0.0, 30)
    m = verify(noisy.root, reference=reference.root).runs[0].metrics
    assert m.loss_max_abs_diff is not None and m.loss_mean_abs_diff is not None
    assert 0 < m.loss_mean_abs_diff <= m.loss_max_abs_diff < 0.1
    assert m.loss_steps_compared == 30
    assert verify(noisy.root).runs[0].metrics.loss_max_abs_diff is None


def test_loss_divergence_ignores_unknown_steps() -> None:
    a = np.array([1.0, np.nan, 3.0, 4.0])
    b = np.array([1.5, 2.0, np.nan])
    assert loss_divergence(a, b) == (0.5, 0.5, 1)
    assert loss_divergence(a, None) == (None, None, None)
    assert loss_divergence(np.array([np.nan]), np.array([1.0])) == (None, None, 0)


def test_metrics_of_an_unfinished_run(tmp_path: Path) -> None:
    # Stopped after step 33 (a rank may be a step behind); the last durable checkpoint is 29.
    run = make_run(tmp_path / "run", dataset_size=60, global_batch=4, target_steps=50,
                   world_sizes=(2, 4), fail_at=(13,), ckpt_every=5, chaos=1, stop_at=33)
    result = verify_run(run.root)
    m = result.metrics
    assert result.verdict == "UNKNOWN" and run.durable_step == 29
    assert m.committed_steps == 30 == committed_steps(run.attempts)
    # Steps after the durable checkpoint are tentative, not replayed (nothing re-ran them yet).
    final = result.lineage[-1]
    assert final.committed == (10, 29) and final.replayed_steps == 0
    assert m.tentative_steps == final.tentative_steps == run.tentative_steps == 4
    assert m.replayed_steps == run.replayed_steps == result.lineage[0].replayed_steps
    assert m.wall_s and m.goodput == pytest.approx(30 / m.wall_s)
    # The losses of an unfinished reference are compared over its committed prefix.
    finished = make_run(tmp_path / "finished", dataset_size=60, global_batch=4, target_steps=50,
                        world_sizes=(2,), chaos=1)
    compared = verify(finished.root, reference=run.root).runs[0]
    assert compared.metrics.loss_steps_compared == 30
    assert [w.message for w in compared.warnings if w.kind == "reference"] == [
        f"the reference run {run.root} is unfinished: losses are compared over its committed "
        "steps 0..29"]


def test_a_running_attempt_without_an_end_time_ends_at_its_last_record(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", target_steps=30, world_sizes=(2,), ckpt_every=5,
                   stop_at=20, end="running")
    supervisor = json.loads((run.root / "supervisor.json").read_text())
    assert supervisor["status"] == "running" and supervisor["attempts"][-1]["end_time"] is None
    m = verify_run(run.root).metrics
    last = max(json.loads(line)["time"] for p in run.root.glob("logs/*/rank-*.jsonl")
               for line in p.read_text().splitlines() if line.endswith("}"))
    assert m.wall_s == pytest.approx(last - supervisor["attempts"][0]["start_time"])
    assert m.committed_steps == 20


# ``ecrl run``'s summary and ``ecrl-verify`` print one goodput (ecrl.contract.goodput): the same
# committed steps over the same wall time, for the same run directory.
FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "runs"
FINISHED = sorted(p.name for p in FIXTURES.iterdir()
                  if p.name.startswith("pass-") and not p.name.startswith("pass-external"))


def _both(root: Path) -> tuple[float, float, float | None, float | None]:
    from ecrl.runtime.supervision.summary import summarize

    summary = summarize(str(root))
    m = verify_run(root).metrics
    return summary.goodput, summary.wall_s, m.goodput, m.wall_s


@pytest.mark.parametrize("case", FINISHED)
def test_the_summary_and_the_verifier_print_the_same_goodput(case: str) -> None:
    summary_goodput, summary_wall, goodput, wall = _both(FIXTURES / case)
    assert goodput is not None and wall is not None
    assert (summary_goodput, summary_wall) == (goodput, wall)


def test_same_goodput_for_a_run_with_failures_and_a_stop_continued_days_later(
        tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", dataset_size=60, global_batch=4, target_steps=50,
                   world_sizes=(2, 4, 1), fail_at=(13, 31), ckpt_every=5, strategy="blocking")
    summary_goodput, summary_wall, goodput, wall = _both(run.root)
    assert (summary_goodput, summary_wall) == (goodput, wall)
    supervisor_path = run.root / "supervisor.json"
    supervisor = json.loads(supervisor_path.read_text())
    attempts = supervisor["attempts"]
    assert wall == pytest.approx(attempts[-1]["end_time"] - attempts[0]["start_time"])
    # The second failure was a person's stop instead, and the run was continued 3 days later:
    # the wait is not counted, by either.
    attempts[1]["status"] = "stopped"
    for a in attempts[2:]:
        a["start_time"] += 3 * 86400
        a["end_time"] += 3 * 86400
    supervisor_path.write_text(json.dumps(supervisor))
    summary_goodput, summary_wall, goodput, wall = _both(run.root)
    assert (summary_goodput, summary_wall) == (goodput, wall)
    gap = attempts[2]["start_time"] - attempts[1]["end_time"]
    assert wall == pytest.approx(attempts[-1]["end_time"] - attempts[0]["start_time"] - gap)
    assert goodput == pytest.approx(50 / wall)
