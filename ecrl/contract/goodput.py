"""Goodput: the one definition that ``ecrl run``'s summary and ``ecrl-verify`` both print.

``goodput = committed_steps / wall_s``, in committed steps per second (seed ``000_…``, eq. 6).

``committed_steps`` counts the steps the final model carries (the committed lineage), each once:
a step a failed attempt ran after the checkpoint its successor resumed from is replayed work and
never counts as progress. ``wall_s`` is the time the user waited for those steps: from the first
attempt's start to the last attempt's end, as the supervisor recorded them. So every cost of a
failure counts against goodput — the relaunch, the restore, the replayed steps, the checkpoint
stalls — and goodput is 1 / (seconds per step) only for a run that never failed.

One span is left out: the time between an attempt that a person *stopped* (its status is
``stopped``: Ctrl-C or SIGTERM to the supervisor) and the next attempt's start. Nobody waits for a
run stopped on Friday and continued with ``ecrl run --out`` on Monday, and the weekend is not a
cost of fault tolerance. A relaunch after a failure, however long, is waited for and counts.

An attempt whose end is not known (a running one, or one whose supervisor died with it) ends
where its caller can best say: the verifier uses its last logged record, the runtime's summary
"now" for a running attempt, and an end that nobody knows is left out (the attempt's time then
counts up to the latest known end around it). With no known end at all, or no time elapsed, the
wall time and goodput are unknown (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AttemptSpan", "Goodput", "wall_time", "goodput"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptSpan:
    """When one attempt ran (seconds since the epoch, as ``supervisor.json`` records them)."""

    start: float
    """The attempt's launch."""
    end: float | None
    """Its end, or ``None`` when not known."""
    stopped: bool = False
    """A person stopped the run here: the wait until the next attempt does not count."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Goodput:
    """Committed progress over the wall time it took."""

    committed_steps: int
    """Distinct steps of the committed lineage (replayed steps excluded)."""
    wall_s: float | None
    """First start to last end, less the waits after stopped attempts; ``None`` if unknown."""

    @property
    def steps_per_s(self) -> float | None:
        """``committed_steps / wall_s``; ``None`` when the wall time is unknown."""
        return self.committed_steps / self.wall_s if self.wall_s else None


def wall_time(spans: Sequence[AttemptSpan]) -> float | None:
    """The wall time of a run's attempts, in their order (module docstring); ``None`` if unknown.

    The attempts are cut after each stopped one into stretches the user waited through; each
    stretch lasts from its first start to its last known end.
    """
    total = 0.0
    known = False
    stretch: list[AttemptSpan] = []
    for i, span in enumerate(spans):
        stretch.append(span)
        if not (span.stopped or i == len(spans) - 1):
            continue
        ends = [s.end for s in stretch if s.end is not None]
        if ends:
            known = True
            total += max(0.0, max(ends) - min(s.start for s in stretch))
        stretch = []
    return total if known and total > 0 else None


def goodput(*, committed_steps: int, spans: Sequence[AttemptSpan]) -> Goodput:
    """Goodput of ``committed_steps`` committed over the attempts ``spans`` (in their order)."""
    return Goodput(committed_steps=committed_steps, wall_s=wall_time(spans))
