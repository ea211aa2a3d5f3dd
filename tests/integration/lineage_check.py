"""Reading a finished run back and checking it against ecrl.contract.semantics directly.

The verifier (``verifier/``) is built separately; these helpers are the runtime's own test oracle:
they rebuild the committed lineage from ``supervisor.json`` and the step logs and compare every
committed shard with :func:`ecrl.contract.semantics.shard`.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ecrl.contract import semantics
from ecrl.contract.runformat import (
    CheckpointEvent,
    JsonlReader,
    LatestPointer,
    RunManifest,
    RunPaths,
    StepRecord,
    SupervisorState,
    read_json_record,
)


@dataclass
class RunView:
    paths: RunPaths
    manifest: RunManifest
    state: SupervisorState
    records: dict[int, list[StepRecord]]
    """attempt -> every complete step record of every rank."""
    torn: list[str] = field(default_factory=list)

    @property
    def geometry(self) -> semantics.Geometry:
        return semantics.Geometry(dataset_size=self.manifest.dataset_size,
                                  global_batch=self.manifest.global_batch)

    def committed(self) -> list[StepRecord]:
        """Records of the committed lineage (ARCHITECTURE.md, "Committed lineage")."""
        attempts = self.state.attempts
        out: list[StepRecord] = []
        for i, a in enumerate(attempts):
            recs = self.records.get(a.attempt, [])
            if i + 1 < len(attempts):
                nxt = attempts[i + 1].resumed_from_step
                limit = -1 if nxt is None else nxt
                recs = [r for r in recs if r.global_step <= limit]
            out.extend(recs)
        return out

    def events(self) -> list[CheckpointEvent]:
        out = []
        for a in self.state.attempts:
            path = self.paths.checkpoint_log(a.attempt)
            if path.exists():
                out += [e for _, e in JsonlReader(path, CheckpointEvent,
                                                   torn_tail_ok=a.status != "completed")]
        return out

    def latest(self) -> LatestPointer | None:
        if not self.paths.latest.exists():
            return None
        return read_json_record(self.paths.latest, LatestPointer)

    def final_digest(self) -> str:
        return str(json.loads((self.paths.root / "final" / "summary.json").read_text())[
            "params_digest"])

    def losses(self, *, committed_only: bool = True) -> dict[tuple[int, int], float | None]:
        """(step, rank) -> loss; replayed records must agree with committed ones."""
        out: dict[tuple[int, int], float | None] = {}
        source = self.committed() if committed_only else [
            r for recs in self.records.values() for r in recs]
        for r in source:
            key = (r.global_step, r.rank)
            if key in out:
                assert out[key] == r.loss, f"step {key}: replay gave loss {r.loss}, not {out[key]}"
            out[key] = r.loss
        return out


def load_run(root: Path) -> RunView:
    paths = RunPaths.of(root)
    manifest = read_json_record(paths.manifest, RunManifest)
    state = read_json_record(paths.supervisor, SupervisorState)
    records: dict[int, list[StepRecord]] = {}
    torn: list[str] = []
    for a in state.attempts:
        recs: list[StepRecord] = []
        for _, path in paths.rank_logs(a.attempt).items():
            reader = JsonlReader(path, StepRecord, torn_tail_ok=a.status != "completed")
            recs += [r for _, r in reader]
            torn += [str(w) for w in reader.warnings]
        records[a.attempt] = recs
    return RunView(paths=paths, manifest=manifest, state=state, records=records, torn=torn)


def check_exactly_once(view: RunView) -> dict[str, Any]:
    """Every proof obligation of the committed lineage, asserted; returns a few counts."""
    m, geometry = view.manifest, view.geometry
    attempts = view.state.attempts
    # each resumed attempt starts right after the checkpoint it loaded
    for a in attempts:
        steps = sorted({r.global_step for r in view.records[a.attempt]})
        if steps:
            expected_first = 0 if a.resumed_from_step is None else a.resumed_from_step + 1
            assert steps[0] == expected_first, (a, steps[:3])
            assert a.first_step == expected_first
            assert steps == list(range(steps[0], steps[-1] + 1)), f"gap in attempt {a.attempt}"
    committed = view.committed()
    by_step: dict[int, list[StepRecord]] = defaultdict(list)
    for r in committed:
        by_step[r.global_step].append(r)
    assert sorted(by_step) == list(range(m.target_steps)), "committed steps are not 0..T-1"
    world_of = {a.attempt: a.world_size for a in attempts}
    per_epoch: dict[int, Counter[int]] = defaultdict(Counter)
    hashes_only = 0
    for g, recs in by_step.items():
        world = world_of[recs[0].attempt]
        assert len({r.attempt for r in recs}) == 1, f"step {g} committed by two attempts"
        assert sorted(r.rank for r in recs) == list(range(world)), f"step {g}: ranks {recs}"
        epoch, cursor = geometry.locate(g)
        for r in recs:
            assert (r.epoch, r.cursor_step) == (epoch, cursor)
            assert r.world_size == world and r.local_batch == m.global_batch // world
            expected = semantics.shard(geometry, m.seed, g, r.rank, world)
            assert r.sample_ids_count == expected.size
            assert r.sample_ids_hash == semantics.format_hash(semantics.ids_hash(expected)), \
                f"step {g} rank {r.rank}: hash differs from ecrl.contract.semantics"
            if m.log_ids:
                assert r.sample_ids is not None
                assert np.array_equal(np.asarray(r.sample_ids), expected), f"step {g} rank {r.rank}"
                per_epoch[epoch].update(r.sample_ids)
            else:
                assert r.sample_ids is None
                hashes_only += 1
    if m.log_ids:
        s = geometry.steps_per_epoch
        for epoch, counts in per_epoch.items():
            assert max(counts.values()) == 1, f"epoch {epoch}: duplicate sample"
            steps_in_epoch = len([g for g in by_step if g // s == epoch])
            expected_ids = set(semantics.permuted_positions(
                geometry, m.seed, epoch, 0, steps_in_epoch * m.global_batch).tolist())
            assert set(counts) == expected_ids, f"epoch {epoch}: missing or extra samples"
    return {"committed": len(committed), "epochs": len(per_epoch), "hash_checked": hashes_only}
