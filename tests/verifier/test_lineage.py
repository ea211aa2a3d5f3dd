"""Rebuilding the committed chain of attempts from supervisor.json and checkpoint events."""

from __future__ import annotations

from ecrl.runformat import CheckpointEvent, SupervisorAttempt
from verifier.lineage import build_lineage
from verifier.schema import CheckpointRecord


def attempt(k: int, resumed: int | None, *, status: str = "failed", world: int = 2
            ) -> SupervisorAttempt:
    return SupervisorAttempt(attempt=k, world_size=world, resumed_from_step=resumed,
                             first_step=None, last_step=None, exit_code=137, status=status,
                             start_time=float(k), end_time=float(k) + 0.5)


def events(**by_attempt: list[int]) -> dict[int, tuple[CheckpointRecord, ...]]:
    out = {}
    for name, steps in by_attempt.items():
        k = int(name[1:])
        out[k] = tuple(CheckpointRecord(attempt=k, line=i + 1, event=CheckpointEvent(
            global_step=s, strategy="blocking", snapshot_s=0, write_s=0, enqueue_s=0,
            backpressure_s=0, stall_s=0, bytes=1, path=f"c{s}")) for i, s in enumerate(steps))
    return out


def bounds(lineage: object) -> list[tuple[int, bool, int, int | None, int | None]]:
    return [(p.attempt, p.on_chain, p.lo, p.hi, p.writer)
            for p in lineage.plans]  # type: ignore[attr-defined]


def test_the_supervisor_rule() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, 9), attempt(2, 29, status="completed")],
                            events(a0=[4, 9], a1=[19, 29]))
    assert bounds(lineage) == [(0, True, 0, 9, None), (1, True, 10, 29, 0),
                               (2, True, 30, None, 1)]
    assert not lineage.anomalies and not lineage.notes


def test_an_attempt_without_a_checkpoint_commits_nothing() -> None:
    # Attempt 1 failed before its first checkpoint: attempt 2 loads attempt 0's again.
    lineage = build_lineage([attempt(0, None), attempt(1, 9), attempt(2, 9, status="completed")],
                            events(a0=[4, 9]))
    assert bounds(lineage) == [(0, True, 0, 9, None), (1, False, 10, 9, None),
                               (2, True, 10, None, 0)]
    assert [n.kind for n in lineage.notes] == ["off_chain"]


def test_resuming_from_an_older_checkpoint_throws_work_away_not_commits_it_twice() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, 19), attempt(2, 9, status="completed")],
                            events(a0=[9, 19], a1=[29]))
    assert bounds(lineage) == [(0, True, 0, 9, None), (1, False, 20, 19, None),
                               (2, True, 10, None, 0)]
    assert {n.kind for n in lineage.notes} == {"off_chain", "resume_backwards"}


def test_unknown_checkpoint_falls_back_to_the_previous_attempt() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, 7, status="completed")],
                            events(a0=[4]))
    assert [a.kind for a in lineage.anomalies] == ["unknown_checkpoint"]
    assert lineage.anomalies[0].step == 7 and "recorded: 4" in lineage.anomalies[0].message
    assert bounds(lineage) == [(0, True, 0, 7, None), (1, True, 8, None, 0)]


def test_a_fresh_restart_ends_the_chain() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, None, status="completed")],
                            events(a0=[4]))
    assert bounds(lineage) == [(0, False, 0, -1, None), (1, True, 0, None, None)]
    assert {n.kind for n in lineage.notes} == {"off_chain", "fresh_restart"}


def test_committed_has_no_lower_bound() -> None:
    plan = build_lineage([attempt(0, None), attempt(1, 9, status="completed")],
                         events(a0=[9])).plans[0]
    assert plan.committed(0) and plan.committed(9) and not plan.committed(10)
    final = build_lineage([attempt(0, None), attempt(1, 9, status="completed")],
                          events(a0=[9])).plans[1]
    assert final.committed(3) and final.committed(10**9)
    assert plan.torn_ok and not final.torn_ok
