"""The seed's published matrix (seed ``000_…``, Tables 6 and 8) as matrix tables, for comparison.

The seed's figures are not shipped as images; ``python -m ecrl.apps.matrix._seed DIR`` redraws
them from its published per-suite numbers with the same code that draws ``ecrl matrix``'s
figures, so ``docs/experiments.md`` can show both side by side. The seed ran one reference per
suite (its base and late references differ), so the rows are built here directly rather than from
unit records.
"""

from __future__ import annotations

import sys
from pathlib import Path

from ._config import REFERENCE
from ._stats import Estimate, estimate
from ._tables import SuiteRow, Tables

__all__ = ["SEED_SUITES", "seed_tables"]

# dataset, model, schedule, goodput of reference / blocking / overlapped (steps/s), whole-run
# stall of blocking / overlapped (s). Seed 000, Table 6 (goodput) and Table 8 (stall).
SEED_SUITES: tuple[tuple[str, str, str, float, float, float, float, float], ...] = (
    ("cifar10", "resnet18", "base", 11.7289, 11.3023, 11.5721, 11.0699, 6.1273),
    ("cifar10", "resnet18", "late", 13.3230, 11.2143, 11.2408, 10.8221, 5.8818),
    ("cifar10", "resnet50", "base", 8.5743, 6.7222, 6.8576, 24.2825, 9.7517),
    ("cifar10", "resnet50", "late", 7.2259, 6.6058, 6.8030, 24.7192, 10.1076),
    ("cifar100", "resnet18", "base", 14.9770, 12.5790, 12.7443, 11.1750, 5.1956),
    ("cifar100", "resnet18", "late", 14.5657, 12.2979, 12.7471, 11.7959, 5.1019),
    ("cifar100", "resnet50", "base", 8.6444, 7.6277, 7.8637, 24.2103, 10.2728),
    ("cifar100", "resnet50", "late", 8.3879, 7.2988, 7.3179, 26.6126, 10.4842),
)

_NONE = Estimate(mean=None, ci95=None, n=0)


def _row(dataset: str, model: str, schedule: str, variant: str, goodput: float, ref: float,
         blk: float, stall: float | None, blk_stall: float, rank: int) -> SuiteRow:
    compare = variant not in (REFERENCE, "blocking")
    return SuiteRow(
        suite=f"{dataset}-{model}-{schedule}", dataset=dataset, model=model, schedule=schedule,
        variant=variant, seeds=1, verdict="PASS", goodput=estimate([goodput]),
        normalized=estimate([goodput / ref]), drop_pct=estimate([100 * (goodput / ref - 1)]),
        gain_pct=estimate([100 * (goodput / blk - 1)]) if compare else _NONE,
        stall_reduction_s=estimate([blk_stall - stall]) if compare and stall is not None
        else _NONE,
        restarts=0.0 if variant == REFERENCE else 2.0,
        expected_restarts=0 if variant == REFERENCE else 2, replayed_steps=None,
        wall_s=_NONE, stall_s=estimate([stall]) if stall is not None else _NONE,
        write_s=_NONE, snapshot_s=_NONE, loss_mean_abs_diff=None, loss_max_abs_diff=None,
        bit_identical=None, rank=rank)


def seed_tables() -> Tables:
    rows: list[SuiteRow] = []
    for dataset, model, schedule, ref, blk, ovl, blk_stall, ovl_stall in SEED_SUITES:
        order = sorted([(REFERENCE, ref), ("blocking", blk), ("overlapped", ovl)],
                       key=lambda item: -item[1])
        rank = {name: i + 1 for i, (name, _) in enumerate(order)}
        rows += [_row(dataset, model, schedule, REFERENCE, ref, ref, blk, None, blk_stall,
                      rank[REFERENCE]),
                 _row(dataset, model, schedule, "blocking", blk, ref, blk, blk_stall, blk_stall,
                      rank["blocking"]),
                 _row(dataset, model, schedule, "overlapped", ovl, ref, blk, ovl_stall,
                      blk_stall, rank["overlapped"])]
    return Tables(suites=tuple(rows), slices=(), overall=(), units=(),
                  variants=(REFERENCE, "blocking", "overlapped"), seeds=(0,), missing=())


if __name__ == "__main__":  # pragma: no cover - regenerates the docs' seed figures
    from ._figures import write_figures

    for path in write_figures(seed_tables(), Path(sys.argv[1])):
        print(path)
