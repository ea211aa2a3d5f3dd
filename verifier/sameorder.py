"""``--same-order RUN2``: two runs that should consume the same windows, compared step by step.

Two runs of the same seed and data — at other world sizes, or with other failures — must
consume the same global window at every committed step: that is what makes a resume at another
world size invisible to training. The audit of an external sampler cannot know the windows, but
it can hold two runs to each other. Each run's committed step ``g`` is reduced to the count and
multiset hash of its global window (the ranks' hashes summed; the hash is additive, so the world
size does not matter); the first step where they differ is the witness, shown as the ID sets'
difference when both runs log IDs.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import JsonlReader, StepRecord
from verifier.anomalies import Anomaly, Location, Note
from verifier.errors import Unusable
from verifier.lineage import lineage_of
from verifier.result import RunResult, SameOrder
from verifier.schema import read_inputs

__all__ = ["compare_order"]


def _end(run: RunResult) -> int:
    """Steps 0..end-1 are the run's committed steps (its prefix when unfinished)."""
    if run.unfinished is not None:
        return run.unfinished.committed_steps
    return int(run.checked.get("target_steps", 0))


def compare_order(run: RunResult, other: RunResult) -> RunResult:
    """``run`` with the comparison against ``other`` added (an ``order_mismatch`` is a FAIL)."""
    notes: list[Note] = []
    if other.verdict != "PASS":
        notes.append(Note(kind="same_order",
                          message=f"the --same-order run {other.path} is {other.verdict} itself; "
                                  "the comparison covers its committed steps only"))
    mine, theirs = run.series, other.series
    if (mine is None or theirs is None or mine.window_hash is None or mine.window_count is None
            or theirs.window_hash is None or theirs.window_count is None):
        notes.append(Note(kind="same_order",
                          message=f"cannot compare the order with {other.path}: "
                                  + ("this run's" if mine is None or mine.window_hash is None
                                     else "its") + " logs could not be read"))
        return replace(run, warnings=(*run.warnings, *notes))
    n = min(_end(run), _end(other), mine.window_hash.size, theirs.window_hash.size)
    differ = np.flatnonzero((mine.window_hash[:n] != theirs.window_hash[:n])
                            | (mine.window_count[:n] != theirs.window_count[:n]))
    by_ids = bool(run.log_ids and other.log_ids)
    first = int(differ[0]) if differ.size else None
    summary = SameOrder(other=other.path, steps_compared=n, by_ids=by_ids,
                        first_difference=first)
    if first is None:
        return replace(run, same_order=summary, warnings=(*run.warnings, *notes))
    anomaly = _witness(run, other, first, int(differ.size),
                       (int(mine.window_count[first]), int(mine.window_hash[first])),
                       (int(theirs.window_count[first]), int(theirs.window_hash[first])))
    counts = dict(run.anomaly_counts)
    counts["order_mismatch"] = int(differ.size)
    return replace(run, verdict="FAIL", anomalies=(*run.anomalies, anomaly),
                   anomaly_counts=counts, same_order=summary,
                   warnings=(*run.warnings, *notes))


def _witness(run: RunResult, other: RunResult, step: int, total: int,
             mine: tuple[int, int], theirs: tuple[int, int]) -> Anomaly:
    here = _records_of(Path(run.path), step)
    there = _records_of(Path(other.path), step)
    ids_here = _ids(here)
    ids_there = _ids(there)
    only_here = only_there = None
    sample_ids: tuple[int, ...] = ()
    if ids_here is not None and ids_there is not None:
        only_here = sorted(ids_here - ids_there)
        only_there = sorted(ids_there - ids_here)
        sample_ids = tuple((only_here or only_there)[:8])
    head = here[0] if here else None
    # Absolute: the report joins a witness's files to the run's own path, and a relative path
    # of the other run would land under it.
    related = tuple(Location(file=str(Path(other.path).resolve() / loc.file) if loc.file else None,
                             line=loc.line, attempt=loc.attempt, step=step, rank=loc.rank)
                    for loc, _ in there[:1])
    return Anomaly(
        kind="order_mismatch", file=head[0].file if head else None,
        line=head[0].line if head else None, attempt=head[0].attempt if head else None,
        step=step, rank=head[0].rank if head else None, count=total, sample_ids=sample_ids,
        evidence={"other": other.path, "only_here": only_here, "only_there": only_there,
                  "count": mine[0], "hash": mine[1], "other_count": theirs[0],
                  "other_hash": theirs[1]},
        expected=f"{theirs[0]} IDs, hash {semantics.format_hash(theirs[1])} (as in "
                 f"{other.path})",
        actual=f"{mine[0]} IDs, hash {semantics.format_hash(mine[1])}",
        related=related)


def _records_of(root: Path, step: int) -> list[tuple[Location, list[int] | None]]:
    """The committed records of ``step`` (one per rank), with their IDs when logged."""
    try:
        inputs = read_inputs(root)
    except Unusable:
        return []
    plan = next((p for p in lineage_of(inputs).chain if p.committed(step)), None)
    if plan is None:
        return []
    out: list[tuple[Location, list[int] | None]] = []
    for rank, path in inputs.paths.rank_logs(plan.attempt).items():
        try:
            for line, data in JsonlReader(path, StepRecord, torn_tail_ok=True).raw():
                if isinstance(data, dict) and data.get("global_step") == step:
                    ids = data.get("sample_ids")
                    out.append((Location(file=inputs.rel(path), line=line,
                                         attempt=plan.attempt, step=step, rank=rank),
                                ids if isinstance(ids, list) else None))
                    break
        except RunFormatError:
            continue
    return out


def _ids(records: list[tuple[Location, list[int] | None]]) -> set[int] | None:
    if not records or any(ids is None for _, ids in records):
        return None
    return {int(i) for _, ids in records for i in ids or () if isinstance(i, int)}
