"""``ecrl advise --from-run`` / ``--from-matrix``: the advise models fed with measured costs.

The models are :mod:`ecrl.apps.advise`'s (nothing is re-derived here): this module only turns a
run's measurements (:mod:`._measure`) into an :class:`~ecrl.apps.advise.AdviceInput`. A cost
given on the command line wins over the measured one; the failure rate always comes from the
command line (one run cannot measure it). ``--from-matrix`` groups the matrix's failure units by
workload (data set and model) and strategy and averages their measurements per group.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecrl.apps.advise import Advice, AdviceInput, advise, render_text
from ecrl.contract.errors import ConfigError

from ._measure import Measured, measure_run

__all__ = ["Overrides", "MeasuredAdvice", "from_run", "from_matrix", "render_run",
           "render_matrix"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Overrides:
    """What the command line says; None: take the measured value."""

    ckpt_cost: float | None
    restore_cost: float | None
    step_time: float | None
    gpu_failure_rate: float
    gpus: int | None
    overhead: float
    job_seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class MeasuredAdvice:
    """The advice for one run (or one group of matrix units) and what it was computed from."""

    label: str
    measured: Measured
    given: AdviceInput
    advice: Advice
    units: int = 1

    def as_dict(self) -> dict[str, Any]:
        return {"label": self.label, "units": self.units, "measured": self.measured.as_dict(),
                "inputs": {"ckpt_cost": self.given.ckpt_cost,
                           "restore_cost": self.given.restore_cost,
                           "step_time": self.given.step_time, "gpus": self.given.gpus,
                           "gpu_failure_rate": self.given.gpu_failure_rate},
                **self.advice.as_dict()}


def _inputs(measured: Measured, flags: Overrides, *, where: str) -> AdviceInput:
    ckpt = flags.ckpt_cost if flags.ckpt_cost is not None else measured.ckpt_stall_s
    if ckpt is None:
        raise ConfigError(f"{where}: took no checkpoint (strategy {measured.strategy}), so its "
                          "checkpoint cost is unknown; give --ckpt-cost")
    if ckpt <= 0:
        # A stall below the clock's resolution: the models need a positive cost.
        ckpt = 1e-6
    return AdviceInput(
        ckpt_cost=ckpt,
        restore_cost=flags.restore_cost if flags.restore_cost is not None
        else measured.restore_s,
        step_time=flags.step_time if flags.step_time is not None else measured.step_s,
        gpu_failure_rate=flags.gpu_failure_rate,
        gpus=flags.gpus if flags.gpus is not None else measured.world_size,
        overhead=flags.overhead, job_seconds=flags.job_seconds)


def from_run(run: str | Path, flags: Overrides) -> MeasuredAdvice:
    measured = measure_run(run)
    given = _inputs(measured, flags, where=f"--from-run {run}")
    return MeasuredAdvice(label=str(run), measured=measured, given=given, advice=advise(given))


def _median(values: list[float]) -> float:
    return statistics.median(values)


def from_matrix(folder: str | Path, flags: Overrides) -> list[MeasuredAdvice]:
    """One advice per workload (data set-model) and strategy of the matrix's failure units."""
    root = Path(folder)
    if not (root / "manifest.json").exists():
        raise ConfigError(f"--from-matrix {root}: no manifest.json; give the --out folder of an "
                          "`ecrl matrix`")
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for path in sorted((root / "units").rglob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if record.get("measured") and record.get("schedule") and record.get("complete"):
            key = (f"{record['dataset']}-{record['model']}", record["strategy"])
            groups.setdefault(key, []).append(record)
    if not groups:
        raise ConfigError(f"--from-matrix {root}: no finished failure unit yet; run (or "
                          "resume) the matrix first")
    out = []
    for (workload, strategy), records in groups.items():
        ms = [Measured(**r["measured"]) for r in records]
        stalls = [m.ckpt_stall_s for m in ms if m.ckpt_stall_s is not None]
        restores = [m.restore_s for m in ms if m.restore_from != "first launch"] or \
            [m.restore_s for m in ms]
        pooled = Measured(
            path=str(root), strategy=strategy, world_size=ms[0].world_size,
            ckpt_every=ms[0].ckpt_every, step_s=_median([m.step_s for m in ms]),
            steps=sum(m.steps for m in ms),
            ckpt_stall_s=_median(stalls) if stalls else None,
            checkpoints=sum(m.checkpoints for m in ms), restore_s=statistics.fmean(restores),
            restore_from=f"{len(records)} units")
        given = _inputs(pooled, flags, where=f"--from-matrix {root} ({workload}, {strategy})")
        out.append(MeasuredAdvice(label=f"{workload} {strategy}", measured=pooled, given=given,
                                  advice=advise(given), units=len(records)))
    return out


def _ms(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds * 1e3:.1f} ms"


def render_run(result: MeasuredAdvice) -> str:
    m = result.measured
    head = (f"measured in {m.path} ({m.strategy}, --ckpt-every {m.ckpt_every}): step "
            f"{_ms(m.step_s)} (median of {m.steps}), checkpoint stall {_ms(m.ckpt_stall_s)} "
            f"(median of {m.checkpoints}), restore {result.given.restore_cost:.2f} s "
            f"(from {m.restore_from})")
    return head + "\n" + render_text(result.given, result.advice)


def render_matrix(results: list[MeasuredAdvice]) -> str:
    header = ("workload", "strategy", "units", "step", "stall/ckpt", "restore", "--ckpt-every",
              "periodic wasted", "JIT wasted")
    rows = [header]
    for r in results:
        workload, strategy = r.label.rsplit(" ", 1)
        rows.append((workload, strategy, str(r.units), _ms(r.given.step_time),
                     _ms(r.given.ckpt_cost), f"{r.given.restore_cost:.2f} s",
                     str(r.advice.ckpt_every_steps),
                     f"{100 * r.advice.periodic_wasted_fraction:.3g}%",
                     f"{100 * r.advice.jit_wasted_fraction:.3g}%"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in rows]
    first = results[0].given
    lines.append(f"failure rate: one GPU fails every {1 / first.gpu_failure_rate / 3600:.2f} h; "
                 "GPUs: each unit's world size unless --gpus is given")
    return "\n".join(lines)
