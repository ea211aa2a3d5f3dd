"""When a slot's hint fires: the rules the schedule produces, evaluated without numpy.

The schedule (:mod:`transform.plan`) describes each slot's checkpoints by a rule; generated
programs evaluate the same rule at run time (:meth:`transform.planspec.SlotRule.fires`), which must
stay light (no numpy, no torch). Occurrences are 1-based executions of the slot.
"""

from __future__ import annotations

__all__ = ["balanced_cuts", "balanced_fires"]


def balanced_cuts(*, first: int, last: int, blocks: int, cuts: int,
                  limit: int | None = None) -> list[int]:
    """Occurrences of a balanced rule: ``first + floor(j·(last−first)/blocks)``, ``j=0..blocks``."""
    if cuts <= 0:
        return []
    if blocks == 0:
        return [first]
    span = last - first
    total = blocks + 1 if limit is None else min(blocks + 1, limit)
    return [first + (j * span) // blocks for j in range(total)]


def balanced_fires(occurrence: int, *, first: int, last: int, blocks: int, cuts: int) -> bool:
    """O(1) membership test for :func:`balanced_cuts` (what generated code evaluates)."""
    if cuts <= 0 or occurrence < first or occurrence > last:
        return False
    if blocks == 0:
        return occurrence == first
    d, span = occurrence - first, last - first
    j = -((-d * blocks) // span)  # ceil(d·blocks/span): the first j whose point is ≥ d
    return (j * span) // blocks == d
