"""Deadline-aware final checkpoint (seed ``002_…``, PyRecover), torch-free.

A job with a time limit (SLURM's ``--time``) is killed at its end, losing everything since its last
checkpoint. With a deadline (``--deadline``: an absolute time or a duration from now; else
``SLURM_JOB_END_TIME``, Unix seconds), each rank keeps the longest step and the longest checkpoint
it has seen, and at every step boundary asks whether one more step would still leave time to
save: it stops when

    remaining < max_step + max_ckpt + buffer,  buffer = k1 · max_step + k2 · max_ckpt

(the seed's rule; k1 = 10 and k2 = 2 by default: ``--deadline-k-step``, ``--deadline-k-ckpt``).
Ranks agree on the stop step with one all-reduce (MAX) of their decision, so they stop together;
rank 0 then commits the final checkpoint with the atomic protocol and the attempt exits with
:data:`DEADLINE_EXIT_CODE`, which the supervisor records as ``deadline`` (not a failure).
``ecrl run --out SAME`` continues.

Before the first checkpoint has been timed, ``max_ckpt`` is an estimate from the state's size
(:func:`estimate_ckpt_s`): a deadline must be honoured before any checkpoint was ever taken.
"""

from __future__ import annotations

from dataclasses import dataclass

from ecrl.contract.errors import ConfigError
from ecrl.runtime.deadlinetime import SLURM_END_ENV, parse_deadline, resolve_deadline
from ecrl.runtime.endings import DEADLINE_MARKER
from ecrl.runtime.settings import DEFAULTS

__all__ = ["DEADLINE_EXIT_CODE", "DEADLINE_MARKER", "SLURM_END_ENV", "DeadlineRule",
           "DeadlineClock", "parse_deadline", "resolve_deadline", "estimate_ckpt_s"]

DEADLINE_EXIT_CODE = 75
"""EX_TEMPFAIL: stopped before the deadline with the final checkpoint committed; continue later."""


def estimate_ckpt_s(nbytes: int, *, bandwidth: float = 100e6, floor_s: float = 0.2) -> float:
    """A pessimistic guess of one checkpoint's time before any was measured."""
    return max(floor_s, nbytes / bandwidth)


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlineRule:
    """The buffer rule's multipliers (``--deadline-k-step`` and ``--deadline-k-ckpt``)."""

    k1: float = DEFAULTS.deadline_k_step
    """Multiplier of the longest step time in the buffer."""
    k2: float = DEFAULTS.deadline_k_ckpt
    """Multiplier of the longest checkpoint time in the buffer."""

    def __post_init__(self) -> None:
        if self.k1 < 0 or self.k2 < 0:
            raise ConfigError("--deadline-k-step and --deadline-k-ckpt must be >= 0")

    def reserve(self, max_step_s: float, max_ckpt_s: float) -> float:
        """Seconds that must remain before another step may start."""
        return (1 + self.k1) * max_step_s + (1 + self.k2) * max_ckpt_s


@dataclass(slots=True)
class DeadlineClock:
    """One rank's view: the longest step and checkpoint, and whether to stop now."""

    deadline: float
    rule: DeadlineRule
    max_step_s: float = 0.0
    max_ckpt_s: float = 0.0
    estimated_ckpt_s: float = 0.2
    last: float | None = None

    def step_done(self, now: float) -> None:
        if self.last is not None:
            self.max_step_s = max(self.max_step_s, now - self.last)
        self.last = now

    def checkpoint_took(self, seconds: float) -> None:
        self.max_ckpt_s = max(self.max_ckpt_s, seconds)

    @property
    def ckpt_s(self) -> float:
        return self.max_ckpt_s if self.max_ckpt_s > 0 else self.estimated_ckpt_s

    def should_stop(self, now: float) -> bool:
        return self.deadline - now < self.rule.reserve(self.max_step_s, self.ckpt_s)
