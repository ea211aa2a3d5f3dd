"""The matrix's results as data: per-suite rows, ranking, slices and overall means (torch-free).

Everything here is computed from the unit records alone (``units/UID.json``), so the same records
always give the same tables: a rerun that reuses every unit rewrites identical files.

Per seed, a failure variant is compared with the reference of the same data set, model and seed
(drop against the reference, loss divergence, bit-identity of the final parameters) and with the
``blocking`` variant of the same suite and seed (gain over blocking, stall reduction); the means
over seeds carry Student-t 95% intervals (:mod:`._stats`) when there are two seeds or more.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._config import REFERENCE, MatrixConfig, Suite
from ._stats import Estimate, estimate

__all__ = ["SuiteRow", "SliceRow", "OverallRow", "Tables", "build_tables"]

BASELINE = "blocking"
"""The strategy the others are compared with (the seed's question: does overlap pay?)."""

Record = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True, slots=True)
class SuiteRow:
    """One variant of one suite, over its seeds."""

    suite: str
    dataset: str
    model: str
    schedule: str
    variant: str
    seeds: int
    """Seeds with a record."""
    verdict: str
    """PASS when every seed's unit passed; FAIL if any failed; else UNKNOWN (or MISSING)."""
    goodput: Estimate
    """Committed steps per wall-clock second."""
    normalized: Estimate
    """Goodput over the reference's, per seed."""
    drop_pct: Estimate
    """Goodput change against the reference, percent (negative: slower)."""
    gain_pct: Estimate
    """Goodput change against blocking, percent (None for the reference and blocking)."""
    stall_reduction_s: Estimate
    """Blocking's stall minus this variant's, seconds."""
    restarts: float | None
    expected_restarts: int
    replayed_steps: float | None
    wall_s: Estimate
    stall_s: Estimate
    write_s: Estimate
    snapshot_s: Estimate
    loss_mean_abs_diff: float | None
    loss_max_abs_diff: float | None
    bit_identical: bool | None
    """Final parameters equal the reference's at every seed (None: other world sizes, or the
    reference itself)."""
    rank: int
    """1 = the suite's highest goodput."""

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            out[name] = value.as_dict() if isinstance(value, Estimate) else value
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class SliceRow:
    """Means over the suites sharing one value of one axis, for one failure strategy."""

    axis: str
    group: str
    variant: str
    suites: int
    drop_pct: float | None
    gain_pct: float | None
    stall_reduction_s: float | None
    loss_mean_abs_diff: float | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class OverallRow:
    """One variant's means over all suites (the seed's aggregate table)."""

    variant: str
    units: int
    pass_rate: float | None
    goodput: float | None
    drop_pct: float | None
    gain_pct: float | None
    positive_gain: str | None
    """Suites where this variant beat blocking, as ``k/n``."""
    restarts: float | None
    wall_s: float | None
    stall_s: float | None
    write_s: float | None
    snapshot_s: float | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class Tables:
    suites: tuple[SuiteRow, ...]
    slices: tuple[SliceRow, ...]
    overall: tuple[OverallRow, ...]
    units: tuple[Record, ...]
    variants: tuple[str, ...]
    seeds: tuple[int, ...]
    missing: tuple[str, ...]
    """uids without a record (not run yet)."""

    def ranking(self) -> list[SuiteRow]:
        """Failure variants other than blocking, best gain over blocking first."""
        rows = [r for r in self.suites if r.variant not in (REFERENCE, BASELINE)]
        return sorted(rows, key=lambda r: (-(r.gain_pct.mean if r.gain_pct.mean is not None
                                              else float("-inf")), r.suite, r.variant))


def _uid(suite: Suite, variant: str, seed: int) -> str:
    if variant == REFERENCE:
        return f"{suite.dataset}-{suite.model}/{REFERENCE}-seed{seed}"
    return f"{suite.name}/{variant}-seed{seed}"


def _metric(record: Record | None, key: str) -> float | None:
    if record is None:
        return None
    value = record.get("metrics", {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _pct(a: float | None, b: float | None) -> float | None:
    r = _ratio(a, b)
    return None if r is None else 100.0 * (r - 1.0)


def _mean(values: Sequence[float | None]) -> float | None:
    return estimate(values).mean


def _verdict(records: Sequence[Record | None]) -> str:
    verdicts = [r.get("verdict") if r else None for r in records]
    if "FAIL" in verdicts:
        return "FAIL"
    if None in verdicts:
        return "MISSING"
    if any(v != "PASS" for v in verdicts):
        return "UNKNOWN"
    return "PASS"


def _identical(record: Record | None, ref: Record | None) -> bool | None:
    if record is None or ref is None or not record.get("params_digest"):
        return None
    sizes = set(record.get("world_sizes") or []) | set(ref.get("world_sizes") or [])
    if len(sizes) != 1:
        return None  # another world size: exact in data, not in floating point
    return record.get("params_digest") == ref.get("params_digest")


def build_tables(config: MatrixConfig, records: Mapping[str, Record]) -> Tables:
    rows: list[SuiteRow] = []
    for suite in config.suites():
        suite_rows = []
        for variant in config.variants:
            per_seed = [records.get(_uid(suite, variant, s)) for s in config.seeds]
            refs = [records.get(_uid(suite, REFERENCE, s)) for s in config.seeds]
            blks = [records.get(_uid(suite, BASELINE, s)) if BASELINE in config.strategies
                    else None for s in config.seeds]
            goodput = [_metric(r, "goodput") for r in per_seed]
            ref_gp = [_metric(r, "goodput") for r in refs]
            blk_gp = [_metric(r, "goodput") for r in blks]
            is_failure = variant != REFERENCE
            compare = is_failure and variant != BASELINE
            identical = [_identical(r, ref) for r, ref in zip(per_seed, refs, strict=True)]
            schedule = next(s for s in config.schedules if s.name == suite.schedule)
            suite_rows.append(dict(
                suite=suite.name, dataset=suite.dataset, model=suite.model,
                schedule=suite.schedule, variant=variant,
                seeds=sum(r is not None for r in per_seed), verdict=_verdict(per_seed),
                goodput=estimate(goodput),
                normalized=estimate([_ratio(g, r) for g, r in zip(goodput, ref_gp, strict=True)]),
                drop_pct=estimate([_pct(g, r) for g, r in zip(goodput, ref_gp, strict=True)]),
                gain_pct=estimate([_pct(g, b) for g, b in zip(goodput, blk_gp, strict=True)]
                                  if compare else []),
                stall_reduction_s=estimate(
                    [None if b is None or r is None else
                     _metric(b, "stall_s") - _metric(r, "stall_s")  # type: ignore[operator]
                     for r, b in zip(per_seed, blks, strict=True)] if compare else []),
                restarts=_mean([_metric(r, "restarts") for r in per_seed]),
                expected_restarts=len(schedule.settings["fail_at"]) if is_failure else 0,
                replayed_steps=_mean([_metric(r, "replayed_steps") for r in per_seed]),
                wall_s=estimate([_metric(r, "wall_s") for r in per_seed]),
                stall_s=estimate([_metric(r, "stall_s") for r in per_seed]),
                write_s=estimate([_metric(r, "write_s") for r in per_seed]),
                snapshot_s=estimate([_metric(r, "snapshot_s") for r in per_seed]),
                loss_mean_abs_diff=_mean([_metric(r, "loss_mean_abs_diff") for r in per_seed])
                if is_failure else None,
                loss_max_abs_diff=max((v for r in per_seed
                                       if (v := _metric(r, "loss_max_abs_diff")) is not None),
                                      default=None) if is_failure else None,
                bit_identical=None if not is_failure or None in identical
                else all(identical),
            ))
        order = sorted(range(len(suite_rows)), key=lambda i: -(
            suite_rows[i]["goodput"].mean or float("-inf")))  # type: ignore[attr-defined]
        for rank, i in enumerate(order, start=1):
            suite_rows[i]["rank"] = rank
        rows += [SuiteRow(**r) for r in suite_rows]  # type: ignore[arg-type]

    slices: list[SliceRow] = []
    for axis in ("dataset", "model", "schedule"):
        groups = dict.fromkeys(getattr(r, axis) for r in rows)
        for group in groups:
            for variant in config.strategies:
                chosen = [r for r in rows if getattr(r, axis) == group and r.variant == variant]
                slices.append(SliceRow(
                    axis=axis, group=group, variant=variant, suites=len(chosen),
                    drop_pct=_mean([r.drop_pct.mean for r in chosen]),
                    gain_pct=_mean([r.gain_pct.mean for r in chosen]),
                    stall_reduction_s=_mean([r.stall_reduction_s.mean for r in chosen]),
                    loss_mean_abs_diff=_mean([r.loss_mean_abs_diff for r in chosen])))

    overall: list[OverallRow] = []
    for variant in config.variants:
        chosen = [r for r in rows if r.variant == variant]
        units = [records[uid] for uid in dict.fromkeys(
            _uid(Suite(dataset=r.dataset, model=r.model, schedule=r.schedule), variant, s)
            for r in chosen for s in config.seeds) if uid in records]
        gains = [r.gain_pct.mean for r in chosen if r.gain_pct.mean is not None]
        overall.append(OverallRow(
            variant=variant, units=len(units),
            pass_rate=(sum(u.get("verdict") == "PASS" for u in units) / len(units)
                       if units else None),
            goodput=_mean([r.goodput.mean for r in chosen]),
            drop_pct=_mean([r.drop_pct.mean for r in chosen]),
            gain_pct=_mean(gains),
            positive_gain=f"{sum(g > 0 for g in gains)}/{len(gains)}" if gains else None,
            restarts=_mean([r.restarts for r in chosen]),
            wall_s=_mean([r.wall_s.mean for r in chosen]),
            stall_s=_mean([r.stall_s.mean for r in chosen]),
            write_s=_mean([r.write_s.mean for r in chosen]),
            snapshot_s=_mean([r.snapshot_s.mean for r in chosen])))

    uids = [u.uid for u in config.units()]
    return Tables(suites=tuple(rows), slices=tuple(slices), overall=tuple(overall),
                  units=tuple(records[uid] for uid in uids if uid in records),
                  variants=config.variants, seeds=config.seeds,
                  missing=tuple(uid for uid in uids if uid not in records))
