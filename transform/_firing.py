"""When a slot's hint fires: the rules the schedule produces, evaluated without numpy.

The schedule (:mod:`transform.plan`) describes each slot's checkpoints by a rule; generated
programs evaluate the same rule at run time through :mod:`transform.runtime`, which must stay
light (no numpy, no torch). Occurrences are 1-based executions of the slot.

Past the modelled count (a loop that runs longer than its ``_iterations`` said) a rule that fired
at all keeps firing with the model's average spacing, so a long run is never left without
checkpoints.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["balanced_cuts", "balanced_fires", "fires"]


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


def fires(rule: Mapping[str, Any], occurrence: int) -> bool:
    """Does a slot with this rule (a plan entry) fire at its ``occurrence``-th execution?"""
    kind, total, count = rule["kind"], int(rule["total"]), int(rule["count"])
    if kind == "never" or count <= 0:
        return False
    if occurrence > total:
        period = max(1, round(total / count)) if total else 1
        return (occurrence - total) % period == 0
    if kind == "always":
        return occurrence >= 1
    if kind == "balanced":
        return balanced_fires(occurrence, first=int(rule["first"]), last=int(rule["last"]),
                              blocks=int(rule["blocks"]), cuts=count)
    return occurrence in rule["occurrences"]
