"""Witnesses for sample-level anomalies: which records consumed a duplicated or extra sample,
and which step and rank should have consumed a missing one.

The per-epoch counts only say *that* sample 17 was consumed twice. Finding the two records is a
second, targeted pass over the committed records of that epoch — paid only by failing runs, and
only for the few IDs shown as witnesses. A missing sample's place is found by scanning the
epoch's order for it (the permutation is computed forward only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from ecrl.contract import semantics
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import JsonlReader, StepRecord
from verifier.anomalies import Anomaly, AnomalySink, Location
from verifier.coverage import EpochVerdict
from verifier.lineage import AttemptPlan
from verifier.windows import format_ids

__all__ = ["report_epochs"]

_PER_KIND = 3
"""IDs per kind and epoch that get a located witness."""
_EPOCHS = 4
"""Epochs whose witnesses are located (the rest are counted)."""
_SCAN = 1 << 20


def report_epochs(verdicts: Sequence[EpochVerdict], *, sink: AnomalySink,
                  geometry: semantics.Geometry, seed: int, chain: Sequence[AttemptPlan],
                  rank_files: Mapping[tuple[int, int], tuple[Path, str]],
                  order_known: bool = True) -> None:
    """Turn judged epochs into anomalies, locating witnesses for the first few.

    ``order_known``: a missing sample's step can be found from ECRL's order (not for an
    external sampler's run)."""
    located = 0
    for v in verdicts:
        dup_n, miss_n, extra_n = v.counts
        if not (dup_n or miss_n or extra_n):
            continue
        locate = located < _EPOCHS
        located += 1
        wanted = set(v.duplicates[:_PER_KIND].tolist()) | set(v.extra[:_PER_KIND].tolist())
        where = (_consumers(v.epoch, wanted, geometry, chain, rank_files)
                 if locate and wanted else {})
        shown = _PER_KIND if locate else 1
        sink.add_many("duplicate_sample", dup_n, (
            _sample_anomaly("duplicate_sample", v, int(x), where.get(int(x), []), first=i == 0)
            for i, x in enumerate(v.duplicates[:shown])))
        sink.add_many("extra_sample", extra_n, (
            _sample_anomaly("extra_sample", v, int(x), where.get(int(x), []), first=i == 0)
            for i, x in enumerate(v.extra[:shown])))
        places = (_places(v, v.missing[:_PER_KIND], geometry, seed, chain)
                  if locate and miss_n and order_known else {})
        sink.add_many("missing_sample", miss_n, (
            _missing(v, int(x), places.get(int(x)), first=i == 0)
            for i, x in enumerate(v.missing[:shown])))


def _scope(v: EpochVerdict, kind: str) -> str:
    n = {"duplicate_sample": v.counts[0], "missing_sample": v.counts[1],
         "extra_sample": v.counts[2]}[kind]
    ids = {"duplicate_sample": v.duplicates, "missing_sample": v.missing,
           "extra_sample": v.extra}[kind]
    word = {"duplicate_sample": "duplicated", "missing_sample": "missing",
            "extra_sample": "extra"}[kind]
    return f"{n} {word} sample{'s' if n != 1 else ''} in epoch {v.epoch}: {format_ids(ids)}" \
        + (f" (first {ids.size} shown)" if n > ids.size else "")


def _sample_anomaly(kind: str, v: EpochVerdict, sample: int, found: list[Location], *,
                    first: bool) -> Anomaly:
    head = found[-1] if found else Location()
    if kind == "duplicate_sample":
        how = (" by " + " and ".join(_describe(f) for f in found[:2])) if found else ""
        message = f"sample {sample} was consumed twice in epoch {v.epoch}{how}"
    else:
        how = (" by " + _describe(found[0])) if found else ""
        message = (f"sample {sample} is not in epoch {v.epoch}'s committed windows but was "
                   f"consumed{how}")
    if first:  # the epoch's scope follows its first witness only
        message += f"; {_scope(v, kind)}"
    return Anomaly(kind=kind, message=message, file=head.file,
                   line=head.line, attempt=head.attempt, step=head.step, rank=head.rank,
                   epoch=v.epoch, sample_ids=(sample,), related=tuple(found[:-1]))


def _describe(loc: Location) -> str:
    return f"step {loc.step} rank {loc.rank} (attempt {loc.attempt}, {loc.file}:{loc.line})"


def _missing(v: EpochVerdict, sample: int, place: tuple[int, int | None] | None, *,
             first: bool) -> Anomaly:
    scope = f"; {_scope(v, 'missing_sample')}" if first else ""
    if place is None:
        message = f"sample {sample} of epoch {v.epoch} was never consumed"
        return Anomaly(kind="missing_sample", message=message + scope, epoch=v.epoch,
                       sample_ids=(sample,))
    step, rank = place
    who = f", rank {rank}" if rank is not None else ""
    message = (f"sample {sample} of epoch {v.epoch} was never consumed: it belongs to step "
               f"{step}{who}")
    return Anomaly(kind="missing_sample", message=message + scope, epoch=v.epoch, step=step,
                   rank=rank, sample_ids=(sample,))


def _consumers(epoch: int, wanted: set[int], geometry: semantics.Geometry,
               chain: Sequence[AttemptPlan],
               rank_files: Mapping[tuple[int, int], tuple[Path, str]]
               ) -> dict[int, list[Location]]:
    """Committed records of ``epoch`` that consumed any of ``wanted``, in lineage order."""
    s = geometry.steps_per_epoch
    lo_step, hi_step = epoch * s, (epoch + 1) * s - 1
    found: dict[int, list[Location]] = {}
    for plan in chain:
        if (plan.hi is not None and plan.hi < lo_step) or plan.lo > hi_step:
            continue
        for (attempt, rank), (path, rel) in sorted(rank_files.items()):
            if attempt != plan.attempt:
                continue
            try:
                for line, data in JsonlReader(path, StepRecord, torn_tail_ok=True).raw():
                    step = data.get("global_step") if isinstance(data, dict) else None
                    ids = data.get("sample_ids") if isinstance(data, dict) else None
                    if not isinstance(step, int) or not isinstance(ids, list):
                        continue
                    if not (lo_step <= step <= hi_step and plan.committed(step)):
                        continue
                    for x in wanted.intersection(i for i in ids if isinstance(i, int)):
                        found.setdefault(x, []).append(Location(
                            file=rel, line=line, attempt=attempt, step=step, rank=rank))
            except RunFormatError:
                continue
    return found


def _places(v: EpochVerdict, missing: npt.NDArray[np.int64], geometry: semantics.Geometry,
            seed: int, chain: Sequence[AttemptPlan]) -> dict[int, tuple[int, int | None]]:
    """Step (and rank, from the world size of the attempt that committed it) of each ID."""
    if missing.size == 0:
        return {}
    perm = semantics.epoch_permutation(dataset_size=geometry.dataset_size, seed=seed,
                                       epoch=v.epoch)
    used = v.steps * geometry.global_batch
    out: dict[int, tuple[int, int | None]] = {}
    for start in range(0, used, _SCAN):
        ids = perm.range(start, min(used, start + _SCAN))
        hits = np.flatnonzero(np.isin(ids, missing))
        for h in hits.tolist():
            position = start + h
            step = v.epoch * geometry.steps_per_epoch + position // geometry.global_batch
            owner = next((p for p in chain if p.committed(step)), None)
            rank = None
            if owner is not None and geometry.global_batch % owner.world_size == 0:
                rank = (position % geometry.global_batch) // (
                    geometry.global_batch // owner.world_size)
            out[int(ids[h])] = (step, rank)
        if len(out) == missing.size:
            break
    return out
