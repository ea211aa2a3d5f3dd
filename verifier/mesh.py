"""Meshes: which shard each rank of an attempt must have consumed, and tensor-parallel peers.

On a mesh (FSDP2, HSDP, tensor parallelism) a step's window is split over the data-parallel
ranks and the ranks that share a data-parallel coordinate consume the identical shard
(docs/semantics.md, "Meshes"). Step records name their coordinates (``dp_rank, dp_size,
tp_rank, tp_size``); records that name none are plain DDP (``dp_rank = rank``, ``DP = W``).

The layout of ranks on the mesh is the user's, so the verifier takes it from the records: before
an attempt's logs are streamed, the first record of each rank says where that rank sits
(:func:`attempt_mesh`). The claims must form one mesh — the same ``DP × TP = W`` for every rank,
``B % DP == 0``, coordinates in range, no two ranks at one place, all ranks or none naming
coordinates — else each offending rank is a ``mesh_mismatch`` witness. Every later record of the
rank must repeat its coordinates (a mesh changes only at a resume; the per-record check is in
:mod:`verifier.windows`) and consume the shard of its data-parallel coordinate.

Tensor-parallel peers are held to identical samples (:class:`TpPeers`): a record whose samples
differ from its shard is remembered, and after the scan every group of peers of a committed step
in which two records disagree is a ``tp_peer_mismatch`` with both records as its witness. Only
peers with tensor-parallel coordinate 0 count towards the per-epoch sample coverage and the
global loss (a peer's copy of the same shard is not a second consumption).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract.runformat import MAX_LINE_BYTES, loads, open_regular
from verifier.anomalies import Anomaly, AnomalySink, Location
from verifier.coverage import StepRuns

__all__ = ["MESH_KEYS", "RankPlace", "AttemptMesh", "attempt_mesh", "first_record", "TpPeers"]

MESH_KEYS = ("dp_rank", "dp_size", "tp_rank", "tp_size")
"""A step record's mesh fields, in this order wherever they travel as a tuple."""

Coords = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class RankPlace:
    """What one rank's records of an attempt must say about the mesh, and which shard it eats."""

    fields: Coords | None
    """The mesh fields every record of the rank must carry (None: records name none)."""
    shard_rank: int
    """The data-parallel coordinate whose slice of the window the rank consumes."""
    shard_world: int
    """The data-parallel degree (slices per window)."""
    local_batch: int | None
    """``B / DP`` (None: no exact shard exists, reported as an anomaly)."""
    primary: bool
    """Tensor-parallel coordinate 0: its records count samples and the global loss."""


@dataclass(frozen=True, slots=True)
class AttemptMesh:
    """The mesh one attempt ran on, as its ranks' first records say."""

    attempt: int
    world_size: int
    dp_size: int
    tp_size: int
    places: Mapping[int, RankPlace]

    def place(self, rank: int) -> RankPlace:
        return self.places[rank]


def first_record(path: Path, root: Path | None) -> dict[str, Any] | None:
    """The first complete line of a rank log as a JSON object, or None (no line, unreadable,
    not an object): the full reader reports any defect with its line."""
    try:
        fd = open_regular(path, root=root)
    except OSError:
        return None
    try:
        data = b""
        while b"\n" not in data and len(data) <= MAX_LINE_BYTES:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            data += chunk
    finally:
        os.close(fd)
    line, newline, _ = data.partition(b"\n")
    if not newline:
        return None
    try:
        value = loads(line)
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def _claim(record: Mapping[str, Any] | None) -> Coords | str | None:
    """A record's mesh fields: the four values; None when it names none; ``"partial"`` when it
    names only some; ``"invalid"`` when one is not a valid integer (the record reader refutes
    that record: its schema error, not a mesh witness)."""
    if record is None or not any(k in record for k in MESH_KEYS):
        return None
    given = [record[k] for k in MESH_KEYS if k in record]
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in given):
        return "invalid"
    if len(given) < len(MESH_KEYS):
        return "partial"
    return given[0], given[1], given[2], given[3]


def attempt_mesh(*, attempt: int, world_size: int, global_batch: int,
                 firsts: Mapping[int, Mapping[str, Any] | None],
                 file_of: Callable[[int], str], sink: AnomalySink) -> AttemptMesh | None:
    """The mesh of ``attempt`` from the first record of each of its ranks ``0..W-1``
    (``firsts``; None where a rank has no readable record), or None when no rank names mesh
    coordinates (plain DDP). Claims that do not form one mesh become ``mesh_mismatch``."""
    w, b = world_size, global_batch
    claims = {r: _claim(firsts.get(r)) for r in range(w)}
    named = {r: c for r, c in claims.items() if isinstance(c, tuple)}
    if not named and "partial" not in claims.values():
        return None  # plain DDP (an invalid value is the reader's schema error)
    ref_rank = min(named) if named else None
    ref = named[ref_rank] if ref_rank is not None else None
    dp_size, tp_size = (ref[1], ref[3]) if ref is not None else (w, 1)
    taken: dict[tuple[int, int], int] = {}
    places: dict[int, RankPlace] = {}

    def witness(rank: int, expected: str, actual: str, reason: str, **evidence: Any) -> None:
        related: tuple[Location, ...] = ()
        step = (firsts.get(rank) or {}).get("global_step")
        if "other" in evidence:
            related = (Location(file=file_of(evidence["other"]), line=1, attempt=attempt,
                                rank=evidence["other"]),)
        sink.add(Anomaly(kind="mesh_mismatch", file=file_of(rank), line=1, attempt=attempt,
                         step=step if isinstance(step, int) else None, rank=rank,
                         expected=expected, actual=actual, related=related,
                         evidence={"reason": reason, "world_size": w, **evidence}))

    for rank in range(w):
        said = claims[rank]
        record = firsts.get(rank)
        fields: Coords | None
        if record is None or said == "invalid":
            # No readable first record (the reader reports the file) or one the reader
            # refutes: hold the rank to the default layout of the attempt's mesh.
            tp = tp_size if w % tp_size == 0 else 1
            claim: Coords = (rank // tp, w // tp, rank % tp, tp)
            fields = claim if ref is not None else None
            record = None
        elif isinstance(said, tuple):
            claim = fields = said
        else:
            witness(rank, "all four of dp_rank, dp_size, tp_rank, tp_size"
                    + (f" (rank {ref_rank} names dp_size {dp_size}, tp_size {tp_size})"
                       if ref is not None else ""),
                    "some" if said == "partial" else "none", str(said or "unnamed"),
                    reference=ref_rank)
            places[rank] = RankPlace(fields=None, shard_rank=rank, shard_world=w,
                                     local_batch=b // w if b % w == 0 else None, primary=True)
            continue
        d, dp, t, tp = claim
        sizes_ok = (dp, tp) == (dp_size, tp_size)
        if record is not None and not sizes_ok:
            witness(rank, f"dp_size {dp_size}, tp_size {tp_size} (as rank {ref_rank})",
                    f"dp_size {dp}, tp_size {tp}", "sizes", reference=ref_rank,
                    says=list(claim))
        elif record is not None and dp * tp != w:
            witness(rank, f"DP x TP = {w} (the attempt's world size)",
                    f"DP {dp} x TP {tp} = {dp * tp}", "product", says=list(claim))
        elif record is not None and b % dp:
            witness(rank, f"a data-parallel size dividing the global batch {b}",
                    f"dp_size {dp}", "batch", says=list(claim), global_batch=b)
        elif record is not None and (d >= dp or t >= tp):
            witness(rank, f"dp_rank < {dp}, tp_rank < {tp}", f"dp_rank {d}, tp_rank {t}",
                    "range", says=list(claim))
        elif (d, t) in taken and record is not None:
            witness(rank, "a place of its own on the mesh",
                    f"dp_rank {d}, tp_rank {t}, as rank {taken[(d, t)]}", "collision",
                    other=taken[(d, t)], says=list(claim))
        valid = dp > 0 and b % dp == 0 and d < dp and t < tp
        if record is not None and valid and sizes_ok and dp * tp == w:
            taken.setdefault((d, t), rank)  # only a fitting claim holds its place
        places[rank] = RankPlace(fields=fields, shard_rank=d if valid else rank,
                                 shard_world=dp if valid else w,
                                 local_batch=b // dp if valid else None,
                                 primary=t == 0)
    return AttemptMesh(attempt=attempt, world_size=w, dp_size=dp_size, tp_size=tp_size,
                       places=places)


@dataclass(slots=True)
class _Seen:
    rank: int
    count: int
    digest: int
    file: str
    line: int


@dataclass(slots=True)
class TpPeers:
    """Tensor-parallel peers that consumed other samples than their shard, per (attempt, step,
    data-parallel coordinate); judged after the scan against the peers that matched theirs."""

    deviants: dict[tuple[int, int, int], list[_Seen]] = field(default_factory=dict)

    def add(self, *, attempt: int, step: int, dp_rank: int, rank: int, count: int, digest: int,
            file: str, line: int) -> None:
        self.deviants.setdefault((attempt, step, dp_rank), []).append(
            _Seen(rank, count, digest, file, line))

    def judge(self, *, meshes: Mapping[int, AttemptMesh], ledgers: Mapping[tuple[int, int],
              StepRuns], files: Mapping[tuple[int, int], str], sink: AnomalySink) -> None:
        """One ``tp_peer_mismatch`` per group of peers in which two records disagree; a peer
        that did not deviate consumed its shard exactly (count ``B / DP``, the shard's hash)."""
        found: list[Anomaly] = []
        total = 0
        for (k, step, d), seen in sorted(self.deviants.items(), key=lambda kv: kv[0]):
            mesh = meshes.get(k)
            if mesh is None or mesh.tp_size < 2:
                continue
            peers = sorted(r for r, p in mesh.places.items()
                           if p.fields is not None and p.shard_rank == d)
            by_rank = {s.rank: s for s in seen}
            values: list[tuple[int, tuple[int, int] | None, str, int]] = []
            for r in peers:
                if r in by_rank:
                    s = by_rank[r]
                    values.append((r, (s.count, s.digest), s.file, s.line))
                    continue
                ledger = ledgers.get((k, r))
                line = ledger.line_of(step) if ledger is not None else None
                if line is not None:
                    values.append((r, None, files[(k, r)], line))  # None: its shard, exactly
            pair = next(((a, c) for i, a in enumerate(values) for c in values[i + 1:]
                         if a[1] != c[1]), None)
            if pair is None:
                continue
            total += 1
            if len(found) >= sink.wants("tp_peer_mismatch"):
                continue
            a, c = pair
            first, second = (a, c) if a[1] is not None else (c, a)
            found.append(Anomaly(
                kind="tp_peer_mismatch", file=first[2], line=first[3], attempt=k, step=step,
                rank=first[0],
                related=(Location(file=second[2], line=second[3], attempt=k, step=step,
                                  rank=second[0]),),
                evidence={"dp_rank": d, "tp_size": mesh.tp_size, "peer": second[0],
                          "says": list(first[1]) if first[1] is not None else None,
                          "peer_says": list(second[1]) if second[1] is not None else None}))
        sink.add_many("tp_peer_mismatch", total, found)
