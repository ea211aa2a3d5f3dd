"""State digests: did each resume load every saved object, exactly as it was saved?

A checkpoint event (``checkpoint_rank0.jsonl``) may carry ``"digests": {object: "sha256:…"}``,
the digest of each saved object's state (model, optimizer, scheduler, sampler, RNG states, user
objects) at save time; a resumed attempt may write ``logs/attempt-NNN/restored.json`` —
``{"schema_version": 1, "global_step": c, "digests": {object: "sha256:…"}}`` — the digests of
the state as loaded (docs/run-format.md). Per resume whose checkpoint recorded digests, the
verifier proves that the state loaded is the checkpoint it resumed from (``global_step``), that
every saved object was restored (``state_not_restored``) and that each restored digest equals
the saved one (``state_digest_mismatch``). Only these small files are read.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from ecrl.contract.runformat import loads, read_small_file
from verifier.anomalies import Anomaly, AnomalySink, Location, Note
from verifier.lineage import Lineage
from verifier.result import StateCheck
from verifier.schema import CheckpointRecord, RunInputs

__all__ = ["check_state", "RESTORED"]

RESTORED = "restored.json"
"""Written by a resumed attempt into its log folder: the state as loaded."""

_RESTORED_LIMIT = 1 << 20
"""A few digests; a larger file was not written by ECRL."""


@dataclass(slots=True)
class _Tally:
    resumes: int = 0
    objects: int = 0
    unattested: list[int] = field(default_factory=list)
    undigested: list[int] = field(default_factory=list)
    strategies: set[str] = field(default_factory=set)
    matched: list[int] = field(default_factory=list)


def _saved(inputs: RunInputs, writer: int | None, step: int) -> CheckpointRecord | None:
    """The checkpoint event at ``step`` that the resume loaded (its writer's newest one)."""
    events = inputs.checkpoints.get(writer, ()) if writer is not None else ()
    found = [r for r in events if r.event.global_step == step]
    return found[-1] if found else None


def _digests(value: Any) -> dict[str, str] | None:
    if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str)
                                       for k, v in value.items()):
        return dict(value)
    return None


def check_state(inputs: RunInputs, lineage: Lineage, sink: AnomalySink, notes: list[Note],
                unknown: list[str]) -> StateCheck:
    """Judge every resume whose checkpoint recorded digests."""
    tally = _Tally()
    for plan in lineage.plans:
        c = plan.resumed_from
        if c is None:
            continue
        record = _saved(inputs, plan.writer, c)
        if record is None:
            continue
        saved = _digests(record.event.extra.get("digests"))
        if saved is None:
            tally.undigested.append(plan.attempt)
            tally.strategies.add(record.event.strategy)
            continue
        k = plan.attempt
        event_file = inputs.rel(inputs.paths.checkpoint_log(record.attempt))
        saved_at = Location(file=event_file, line=record.line, attempt=record.attempt, step=c)
        path = inputs.paths.attempt_dir(k) / RESTORED
        rel = inputs.rel(path)
        if not os.path.lexists(path):  # a link or FIFO is refused below, not absent
            tally.unattested.append(k)
            notes.append(Note(kind="state", file=rel,
                              message=f"attempt {k} resumed from a checkpoint with state digests "
                                      "but wrote no restored.json: its restore is not attested"))
            continue
        try:
            raw = read_small_file(path, limit=_RESTORED_LIMIT, root=inputs.root)
        except OSError as exc:
            unknown.append(f"{rel}: cannot read: {exc.strerror}")
            continue
        try:
            data = loads(raw)
        except Exception as exc:  # orjson.JSONDecodeError
            unknown.append(f"{rel}: not valid JSON ({exc})")
            continue
        restored = _digests(data.get("digests")) if isinstance(data, dict) else None
        step = data.get("global_step") if isinstance(data, dict) else None
        if not isinstance(data, dict) or data.get("schema_version") != 1 or restored is None \
                or not isinstance(step, int) or isinstance(step, bool):
            unknown.append(f"{rel}: expected {{\"schema_version\": 1, \"global_step\": int, "
                           "\"digests\": {object: digest}}; this verifier cannot read it")
            continue
        tally.resumes += 1
        if step != c:
            sink.add(Anomaly(kind="state_digest_mismatch", file=rel, attempt=k, step=c,
                             expected=f"the state of step {c}", actual=f"the state of step {step}",
                             related=(saved_at,),
                             evidence={"form": "step", "loaded_step": step}))
            continue
        differs = False
        for name in sorted(saved):
            tally.objects += 1
            if name not in restored:
                differs = True
                sink.add(Anomaly(kind="state_not_restored", file=rel, attempt=k, step=c,
                                 expected=f"{name} restored", actual="not restored",
                                 related=(saved_at,),
                                 evidence={"object": name, "saved": saved[name],
                                           "restored_objects": sorted(restored)}))
            elif restored[name] != saved[name]:
                differs = True
                sink.add(Anomaly(kind="state_digest_mismatch", file=rel, attempt=k, step=c,
                                 expected=saved[name], actual=restored[name],
                                 related=(saved_at,),
                                 evidence={"form": "object", "object": name,
                                           "saved": saved[name], "restored": restored[name]}))
        if not differs:
            tally.matched.append(k)
        extra = sorted(set(restored) - set(saved))
        if extra:
            notes.append(Note(kind="state", file=rel,
                              message=f"attempt {k} restored objects the checkpoint did not "
                                      f"save: {', '.join(extra)}"))
    return StateCheck(resumes_checked=tally.resumes, objects_compared=tally.objects,
                      unattested=tuple(tally.unattested), undigested=tuple(tally.undigested),
                      undigested_strategies=tuple(sorted(tally.strategies)),
                      matched=tuple(tally.matched))
