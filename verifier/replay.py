"""Replay consistency: a resume must restore the training state, not only the data position.

After a failure, the steps a failed attempt ran beyond the checkpoint its successor resumed from
are computed twice: once by the failed attempt, once by the successor. If the successor restored
the model, optimizer, LR scheduler and random state, each such step starts from the same state
and consumes the same window, so its *global loss* — the sum over ranks of ``loss × local_batch /
B``, in float64, in rank order — is the same: bit for bit at the same world size (deterministic
kernels), within a relative tolerance at another world size (each rank's loss covers another part
of the batch, so the float sums are grouped differently) or when ``run.json`` declares
``"deterministic": false``.

Only the replay windows are held: the failed attempt's records after its successor's resume
point, until the successor has been read (:class:`ReplayTracker`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from verifier.anomalies import Anomaly, AnomalySink, Location
from verifier.lineage import AttemptPlan
from verifier.result import ReplayCheck

__all__ = ["DEFAULT_TOLERANCE", "ReplayTracker", "global_loss"]

DEFAULT_TOLERANCE = 0.5
"""Relative tolerance where bit-identical losses are not expected. Measured (docs/verifier.md):
at another world size the tiny CNN's dropout draws its masks from each rank's own generator, so
the global loss of a correctly replayed step differs by up to 0.27 (``ecrl demo``, 2→1) — the
loss depends on how the batch is split, not only on the state. Half of the larger loss keeps a
margin of about two over that; a tighter value suits models without per-rank randomness."""


@dataclass(frozen=True, slots=True)
class _Entry:
    loss: float
    local_batch: int
    file: str
    line: int


def global_loss(entries: Sequence[_Entry], global_batch: int) -> float:
    """Sum over ranks (in rank order) of ``loss × local_batch / B``, in float64."""
    total = 0.0
    for e in entries:
        total += e.loss * e.local_batch / global_batch
    return total


@dataclass(slots=True)
class ReplayTracker:
    """Collects the replay windows while the attempts are streamed, in attempt order."""

    plans: Sequence[AttemptPlan]
    global_batch: int
    deterministic: bool
    tolerance: float
    sink: AnomalySink
    resume_of_next: dict[int, int] = field(default_factory=dict)
    """Attempt k -> the step its successor resumed from (only successors that resumed)."""
    old: dict[int, dict[int, dict[int, _Entry]]] = field(default_factory=dict)
    """Attempt k -> step -> rank -> its record, for steps after its successor's resume point."""
    new: dict[int, dict[int, _Entry]] = field(default_factory=dict)
    replayed_steps: int = 0
    compared: int = 0
    exact: int = 0
    tolerant: int = 0
    max_rel_diff: float | None = None

    previous: dict[int, int] = field(default_factory=dict)
    """Attempt -> the attempt listed before it (numbers may skip a stray log folder)."""
    tp_sizes: dict[int, int] = field(default_factory=dict)
    """Attempt -> its tensor-parallel degree, for attempts on a mesh: its ranks' sum counts
    each data-parallel shard's loss once per peer, so it is divided by the degree."""

    def __post_init__(self) -> None:
        for plan, nxt in zip(self.plans, self.plans[1:], strict=False):
            self.previous[nxt.attempt] = plan.attempt
            if nxt.resumed_from is not None:
                self.resume_of_next[plan.attempt] = nxt.resumed_from

    def wants(self, attempt: int) -> bool:
        """Whether the records of ``attempt`` are needed (their losses must be read)."""
        return attempt in self.resume_of_next or self.previous.get(attempt) in self.old

    def may_want(self, attempt: int) -> bool:
        """Whether the records of ``attempt`` may be needed, known before any attempt is read
        (a superset of :meth:`wants`, for scans started ahead of the judgement)."""
        return attempt in self.resume_of_next or attempt in self.previous

    def take(self, *, attempt: int, rank: int, steps: npt.NDArray[np.int64],
             loss: npt.NDArray[np.float64] | None, local_batch: npt.NDArray[np.int64] | int,
             first_line: int, file: str) -> None:
        """A batch of one rank's records of ``attempt`` (any rows: committed or not)."""
        if loss is None:
            return
        locals_ = np.broadcast_to(np.asarray(local_batch, dtype=np.int64), steps.shape)
        after = self.resume_of_next.get(attempt)
        if after is not None:
            window = self.old.setdefault(attempt, {})
            for i in np.flatnonzero(steps > after).tolist():
                window.setdefault(int(steps[i]), {}).setdefault(rank, _Entry(
                    float(loss[i]), int(locals_[i]), file, first_line + i))
        earlier = self.old.get(self.previous.get(attempt, -1))
        if earlier:
            lo, hi = min(earlier), max(earlier)
            for i in np.flatnonzero((steps >= lo) & (steps <= hi)).tolist():
                step = int(steps[i])
                if step in earlier:
                    self.new.setdefault(step, {}).setdefault(rank, _Entry(
                        float(loss[i]), int(locals_[i]), file, first_line + i))

    def attempt_done(self, attempt: int) -> None:
        """Compare the previous attempt's replay window with what ``attempt`` recomputed."""
        before = self.previous.get(attempt, -1)
        earlier = self.old.pop(before, None)
        new, self.new = self.new, {}
        if not earlier:
            return
        plans = {p.attempt: p for p in self.plans}
        failed = plans[before]
        succ = plans[attempt]
        tp_a, tp_b = self.tp_sizes.get(before, 1), self.tp_sizes.get(attempt, 1)
        exact = self.deterministic and failed.world_size == succ.world_size and tp_a == tp_b
        for step in sorted(earlier):
            a_ranks, b_ranks = earlier[step], new.get(step, {})
            if sorted(a_ranks) != list(range(failed.world_size)) \
                    or sorted(b_ranks) != list(range(succ.world_size)):
                continue  # a rank that died before logging it: no global loss to compare
            self.replayed_steps += 1
            a = global_loss([a_ranks[r] for r in sorted(a_ranks)], self.global_batch) / tp_a
            b = global_loss([b_ranks[r] for r in sorted(b_ranks)], self.global_batch) / tp_b
            if not (math.isfinite(a) and math.isfinite(b)):
                continue
            self.compared += 1
            rel = _rel(a, b)
            if rel > 0:  # the largest difference of every compared step, divergent ones too
                self.max_rel_diff = rel if self.max_rel_diff is None \
                    else max(self.max_rel_diff, rel)
            if exact:
                self.exact += 1
                if a == b:
                    continue
            else:
                self.tolerant += 1
                if rel <= self.tolerance:
                    continue
            first, again = a_ranks[0], b_ranks[0]
            self.sink.add(Anomaly(
                kind="replay_divergence", file=again.file, line=again.line,
                attempt=succ.attempt, step=step, rank=0, expected=repr(a), actual=repr(b),
                related=(Location(file=first.file, line=first.line, attempt=failed.attempt,
                                  step=step, rank=0),),
                evidence={"failed_attempt": failed.attempt,
                          "failed_world_size": failed.world_size, "failed_loss": a,
                          "world_size": succ.world_size, "loss": b,
                          "resumed_from": succ.resumed_from, "relative_difference": rel,
                          "exact": exact, "tolerance": self.tolerance}))

    def summary(self) -> ReplayCheck:
        return ReplayCheck(replayed_steps=self.replayed_steps, compared=self.compared,
                           exact=self.exact, tolerant=self.tolerant, tolerance=self.tolerance,
                           max_rel_diff=self.max_rel_diff)


def _rel(a: float, b: float) -> float:
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale > 0 else 0.0
