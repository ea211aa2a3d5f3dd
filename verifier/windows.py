"""Each record against the window it should have consumed (records that missed the fast path).

The expected shard of ``(step, rank, W)`` comes only from :mod:`ecrl.contract.semantics`
(:func:`~ecrl.contract.semantics.shard_block`, :func:`~ecrl.contract.semantics.shard_hashes`,
:func:`~ecrl.contract.semantics.ids_hashes`), computed for a whole batch of records at once.
Records whose prefix the scanner already proved (:attr:`verifier._scan.Batch.fast`) never come here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from verifier._scan import Batch
from verifier.anomalies import Anomaly, AnomalySink
from verifier.mesh import TpPeers

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
    shard_rank: int | None = None
    """On a mesh: the data-parallel coordinate whose shard the rank consumes (None: ``rank``)."""
    shard_world: int | None = None
    """On a mesh: the data-parallel degree (None: ``world_size``)."""
    mesh: tuple[int, int, int, int] | None = None
    """On a mesh: the ``(dp_rank, dp_size, tp_rank, tp_size)`` every record must name (None:
    records name none)."""
    tp_peers: TpPeers | None = None
    """On a mesh: where records that consumed other samples than their shard are remembered,
    for the tensor-parallel peer check."""




def _check_mesh(batch: Batch, rows: npt.NDArray[np.intp], ctx: RecordContext,
                sink: AnomalySink, record: Callable[..., Anomaly]) -> None:
    """Every record names its rank's mesh coordinates (or, off a mesh, none): a mesh changes
    only at a resume."""
    said = batch.mesh[rows] if batch.mesh is not None else np.full((rows.size, 4), -1)
    want = np.array(ctx.mesh if ctx.mesh is not None else (-1, -1, -1, -1), dtype=np.int64)
    bad = np.flatnonzero((said != want[None, :]).any(axis=1))

    def shown(values: Sequence[int]) -> str:
        if all(v < 0 for v in values):
            return "no mesh coordinates"
        return ", ".join(f"{k} {'-' if v < 0 else v}" for k, v in zip(
            ("dp_rank", "dp_size", "tp_rank", "tp_size"), values, strict=True))

    sink.add_many("mesh_mismatch", int(bad.size), (
        record("mesh_mismatch", int(i),
               {"reason": "changed", "says": said[i].tolist(),
                "mesh": list(ctx.mesh) if ctx.mesh is not None else None,
                "world_size": ctx.world_size},
               expected=shown(want.tolist()), actual=shown(said[i].tolist())) for i in bad))


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

    def record(kind: str, i: int, evidence: dict[str, object], **extra: object) -> Anomaly:
        """A witness at row ``i``; its explainer writes the message from ``evidence``."""
        return Anomaly(kind=kind, file=ctx.file, line=int(lines[i]), attempt=ctx.attempt,
                       step=int(steps[i]), rank=ctx.rank,
                       evidence={**evidence, "tentative": ctx.tentative},
                       **extra)  # type: ignore[arg-type]

    attempt = batch.column("attempt")[rows]
    rank = batch.column("rank")[rows]
    bad = np.flatnonzero((attempt != ctx.attempt) | (rank != ctx.rank))
    sink.add_many("misplaced_record", int(bad.size), (
        record("misplaced_record", int(i), {"claims": (int(attempt[i]), int(rank[i]))},
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
               {"says": (int(world[i]), int(local[i])), "world_size": ctx.world_size,
                "local_batch": ctx.local_batch},
               expected=f"world_size {ctx.world_size}, local_batch {ctx.local_batch}",
               actual=f"world_size {world[i]}, local_batch {local[i]}") for i in bad))

    if batch.mesh is not None or ctx.mesh is not None:
        _check_mesh(batch, rows, ctx, sink, record)

    s = ctx.geometry.steps_per_epoch
    epoch = batch.column("epoch")[rows]
    cursor = batch.column("cursor_step")[rows]
    bad = np.flatnonzero((epoch != steps // s) | (cursor != steps % s))
    sink.add_many("wrong_cursor", int(bad.size), (
        record("wrong_cursor", int(i),
               {"steps_per_epoch": s, "says": (int(epoch[i]), int(cursor[i]))},
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
               {"hash": int(hashes[i]), "count": int(count[i]), "ids_hash": own[i][0],
                "ids_count": own[i][1]},
               expected=f"{semantics.format_hash(own[i][0])} ({own[i][1]} IDs)",
               actual=f"{semantics.format_hash(int(hashes[i]))} ({count[i]} IDs)")
        for i in bad_h))

    if ctx.audit:
        return int(rows.size), 0  # audited record by record; the samples are counted later
    if ctx.local_batch is None or not 0 <= ctx.rank < ctx.world_size:
        return 0, 0
    shard_rank = ctx.rank if ctx.shard_rank is None else ctx.shard_rank
    shard_world = ctx.world_size if ctx.shard_world is None else ctx.shard_world
    if not 0 <= shard_rank < shard_world:
        return 0, 0
    expected = semantics.shard_block(ctx.geometry, ctx.seed, steps, shard_rank, shard_world)
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
            if ctx.tp_peers is not None:
                ctx.tp_peers.add(attempt=ctx.attempt, step=int(steps[i]), dp_rank=shard_rank,
                                 rank=ctx.rank, count=int(count[i]), digest=int(hashes[i]),
                                 file=ctx.file, line=int(lines[i]))
            if len(found) < sink.wants("shard_mismatch"):
                found.append(record(
                    "shard_mismatch", i,
                    {"count": int(count[i]), "hash": int(hashes[i]),
                     "local_batch": ctx.local_batch, "expected_hash": int(expected_hash[i])},
                    epoch=int(steps[i] // s), sample_ids=tuple(expected[i][:_SHOW].tolist()),
                    expected=f"{ctx.local_batch} IDs, hash "
                             f"{semantics.format_hash(int(expected_hash[i]))}",
                    actual=f"{count[i]} IDs, hash {semantics.format_hash(int(hashes[i]))}"))
            continue
        if ids.size == expected[i].size and np.array_equal(np.sort(ids), np.sort(expected[i])):
            reordered += not np.array_equal(ids, expected[i])
            continue
        mismatches += 1
        if ctx.tp_peers is not None:
            ctx.tp_peers.add(attempt=ctx.attempt, step=int(steps[i]), dp_rank=shard_rank,
                             rank=ctx.rank, count=int(ids.size), digest=own[i][0],
                             file=ctx.file, line=int(lines[i]))
        if len(found) < sink.wants("shard_mismatch"):
            got_set, want_set = set(ids.tolist()), set(expected[i].tolist())
            unexpected = sorted(got_set - want_set)
            absent = sorted(want_set - got_set)
            found.append(record(
                "shard_mismatch", i,
                {"ids": ids.tolist(), "shard": expected[i].tolist(), "unexpected": unexpected,
                 "absent": absent},
                epoch=int(steps[i] // s), sample_ids=tuple(unexpected[:_SHOW] or absent[:_SHOW]),
                expected=format_ids(expected[i], 32), actual=format_ids(ids, 32)))
    sink.add_many("shard_mismatch", mismatches, found)
    return int(rows.size), reordered
