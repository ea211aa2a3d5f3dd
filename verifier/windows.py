"""Each record against the window it should have consumed (records that missed the fast path).

The expected shard of ``(step, rank, W)`` comes only from :mod:`ecrl.contract.semantics`
(:func:`~ecrl.contract.semantics.shard_block`, :func:`~ecrl.contract.semantics.shard_hashes`,
:func:`~ecrl.contract.semantics.ids_hashes`), computed for a whole batch of records at once.
Records whose prefix the scanner already proved (:attr:`verifier._scan.Batch.fast`) never come here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from verifier._scan import Batch
from verifier.anomalies import Anomaly, AnomalySink

__all__ = ["RecordContext", "check_records", "format_ids"]

_SHOW = 8


def format_ids(ids: npt.ArrayLike, limit: int = _SHOW) -> str:
    """``[3, 9, 12, … (+5)]``: a capped list for messages."""
    values = np.asarray(ids).ravel().tolist()
    shown = ", ".join(map(str, values[:limit]))
    more = f", … (+{len(values) - limit})" if len(values) > limit else ""
    return f"[{shown}{more}]"


@dataclass(frozen=True, kw_only=True, slots=True)
class RecordContext:
    """Where a batch comes from and what its records must say."""

    file: str
    attempt: int
    rank: int
    world_size: int
    local_batch: int | None
    """None when the world size does not divide the global batch (no shard exists)."""
    geometry: semantics.Geometry
    seed: int
    audit: bool = False
    """An external sampler's run: no window to compare with (only the record's own fields)."""
    tentative: bool = False
    """The rows are tentative records of an unfinished run (after its last durable checkpoint):
    judged the same, and their witnesses say so."""


_TENTATIVE = " (a tentative record: after the last durable checkpoint of an unfinished run)"


def check_records(batch: Batch, committed: npt.NDArray[np.bool_], ctx: RecordContext,
                  sink: AnomalySink) -> tuple[int, int]:
    """Judge the committed rows of a slow-path batch.

    Returns how many shards were compared, and how many logged their shard's IDs in another
    order (the same samples: not an anomaly). Only the rows of ``committed`` are judged: the
    committed lineage's, or an unfinished run's tentative records (``ctx.tentative``); replayed
    rows are not judged.
    """
    rows = np.flatnonzero(committed)
    if rows.size == 0:
        return 0, 0
    steps = batch.steps[rows]
    lines = batch.first_line + rows

    suffix = _TENTATIVE if ctx.tentative else ""

    def record(kind: str, i: int, message: str, **extra: object) -> Anomaly:
        return Anomaly(kind=kind, message=message + suffix, file=ctx.file, line=int(lines[i]),
                       attempt=ctx.attempt, step=int(steps[i]), rank=ctx.rank,
                       **extra)  # type: ignore[arg-type]

    attempt = batch.column("attempt")[rows]
    rank = batch.column("rank")[rows]
    bad = np.flatnonzero((attempt != ctx.attempt) | (rank != ctx.rank))
    sink.add_many("misplaced_record", int(bad.size), (
        record("misplaced_record", int(i),
               f"the record says attempt {attempt[i]}, rank {rank[i]}, but it is in the log of "
               f"attempt {ctx.attempt}, rank {ctx.rank}",
               expected=f"attempt {ctx.attempt}, rank {ctx.rank}",
               actual=f"attempt {attempt[i]}, rank {rank[i]}") for i in bad))

    world = batch.column("world_size")[rows]
    local = batch.column("local_batch")[rows]
    wrong = world != ctx.world_size
    if ctx.local_batch is not None:
        wrong |= local != ctx.local_batch
    bad = np.flatnonzero(wrong)
    sink.add_many("world_size_mismatch", int(bad.size), (
        record("world_size_mismatch", int(i),
               f"the record says world_size {world[i]}, local_batch {local[i]}; attempt "
               f"{ctx.attempt} ran with world size {ctx.world_size}"
               + (f" (local batch {ctx.local_batch})" if ctx.local_batch else ""),
               expected=f"world_size {ctx.world_size}, local_batch {ctx.local_batch}",
               actual=f"world_size {world[i]}, local_batch {local[i]}") for i in bad))

    s = ctx.geometry.steps_per_epoch
    epoch = batch.column("epoch")[rows]
    cursor = batch.column("cursor_step")[rows]
    bad = np.flatnonzero((epoch != steps // s) | (cursor != steps % s))
    sink.add_many("wrong_cursor", int(bad.size), (
        record("wrong_cursor", int(i),
               f"step {steps[i]} is (epoch {steps[i] // s}, cursor {steps[i] % s}) with "
               f"{s} steps per epoch; the record says (epoch {epoch[i]}, cursor {cursor[i]})",
               epoch=int(steps[i] // s),
               expected=f"epoch {steps[i] // s}, cursor_step {steps[i] % s}",
               actual=f"epoch {epoch[i]}, cursor_step {cursor[i]}") for i in bad))

    assert batch.hashes is not None
    count = batch.column("sample_ids_count")[rows]
    hashes = batch.hashes[rows]
    logged = [batch.ids[int(r)] for r in rows] if batch.ids is not None else [None] * rows.size

    # The recorded hash and count must describe the recorded IDs.
    own: dict[int, tuple[int, int]] = {
        i: (semantics.ids_hash(ids), int(ids.size)) for i, ids in enumerate(logged)
        if ids is not None}
    bad_h = [i for i, (h, n) in own.items() if int(hashes[i]) != h or int(count[i]) != n]
    sink.add_many("hash_mismatch", len(bad_h), (
        record("hash_mismatch", i,
               f"sample_ids_hash {semantics.format_hash(int(hashes[i]))} and count {count[i]} "
               f"do not describe the {own[i][1]} logged IDs, which hash to "
               f"{semantics.format_hash(own[i][0])}",
               expected=f"{semantics.format_hash(own[i][0])} ({own[i][1]} IDs)",
               actual=f"{semantics.format_hash(int(hashes[i]))} ({count[i]} IDs)")
        for i in bad_h))

    if ctx.audit:
        return int(rows.size), 0  # audited record by record; the samples are counted later
    if ctx.local_batch is None or not 0 <= ctx.rank < ctx.world_size:
        return 0, 0
    expected = semantics.shard_block(ctx.geometry, ctx.seed, steps, ctx.rank, ctx.world_size)
    expected_hash = semantics.ids_hashes(expected)
    found: list[Anomaly] = []
    mismatches = reordered = 0
    for i in range(rows.size):
        ids = logged[i]
        if ids is None:
            ok = int(count[i]) == ctx.local_batch and int(hashes[i]) == int(expected_hash[i])
            if ok:
                continue
            mismatches += 1
            if len(found) < sink.wants("shard_mismatch"):
                found.append(record(
                    "shard_mismatch", i,
                    f"rank {ctx.rank} at step {steps[i]} logged {count[i]} IDs hashing to "
                    f"{semantics.format_hash(int(hashes[i]))}; its shard is "
                    f"{ctx.local_batch} IDs hashing to "
                    f"{semantics.format_hash(int(expected_hash[i]))}",
                    epoch=int(steps[i] // s), sample_ids=tuple(expected[i][:_SHOW].tolist()),
                    expected=f"{ctx.local_batch} IDs, hash "
                             f"{semantics.format_hash(int(expected_hash[i]))}",
                    actual=f"{count[i]} IDs, hash {semantics.format_hash(int(hashes[i]))}"))
            continue
        if ids.size == expected[i].size and np.array_equal(np.sort(ids), np.sort(expected[i])):
            reordered += not np.array_equal(ids, expected[i])
            continue
        mismatches += 1
        if len(found) < sink.wants("shard_mismatch"):
            got_set, want_set = set(ids.tolist()), set(expected[i].tolist())
            unexpected = sorted(got_set - want_set)
            absent = sorted(want_set - got_set)
            found.append(record(
                "shard_mismatch", i,
                f"rank {ctx.rank} at step {steps[i]} consumed {format_ids(ids)} instead of its "
                f"shard {format_ids(expected[i])}: unexpected {format_ids(unexpected)}, absent "
                f"{format_ids(absent)}",
                epoch=int(steps[i] // s), sample_ids=tuple(unexpected[:_SHOW] or absent[:_SHOW]),
                expected=format_ids(expected[i], 32), actual=format_ids(ids, 32)))
    sink.add_many("shard_mismatch", mismatches, found)
    return int(rows.size), reordered
