"""The cases behind ``fixtures/runs/<case>/``: how each run was made and what it must yield.

Expectations are written here by hand from the definition of each damage, not recorded from the
verifier. Regenerate the fixtures after changing a case::

    .venv/bin/python tests/verifier/fixture_cases.py fixtures/runs
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract import semantics
from verifier._mutations import apply
from verifier._testing.generate import RunSpec, generate_run, state_digests

# A small elastic run: 2 ranks, then 1, then 2 (D = 40, B = 4: 10 steps per epoch).
BASE: dict[str, Any] = dict(dataset_size=40, global_batch=4, target_steps=24,
                            world_sizes=(2, 1, 2), fail_at=(7, 15), ckpt_every=3,
                            strategy="blocking", chaos=5, seed=11)
HASH = dict(BASE, log_ids=False)
IDS = dict(BASE, log_ids=True)
# Unfinished: the final attempt 2 (resumed from step 14, checkpoint at step 17) ends after step
# 19 — rank 0 logged step 19, rank 1 only step 18 and then a torn line (a stop mid-step).
STOPPED = dict(BASE, stop_at=19, end="stopped")
# An external sampler (a stand-in for a user's shuffling sampler, not ECRL's order): audited.
EXT = dict(IDS, sampler="external")
EXT_HASH = dict(EXT, log_ids=False)
STATE = dict(HASH, digests=True)
# A mesh run: DP 2 x TP 2 at W = 4, then DP 1 x TP 2 at W = 2, then DP 4 x TP 1 at W = 4 (the
# data-parallel degree changes 2 -> 1 -> 4 at the resumes).
MESH = dict(IDS, world_sizes=(4, 2, 4), tp_sizes=(2, 2, 1))


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    description: str
    spec: dict[str, Any]
    verdict: str
    kinds: frozenset[str] = frozenset()
    mutation: str | None = None
    seed: int = 0
    unfinished: dict[str, Any] | None = None
    """For an unfinished run: its status, last durable checkpoint and committed prefix."""
    damage: Callable[[Path], None] | None = field(default=None, repr=False)
    same_order: str | None = None
    """Verify with ``--same-order fixtures/runs/<same_order>``."""


def _edit_json(name: str, change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    def damage(root: Path) -> None:
        path = root / name
        data = json.loads(path.read_text())
        change(data)
        path.write_text(json.dumps(data, indent=2) + "\n")

    return damage


def _edit_record(attempt: int, rank: int, step: int,
                 change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """Change one step record and make its count and hash describe its IDs again."""
    def damage(root: Path) -> None:
        path = root / f"logs/attempt-{attempt:03d}/rank-{rank:03d}.jsonl"
        lines = path.read_bytes().split(b"\n")
        for i, raw in enumerate(lines):
            if raw and json.loads(raw)["global_step"] == step:
                data = json.loads(raw)
                change(data)
                ids = data["sample_ids"]
                data["sample_ids_count"] = data["local_batch"] = len(ids)
                data["sample_ids_hash"] = semantics.format_hash(semantics.ids_hash(ids))
                lines[i] = json.dumps(data, separators=(",", ":")).encode()
                break
        else:
            raise SystemExit(f"{path}: no record of step {step}")
        path.write_bytes(b"\n".join(lines))

    return damage


def _edit_restored(attempt: int, change: Callable[[dict[str, Any]], None]
                   ) -> Callable[[Path], None]:
    """Change what ``attempt`` says it restored (its ``restored.json``)."""
    return _edit_json(f"logs/attempt-{attempt:03d}/restored.json", change)


def _take_from_rank0(root: Path) -> None:
    """Rank 1 of attempt 0 consumes one of rank 0's samples of step 2 instead of its own."""
    rank0 = root / "logs/attempt-000/rank-000.jsonl"
    theirs = next(json.loads(raw) for raw in rank0.read_bytes().split(b"\n")
                  if raw and json.loads(raw)["global_step"] == 2)["sample_ids"]

    def change(data: dict[str, Any]) -> None:
        data["sample_ids"] = [theirs[0], *data["sample_ids"][1:]]

    _edit_record(0, 1, 2, change)(root)


def _rename_peer(root: Path) -> None:
    """From step 8 on, rank 1 of attempt 1 (DP 1 x TP 2) names tp_rank 0, rank 0's place, while
    still consuming the same shard: its coordinates changed within the attempt."""
    path = root / "logs/attempt-001/rank-001.jsonl"
    lines = path.read_bytes().split(b"\n")
    for i, raw in enumerate(lines):
        if raw and json.loads(raw)["global_step"] >= 8:
            data = json.loads(raw)
            data["tp_rank"] = 0
            lines[i] = json.dumps(data, separators=(",", ":")).encode()
    path.write_bytes(b"\n".join(lines))


def _empty_logs(root: Path) -> None:
    for path in root.glob("logs/*/rank-*.jsonl"):
        path.write_bytes(b"")


CASES: list[Case] = [
    # --- benign: these must PASS ---------------------------------------------------------
    Case(name="pass-single-attempt", verdict="PASS",
         description="one attempt of 2 ranks, no failure, full sample IDs",
         spec=dict(IDS, world_sizes=(2,), fail_at=())),
    Case(name="pass-replayed-steps", verdict="PASS",
         description="two failures; ranks logged steps past the checkpoint the next attempt "
                     "resumed from (replayed work, not progress)",
         spec=dict(IDS, world_sizes=(2,), chaos=8, torn=False)),
    Case(name="pass-torn-tail", verdict="PASS",
         description="a crashed attempt's logs end with torn lines (a warning, not an error)",
         spec=dict(IDS, chaos=2)),
    Case(name="pass-elastic-2-to-1", verdict="PASS",
         description="resume at world size 1 after 2 ranks",
         spec=dict(IDS, world_sizes=(2, 1), fail_at=(9,))),
    Case(name="pass-elastic-1-to-2", verdict="PASS",
         description="resume at world size 2 after 1 rank",
         spec=dict(IDS, world_sizes=(1, 2), fail_at=(9,))),
    Case(name="pass-hash-only", verdict="PASS",
         description="hash-only logs (count + multiset hash per shard), world sizes 4, 2, 4",
         spec=dict(HASH, world_sizes=(4, 2, 4))),
    Case(name="pass-lost-overlapped-write", verdict="PASS",
         description="overlapped checkpoint at the failure step never became durable: the next "
                     "attempt resumes from the one before",
         spec=dict(IDS, strategy="overlapped", fail_at=(8, 17), chaos=0)),
    Case(name="pass-fresh-restart", verdict="PASS",
         description="failure before the first checkpoint: the next attempt starts at step 0",
         spec=dict(IDS, ckpt_every=0, strategy="none", fail_at=(5,), world_sizes=(2, 1))),
    Case(name="pass-mesh-dp-change", verdict="PASS",
         description="a mesh run whose data-parallel degree changes at each resume (DP 2 x TP "
                     "2, DP 1 x TP 2, DP 4 x TP 1): tensor-parallel peers share their shard",
         spec=MESH),
    # --- one anomaly kind each (with what it necessarily brings along) --------------------
    Case(name="resume-skipped-step", verdict="FAIL", mutation="skip_step_at_resume",
         kinds=frozenset({"resume_mismatch", "missing_step"}),
         description="a resumed attempt starts one step late: the skipped step is missing",
         spec=HASH),
    Case(name="resume-repeated-step", verdict="FAIL", mutation="repeat_step_at_resume",
         kinds=frozenset({"resume_mismatch", "duplicate_step"}),
         description="a resumed attempt runs its checkpoint's step again: committed twice",
         spec=HASH),
    Case(name="unknown-checkpoint", verdict="FAIL", mutation="drop_checkpoint_event",
         kinds=frozenset({"unknown_checkpoint"}),
         description="the checkpoint an attempt resumed from was never recorded",
         spec=HASH),
    Case(name="missing-step", verdict="FAIL", mutation="truncate_final_attempt",
         kinds=frozenset({"missing_step"}),
         description="the final attempt stops before the target step",
         spec=HASH),
    Case(name="extra-step", verdict="FAIL", mutation="extra_step",
         kinds=frozenset({"extra_step"}),
         description="the final attempt runs one step past the target",
         spec=HASH),
    Case(name="missing-record", verdict="FAIL", mutation="drop_record", seed=3,
         kinds=frozenset({"missing_record"}),
         description="one rank's record of a committed step is gone",
         spec=dict(HASH, world_sizes=(2,))),
    Case(name="duplicate-record", verdict="FAIL", mutation="repeat_record",
         kinds=frozenset({"duplicate_record"}),
         description="a rank logged a committed step twice",
         spec=HASH),
    Case(name="step-order", verdict="FAIL", mutation="reorder_records",
         kinds=frozenset({"step_order"}),
         description="two adjacent committed records swapped: the rank went backwards",
         spec=HASH),
    Case(name="misplaced-record", verdict="FAIL", mutation="rank_collision",
         kinds=frozenset({"misplaced_record"}),
         description="a record claims another rank than its file's (rank collision)",
         spec=HASH),
    Case(name="stray-rank-file", verdict="FAIL", mutation="stray_rank_file",
         kinds=frozenset({"misplaced_record"}),
         description="a log for a rank outside its attempt's world",
         spec=HASH),
    Case(name="world-size-mismatch", verdict="FAIL", mutation="wrong_world_size",
         kinds=frozenset({"world_size_mismatch"}),
         description="a record's world_size differs from its attempt's",
         spec=HASH),
    Case(name="wrong-cursor", verdict="FAIL", mutation="wrong_cursor",
         kinds=frozenset({"wrong_cursor"}),
         description="a record's cursor_step is not global_step mod S",
         spec=HASH),
    Case(name="shard-mismatch-hash", verdict="FAIL", mutation="swap_shards",
         kinds=frozenset({"shard_mismatch"}),
         description="two steps of an epoch swapped their shards (hash-only logs)",
         spec=HASH),
    Case(name="shard-mismatch-ids", verdict="FAIL", mutation="swap_ids",
         kinds=frozenset({"shard_mismatch"}),
         description="one sample swapped between two steps of an epoch: every epoch still has "
                     "each sample once, but two steps consumed the wrong window",
         spec=IDS),
    Case(name="hash-mismatch", verdict="FAIL", mutation="tamper_hash",
         kinds=frozenset({"hash_mismatch"}),
         description="a record's hash does not describe its own sample IDs",
         spec=IDS),
    Case(name="duplicate-sample", verdict="FAIL", mutation="duplicate_id",
         kinds=frozenset({"duplicate_sample", "missing_sample", "shard_mismatch"}),
         description="a step consumed a sample another step of the epoch consumed, instead of "
                     "one of its own",
         spec=IDS),
    Case(name="missing-sample", verdict="FAIL", mutation="drop_record", seed=3,
         kinds=frozenset({"missing_record", "missing_sample"}),
         description="a lost record: its samples were never consumed",
         spec=dict(IDS, world_sizes=(2,))),
    Case(name="extra-sample", verdict="FAIL", mutation="out_of_range_id",
         kinds=frozenset({"extra_sample", "missing_sample", "shard_mismatch"}),
         description="a step consumed a sample ID outside the dataset instead of one of its own",
         spec=IDS),
    # --- unfinished runs: a stop, a job in progress, a supervisor that gave up --------------
    Case(name="unfinished-missing-record", verdict="FAIL", mutation="drop_record", seed=6,
         kinds=frozenset({"missing_record"}),
         unfinished=dict(status="stopped", durable_step=17, committed_steps=18),
         description="a stopped run whose committed prefix lacks a record: FAIL, not UNKNOWN",
         spec=dict(STOPPED, log_ids=False)),
    Case(name="unfinished-tentative-shard", verdict="FAIL", mutation="tamper_tentative_hash",
         kinds=frozenset({"shard_mismatch"}),
         unfinished=dict(status="stopped", durable_step=17, committed_steps=18),
         description="a stopped run: a record after the last durable checkpoint has a wrong "
                     "shard (tentative records are still checked record by record)",
         spec=dict(STOPPED, log_ids=False)),
    Case(name="unknown-stopped", verdict="UNKNOWN",
         unfinished=dict(status="stopped", durable_step=17, committed_steps=18),
         description="Ctrl-C mid-step: ranks with unequal last steps and a torn line after the "
                     "last durable checkpoint; steps 0..17 proved, 18..23 not committed yet",
         spec=dict(STOPPED, log_ids=True)),
    Case(name="unknown-stopped-before-checkpoint", verdict="UNKNOWN",
         unfinished=dict(status="stopped", durable_step=None, committed_steps=0),
         description="stopped before the first durable checkpoint: nothing committed yet",
         spec=dict(IDS, world_sizes=(2,), fail_at=(), stop_at=1, chaos=5)),
    Case(name="unknown-running", verdict="UNKNOWN",
         unfinished=dict(status="running", durable_step=20, committed_steps=21),
         description="a run still in progress (supervisor.json: running, no end time yet)",
         spec=dict(HASH, stop_at=21, end="running", chaos=9)),
    Case(name="unknown-gave-up", verdict="UNKNOWN",
         unfinished=dict(status="failed", durable_step=17, committed_steps=18),
         description="a third failure, after which the supervisor gave up at its restart "
                     "limit (status failed)",
         spec=dict(IDS, stop_at=19, end="failed", chaos=3)),
    # --- replay consistency ------------------------------------------------------------------
    Case(name="replay-divergence", verdict="FAIL", mutation="perturb_replayed_loss",
         kinds=frozenset({"replay_divergence"}),
         description="a failed attempt's loss of a step its successor ran again differs (as "
                     "if the resume had not restored the optimizer, scheduler or RNG)",
         spec=dict(IDS, world_sizes=(2,), chaos=8, torn=False)),
    # --- state digests: each resume restored what its checkpoint saved ------------------------
    Case(name="pass-state-digests", verdict="PASS",
         description="checkpoint events carry state digests and every resumed attempt's "
                     "restored.json matches them (world sizes 2, 1, 2)",
         spec=STATE),
    Case(name="state-digest-mismatch", verdict="FAIL", kinds=frozenset({"state_digest_mismatch"}),
         damage=_edit_restored(1, lambda d: d["digests"].update(optimizer="sha256:" + "0" * 64)),
         description="attempt 1 restored an optimizer state other than the one its checkpoint "
                     "saved",
         spec=STATE),
    Case(name="state-not-restored", verdict="FAIL", kinds=frozenset({"state_not_restored"}),
         damage=_edit_restored(2, lambda d: d["digests"].pop("scheduler")),
         description="attempt 2 did not restore the LR scheduler its checkpoint saved",
         spec=STATE),
    Case(name="state-previous-checkpoint", verdict="FAIL",
         kinds=frozenset({"state_digest_mismatch"}),
         damage=_edit_restored(2, lambda d: d.update(
             global_step=11, digests=state_digests(RunSpec(**STATE), 11))),
         description="attempt 2 loaded the checkpoint before the one it names (step 11, not 14)",
         spec=STATE),
    # --- an external sampler: audited without windows ----------------------------------------
    Case(name="pass-external-elastic", verdict="PASS",
         description="an external sampler (audit mode), world sizes 2, 1, 2 with two failures: "
                     "PASS with windows not checked",
         spec=EXT),
    Case(name="pass-external-hash-only", verdict="PASS",
         description="an external sampler with hash-only logs: each complete epoch's count and "
                     "summed hash equal the declared set's",
         spec=dict(EXT_HASH, world_sizes=(4, 2, 4))),
    Case(name="pass-external-drop-remainder", verdict="PASS",
         description="an external sampler that drops the last D - S·B samples of each epoch "
                     "(D = 42, B = 4, S = 10) and declares epoch_coverage drop_remainder",
         spec=dict(EXT, dataset_size=42, epoch_coverage="drop_remainder")),
    Case(name="pass-external-same-order", verdict="PASS", same_order="pass-external-elastic",
         description="--same-order: the same seed at world sizes 1, 2 with one failure consumes "
                     "the same global windows as pass-external-elastic",
         spec=dict(EXT, world_sizes=(1, 2), fail_at=(9,), chaos=1)),
    Case(name="external-order-mismatch", verdict="FAIL", same_order="pass-external-elastic",
         kinds=frozenset({"order_mismatch"}),
         description="--same-order: another seed consumes other windows from step 0 on (each "
                     "run alone is correct)",
         spec=dict(EXT, seed=12)),
    Case(name="external-padding-duplicates", verdict="FAIL",
         kinds=frozenset({"duplicate_sample"}),
         description="a sampler that pads each epoch by repeating samples (D = 42, B = 4, S = "
                     "11, as DistributedSampler(drop_last=False)) while declaring full coverage",
         spec=dict(EXT, dataset_size=42, steps_per_epoch=11, world_sizes=(2,), fail_at=())),
    Case(name="external-dropped-samples", verdict="FAIL",
         kinds=frozenset({"missing_sample"}),
         description="a sampler that drops the last 4 samples of each epoch (D = 44, S = 10) "
                     "while declaring epoch_coverage all",
         spec=dict(EXT, dataset_size=44, steps_per_epoch=10)),
    Case(name="external-duplicate-sample", verdict="FAIL", mutation="duplicate_id",
         kinds=frozenset({"duplicate_sample", "missing_sample"}),
         description="a step consumed a sample another step of the epoch consumed, instead of "
                     "one of its own (no window to compare: the epoch count finds it)",
         spec=EXT),
    Case(name="external-extra-sample", verdict="FAIL", mutation="out_of_range_id",
         kinds=frozenset({"extra_sample", "missing_sample"}),
         description="a step consumed an ID outside the declared set instead of one of its own",
         spec=EXT),
    Case(name="external-missing-record", verdict="FAIL", mutation="drop_record", seed=3,
         kinds=frozenset({"missing_record", "missing_sample"}),
         description="a lost record of a committed step: its samples were never consumed",
         spec=dict(EXT, world_sizes=(2,))),
    Case(name="external-resume-skipped-step", verdict="FAIL", mutation="skip_step_at_resume",
         kinds=frozenset({"resume_mismatch", "missing_step", "missing_sample"}),
         description="a resumed attempt starts one step late: the step and its samples are "
                     "missing",
         spec=EXT),
    Case(name="external-rank-overlap", verdict="FAIL", damage=_take_from_rank0,
         kinds=frozenset({"rank_overlap", "duplicate_sample", "missing_sample"}),
         description="at step 2, rank 1 consumed one of rank 0's samples instead of its own",
         spec=EXT),
    Case(name="external-global-batch", verdict="FAIL",
         damage=_edit_record(0, 0, 3, lambda d: d.update(sample_ids=d["sample_ids"][1:])),
         kinds=frozenset({"global_batch_mismatch", "missing_sample"}),
         description="at step 3, rank 0 consumed one sample fewer: the step's ranks consumed "
                     "B - 1 samples",
         spec=EXT),
    Case(name="external-epoch-hash", verdict="FAIL", mutation="drop_record", seed=3,
         kinds=frozenset({"missing_record", "epoch_hash_mismatch"}),
         description="hash-only logs: a lost record leaves its epoch one shard short of the "
                     "declared set's count and hash",
         spec=dict(EXT_HASH, world_sizes=(2,))),
    Case(name="unknown-external-hash-drop-remainder", verdict="UNKNOWN",
         description="an external sampler that may drop a remainder, with hash-only logs: "
                     "which samples an epoch leaves out is unknown",
         spec=dict(EXT_HASH, dataset_size=42, epoch_coverage="drop_remainder")),
    Case(name="tp-peer-mismatch", verdict="FAIL", mutation="tp_peers_disagree", seed=1,
         kinds=frozenset({"tp_peer_mismatch", "shard_mismatch"}),
         description="a mesh run: the tensor-parallel peer (tp_rank 1) of data-parallel rank 0 "
                     "consumed data-parallel rank 1's shard at step 2; a peer's copy is not "
                     "counted in the epoch, so only its shard and its peer disagree",
         spec=MESH),
    Case(name="mesh-mismatch", verdict="FAIL", damage=_rename_peer,
         kinds=frozenset({"mesh_mismatch"}),
         description="a mesh run: from step 8 on, rank 1 of attempt 1 (DP 1 x TP 2) names "
                     "tp_rank 0, the place of rank 0, consuming the same shard as before: the "
                     "mesh changed without a resume",
         spec=MESH),
    # --- the logs cannot support a verdict --------------------------------------------------
    Case(name="unknown-missing-manifest", verdict="UNKNOWN",
         description="run.json is missing", spec=HASH,
         damage=lambda root: (root / "run.json").unlink()),
    Case(name="unknown-torn-completed", verdict="UNKNOWN", mutation="tear_completed_line",
         description="a torn last line in an attempt that completed", spec=HASH),
    Case(name="unknown-garbage-line", verdict="UNKNOWN", mutation="garbage_line", seed=1,
         description="a malformed line in the middle of a log", spec=HASH),
    Case(name="unknown-empty-lineage", verdict="UNKNOWN",
         description="every rank log is empty: nothing was checked", spec=HASH,
         damage=_empty_logs),
    Case(name="unknown-permutation", verdict="UNKNOWN",
         description="the run used another permutation than this verifier implements",
         spec=HASH, damage=_edit_json("run.json", lambda d: d.update(
             permutation={"algorithm": "torch-randperm", "version": 1}))),
]


def build(case: Case, target: Path) -> None:
    """Write ``target`` (the run) and ``target/expected.json``."""
    shutil.rmtree(target, ignore_errors=True)
    scratch = target.with_name(target.name + ".clean")
    shutil.rmtree(scratch, ignore_errors=True)
    generate_run(RunSpec(**case.spec), scratch)
    if case.mutation is not None:
        outcome = apply(case.mutation, scratch, target, random.Random(case.seed))
        if outcome is None:
            raise SystemExit(f"{case.name}: mutation {case.mutation} does not apply")
        where = outcome.where
    else:
        shutil.copytree(scratch, target)
        where = None
    shutil.rmtree(scratch)
    if case.damage is not None:
        case.damage(target)
    expected = {"verdict": case.verdict, "kinds": sorted(case.kinds),
                "description": case.description, "mutation": case.mutation, "where": where}
    if case.same_order is not None:
        expected["same_order"] = case.same_order
    if case.unfinished is not None:
        expected["unfinished"] = case.unfinished
    (target / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "fixtures/runs")
    root.mkdir(parents=True, exist_ok=True)
    for case in CASES:
        build(case, root / case.name)
        print(f"{case.name}: {case.verdict} {sorted(case.kinds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
