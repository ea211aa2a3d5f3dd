"""Audit mode: what can be proved about a run whose sampler ECRL does not know.

When ``run.json`` names an external sampler (``{"kind": "external", ...}``), no step has a window
to compare with. What still has a definition is the data set: IDs ``0 .. D-1``. Over the committed
lineage (built exactly as for ECRL's own runs: resume points, missing and duplicated steps and
records) the audit proves, per epoch of the user's loop, that every declared ID was consumed
exactly once (``epoch_coverage: "all"``) or at most once (``"drop_remainder"``); per committed
step, that the ranks consumed disjoint samples, ``B`` in all. Hash-only logs are audited per epoch
through the additive multiset hash (``"all"`` only).

Only the steps whose ranks have not all been read yet are held (:class:`StepAudit`); an epoch's
sample counts are those of :class:`~verifier.coverage.SampleCoverage`, dropped once judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from verifier.anomalies import Anomaly, AnomalySink, Location
from verifier.coverage import EpochVerdict, SampleCoverage
from verifier.windows import format_ids

__all__ = ["AuditCoverage", "StepAudit", "EpochHashes", "declared_set_hash"]

_CHUNK = 1 << 20


class AuditCoverage(SampleCoverage):
    """Per-epoch counts of an external sampler's run: no window says which IDs a step takes, so
    a complete epoch must hold every declared ID (``all``) and any epoch at most once each."""

    def __init__(self, geometry: semantics.Geometry, target_steps: int, *,
                 require_all: bool) -> None:
        super().__init__(geometry, 0, target_steps)
        self.require_all = require_all

    def expected_mask(self, epoch: int) -> npt.NDArray[np.bool_]:
        """IDs the epoch must consume: all of them for a complete ``all`` epoch, else none
        (what is consumed is still held to "at most once")."""
        g = self.geometry
        steps = max(0, min(g.steps_per_epoch, self.target_steps - epoch * g.steps_per_epoch))
        complete = steps == g.steps_per_epoch
        return np.full(g.dataset_size, self.require_all and complete, dtype=bool)

    def finish(self, epoch: int) -> EpochVerdict | None:
        verdict = super().finish(epoch)
        if verdict is None:
            return None
        # Every in-range ID may be consumed (out-of-range IDs are reported record by record),
        # so nothing the epoch consumed is "extra" here.
        return EpochVerdict(epoch=verdict.epoch, steps=verdict.steps,
                            duplicates=verdict.duplicates, missing=verdict.missing,
                            extra=verdict.extra[:0],
                            counts=(verdict.counts[0], verdict.counts[1], 0))


@dataclass(slots=True)
class _Shard:
    count: int
    ids: npt.NDArray[np.int64] | None
    file: str
    line: int


@dataclass(slots=True)
class StepAudit:
    """Committed steps of an external run, judged once every rank's record is in: the ranks'
    counts sum to B and no two ranks consumed the same ID."""

    global_batch: int
    sink: AnomalySink
    pending: dict[tuple[int, int], dict[int, _Shard]] = field(default_factory=dict)
    steps_judged: int = 0

    def add(self, *, attempt: int, world_size: int, step: int, rank: int, count: int,
            ids: npt.NDArray[np.int64] | None, file: str, line: int) -> None:
        shards = self.pending.setdefault((attempt, step), {})
        shards.setdefault(rank, _Shard(count, ids, file, line))
        if len(shards) == world_size:
            del self.pending[(attempt, step)]
            self._judge(attempt, step, shards)

    def drop_attempt(self, attempt: int) -> None:
        """Forget the steps of ``attempt`` some rank never logged (missing_record says so)."""
        for key in [k for k in self.pending if k[0] == attempt]:
            del self.pending[key]

    def _judge(self, attempt: int, step: int, shards: dict[int, _Shard]) -> None:
        self.steps_judged += 1
        ranks = sorted(shards)
        total = sum(shards[r].count for r in ranks)
        first = shards[ranks[0]]
        where = [Location(file=shards[r].file, line=shards[r].line, attempt=attempt, step=step,
                          rank=r) for r in ranks]
        if total != self.global_batch:
            counts = ", ".join(f"rank {r}: {shards[r].count}" for r in ranks)
            self.sink.add(Anomaly(
                kind="global_batch_mismatch", file=first.file, line=first.line,
                attempt=attempt, step=step, rank=ranks[0],
                message=f"step {step} consumed {total} samples over its {len(ranks)} ranks "
                        f"({counts}); the global batch is {self.global_batch}",
                expected=f"{self.global_batch} samples", actual=f"{total} samples",
                related=tuple(where[1:])))
        if any(shards[r].ids is None for r in ranks) or len(ranks) < 2:
            return
        per_rank = [np.unique(shards[r].ids) for r in ranks]  # type: ignore[arg-type]
        owners = np.concatenate([np.full(u.size, r) for r, u in zip(ranks, per_rank,
                                                                     strict=True)])
        ids = np.concatenate(per_rank)
        order = np.argsort(ids, kind="stable")
        ids, owners = ids[order], owners[order]
        again = np.flatnonzero(ids[1:] == ids[:-1]) + 1
        if again.size == 0:
            return
        shared = np.unique(ids[again])
        x = int(shared[0])
        holders = sorted({int(o) for o in owners[ids == x]})
        a, b = holders[0], holders[1]
        self.sink.add(Anomaly(
            kind="rank_overlap", file=shards[b].file, line=shards[b].line, attempt=attempt,
            step=step, rank=b, sample_ids=tuple(shared[:8].tolist()), count=int(shared.size),
            message=f"ranks {a} and {b} both consumed sample {x} at step {step}"
                    + (f"; {shared.size} samples shared between ranks at this step: "
                       f"{format_ids(shared)}" if shared.size > 1 else ""),
            related=(Location(file=shards[a].file, line=shards[a].line, attempt=attempt,
                              step=step, rank=a),)))


def declared_set_hash(dataset_size: int) -> int:
    """Multiset hash of IDs ``0 .. D-1`` (in chunks: D may be large)."""
    total = np.uint64(0)
    for lo in range(0, dataset_size, _CHUNK):
        part = semantics.mix64(np.arange(lo, min(dataset_size, lo + _CHUNK), dtype=np.uint64))
        total = np.uint64(total + part.sum(dtype=np.uint64))
    return int(total)


@dataclass(slots=True)
class EpochHashes:
    """Hash-only external run: per epoch, the committed records' summed counts and hashes."""

    sums: dict[int, list[int]] = field(default_factory=dict)
    epochs_checked: int = 0

    def add(self, epochs: npt.NDArray[np.int64], counts: npt.NDArray[np.int64],
            hashes: npt.NDArray[np.uint64]) -> None:
        for e in np.unique(epochs).tolist():
            rows = epochs == e
            acc = self.sums.setdefault(int(e), [0, 0])
            acc[0] += int(counts[rows].sum())
            acc[1] = (acc[1] + int(hashes[rows].sum(dtype=np.uint64))) % 2**64

    def judge(self, *, dataset_size: int, steps_per_epoch: int, end: int,
              sink: AnomalySink) -> None:
        """Each complete epoch below ``end`` must be exactly the declared set."""
        expected: int | None = None
        for epoch in sorted(self.sums):
            if (epoch + 1) * steps_per_epoch > end:
                continue
            if expected is None:
                expected = declared_set_hash(dataset_size)
            self.epochs_checked += 1
            count, digest = self.sums[epoch]
            if count == dataset_size and digest == expected:
                continue
            how = ("more samples than declared (a duplicate or extra sample)"
                   if count > dataset_size else
                   "fewer samples than declared (a missing sample)" if count < dataset_size
                   else "as many samples as declared, but not the same ones")
            sink.add(Anomaly(
                kind="epoch_hash_mismatch", epoch=epoch,
                message=f"epoch {epoch} (steps {epoch * steps_per_epoch}.."
                        f"{(epoch + 1) * steps_per_epoch - 1}) consumed {count} samples hashing "
                        f"to {semantics.format_hash(digest)}: {how}; the declared set "
                        f"0..{dataset_size - 1} hashes to {semantics.format_hash(expected)} "
                        "(log sample IDs to see which)",
                expected=f"{dataset_size} IDs, hash {semantics.format_hash(expected)}",
                actual=f"{count} IDs, hash {semantics.format_hash(digest)}"))
