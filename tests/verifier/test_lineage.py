"""Rebuilding the committed chain of attempts from supervisor.json and checkpoint events."""

from __future__ import annotations

import json
from pathlib import Path

from verifier_helpers import make_run

from ecrl.contract.runformat import CheckpointEvent, SupervisorAttempt
from verifier import verify_run
from verifier.explain import explain
from verifier.lineage import build_lineage, durable_step, is_finished, lineage_of
from verifier.schema import CheckpointRecord, read_inputs


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
    assert lineage.anomalies[0].step == 7 and "recorded: 4" in explain(lineage.anomalies[0])
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


# --- unfinished runs: the final attempt is cut where a continuation would resume -------------


def test_an_unfinished_final_attempt_commits_up_to_the_durable_checkpoint() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, 9, status="stopped")],
                            events(a0=[4, 9], a1=[14, 19]), finished=False, durable=19)
    assert bounds(lineage) == [(0, True, 0, 9, None), (1, True, 10, 19, 0)]
    assert [p.tentative for p in lineage.plans] == [False, True]
    assert not lineage.finished and lineage.durable == 19
    final = lineage.plans[1]
    assert final.committed(19) and not final.committed(20)
    assert not lineage.anomalies and not lineage.notes


def test_an_unfinished_attempt_without_a_checkpoint_is_all_tentative() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, 9, status="running")],
                            events(a0=[4, 9]), finished=False, durable=9)
    assert bounds(lineage) == [(0, True, 0, 9, None), (1, False, 10, 9, None)]
    assert lineage.plans[1].tentative
    (note,) = lineage.notes
    assert note.kind == "off_chain" and note.message == (
        "attempt 1 is not in the committed lineage: the run is unfinished and a continuation "
        "resumes from step 9, a checkpoint of attempt 0; all of its steps are tentative")


def test_an_unfinished_run_without_a_durable_checkpoint_commits_nothing() -> None:
    lineage = build_lineage([attempt(0, None), attempt(1, None, status="stopped")],
                            {}, finished=False, durable=None)
    assert not lineage.chain
    assert [n.message.split(": ")[1].split(";")[0] for n in lineage.notes] == [
        "the run is unfinished and has no durable checkpoint, so a continuation starts fresh"] * 2
    assert "count as replayed" in lineage.notes[0].message
    assert "tentative" in lineage.notes[1].message


def _unfinished(tmp_path: Path, **spec: object) -> Path:
    return make_run(tmp_path / "run", dataset_size=40, global_batch=4, target_steps=30,
                    world_sizes=(2,), ckpt_every=5, stop_at=17, **spec).root


def test_durable_step_is_latest_json_backed_by_its_event(tmp_path: Path) -> None:
    inputs = read_inputs(_unfinished(tmp_path))
    assert not is_finished(inputs)
    assert durable_step(inputs) == (14, None)
    assert lineage_of(inputs).plans[0].hi == 14


def test_durable_step_claims_less_when_latest_json_is_ahead_of_the_events(tmp_path: Path
                                                                         ) -> None:
    # A stop between publishing latest.json and writing the checkpoint event.
    root = _unfinished(tmp_path)
    pointer = root / "checkpoints" / "latest.json"
    data = json.loads(pointer.read_text())
    pointer.write_text(json.dumps({**data, "global_step": 16}))
    step, note = durable_step(read_inputs(root))
    assert step == 14 and note is not None and note.kind == "latest"
    assert "no checkpoint event backs step 16" in note.message


def test_an_unreadable_latest_json_gives_way_to_the_newest_event(tmp_path: Path) -> None:
    root = _unfinished(tmp_path)
    (root / "checkpoints" / "latest.json").write_text("{not json")
    step, note = durable_step(read_inputs(root))
    assert step == 14 and note is not None and note.message.startswith("unreadable")


def test_without_latest_json_nothing_is_durable(tmp_path: Path) -> None:
    root = _unfinished(tmp_path)
    (root / "checkpoints" / "latest.json").unlink()
    step, note = durable_step(read_inputs(root))
    assert step is None and note is not None and "continuation starts fresh" in note.message
    result = verify_run(root)
    assert result.verdict == "UNKNOWN" and result.unfinished is not None
    assert result.unfinished.committed_steps == 0


def test_a_completed_supervisor_with_a_stopped_final_attempt_is_unfinished(tmp_path: Path
                                                                          ) -> None:
    root = _unfinished(tmp_path)
    state = json.loads((root / "supervisor.json").read_text())
    state["status"] = "completed"
    (root / "supervisor.json").write_text(json.dumps(state))
    inputs = read_inputs(root)
    assert not is_finished(inputs)
    result = verify_run(root)
    assert result.verdict == "UNKNOWN" and result.unfinished is not None
    assert result.unfinished.status == "stopped"


def test_last_step_may_be_the_last_step_every_rank_logged(tmp_path: Path) -> None:
    # The runtime records the last step *every* rank logged; after a stop mid-step one rank is
    # a step ahead. Only a last_step outside that range is worth a warning.
    root = make_run(tmp_path / "run", dataset_size=40, global_batch=4, target_steps=30,
                    world_sizes=(2,), ckpt_every=5, stop_at=17, chaos=2).root
    lasts = [max(json.loads(line)["global_step"] for line in p.read_text().split("\n")[:-1])
             for p in sorted(root.glob("logs/*/rank-*"))]
    assert sorted(lasts) == [16, 17]
    path = root / "supervisor.json"
    state = json.loads(path.read_text())
    for claimed, warned in ((16, False), (17, False), (15, True)):
        state["attempts"][0]["last_step"] = claimed
        path.write_text(json.dumps(state))
        notes = [w.message for w in verify_run(root).warnings if w.kind == "supervisor"]
        assert notes == ([f"attempt 0: supervisor.json says last_step {claimed}, the logs end "
                          "at step 16 (every rank) to 17 (some rank)"] if warned else [])


def ran(k: int, resumed: int | None, first: int, last: int, *, status: str = "failed"
        ) -> SupervisorAttempt:
    return SupervisorAttempt(attempt=k, world_size=2, resumed_from_step=resumed, first_step=first,
                             last_step=last, exit_code=137 if status == "failed" else 0,
                             status=status, start_time=float(k), end_time=float(k) + 0.5)


def test_a_resume_point_without_event_needs_the_supervisors_testimony() -> None:
    # The blocking writer died between publishing latest.json (step 19) and logging its event.
    attempts = [ran(0, None, 0, 23), ran(1, 19, 20, 59, status="completed")]
    bare = build_lineage(attempts, events(a0=[9]))
    assert [a.kind for a in bare.anomalies] == ["unknown_checkpoint"]
    attested = build_lineage(attempts, events(a0=[9]), attested={1: 19})
    assert not attested.anomalies
    assert bounds(attested) == [(0, True, 0, 19, None), (1, True, 20, None, 0)]
    assert [n.kind for n in attested.notes] == ["attested_checkpoint"]
    # testimony for another step, or from an attempt that never ran the step, is no evidence
    assert build_lineage(attempts, events(a0=[9]), attested={1: 9}).anomalies
    never_ran = [ran(0, None, 0, 15), ran(1, 19, 20, 59, status="completed")]
    assert build_lineage(never_ran, events(a0=[9]), attested={1: 19}).anomalies


def test_testimony_is_read_from_supervisor_json(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", world_sizes=(2,), fail_at=(14,), ckpt_every=5,
                   log_ids=False).root
    state = json.loads((run / "supervisor.json").read_text())
    resumed = state["attempts"][1]["resumed_from_step"]
    log = run / "logs" / "attempt-000" / "checkpoint_rank0.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    kept = [x for x in lines if json.loads(x)["global_step"] != resumed]
    assert len(kept) == len(lines) - 1
    log.write_bytes(b"".join(kept))
    # generated runs carry the testimony, as the runtime's supervisor writes it
    assert state["resume_points"]["1"]["global_step"] == resumed
    result = verify_run(run)
    assert result.verdict == "PASS", result
    assert any("verified against its checksum" in str(w) for w in result.warnings)
    del state["resume_points"]
    (run / "supervisor.json").write_text(json.dumps(state))
    assert verify_run(run).verdict == "FAIL"  # no event, no testimony
