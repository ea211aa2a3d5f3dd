"""``ecrl advise``: how often to checkpoint, from the failure models in the seed papers.

Inputs (seconds unless said otherwise): the cost ``o`` of one checkpoint, the fixed cost ``r`` of a
recovery (restart, load, re-initialise), the time ``m`` of one training step, the failure rate
``f`` of one GPU, the number of GPUs ``N`` and, for CheckHint's budget, the allowance (a fraction of
the compute time that checkpointing may cost) and the job's length.

The job fails at rate ``λ = N·f`` (any GPU failing stops the job), so its MTBF is ``M = 1/λ``.

- Young (1974): checkpoint every ``τ = √(2·o·M)``.
- Daly (2006), the higher-order estimate: ``τ = √(2oM)·(1 + ⅓·√(o/2M) + ⅑·(o/2M)) − o`` while
  ``o < 2M``, else ``τ = M``.
- Just-in-time checkpointing (seed ``004_…`` §5): periodic checkpointing at its optimal frequency
  ``c* = √(N·f / 2o)`` wastes ``w* = 2·√(N·f·o/2) + N·f·r`` of each GPU's time per unit of useful
  time; the wasted fraction is ``w/(1+w)``. User-level JIT checkpointing instead pays one
  checkpoint per failure and replays half a step: ``w_jit = f·o + N·f·r + N·f·m/2`` (the
  interception overhead, measured as nearly zero, is left out). ``1/c*`` equals Young's interval.
- CheckHint (seed ``001_…`` §2): a program of total time ``T`` may hold
  ``ℓ = ⌈allowance·T / o⌉`` checkpoints (:func:`transform.schedule.checkpoint_budget`, the
  function ``ecrl-transform`` schedules with).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ecrl.contract.errors import ConfigError
from transform.schedule import checkpoint_budget

__all__ = ["AdviceInput", "Advice", "advise", "render_text"]

SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True, kw_only=True, slots=True)
class AdviceInput:
    """What the models need; every time in seconds."""

    ckpt_cost: float
    """o: training time lost to one checkpoint (the stall, not the background write)."""
    restore_cost: float
    """r: fixed cost of one recovery (detect, relaunch, load the checkpoint)."""
    step_time: float
    """m: duration of one training step."""
    gpu_failure_rate: float
    """f: failures per second of one GPU."""
    gpus: int
    """N: GPUs in the job."""
    overhead: float
    """CheckHint allowance: fraction of compute time checkpoints may cost."""
    job_seconds: float
    """Useful compute time of the job, for CheckHint's budget."""

    def __post_init__(self) -> None:
        positive = {"--ckpt-cost": self.ckpt_cost, "--step-time": self.step_time,
                    "failure rate": self.gpu_failure_rate, "--job-hours": self.job_seconds}
        for flag, value in positive.items():
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag} must be a positive number, got {value!r}")
        if not (math.isfinite(self.restore_cost) and self.restore_cost >= 0):
            raise ConfigError(f"--restore-cost must be ≥ 0, got {self.restore_cost!r}")
        if isinstance(self.gpus, bool) or not isinstance(self.gpus, int) or self.gpus < 1:
            raise ConfigError(f"--gpus must be a positive integer, got {self.gpus!r}")
        if not (math.isfinite(self.overhead) and 0 <= self.overhead <= 1):
            raise ConfigError(f"--overhead is a fraction in [0, 1], got {self.overhead!r}")


@dataclass(frozen=True, kw_only=True, slots=True)
class Advice:
    job_mtbf_s: float
    young_interval_s: float
    daly_interval_s: float
    c_star_per_hour: float
    periodic_wasted_fraction: float
    jit_wasted_fraction: float
    checkhint_budget: int
    ckpt_every_steps: int
    """Daly's interval in steps, at least 1: a value for ``ecrl run --ckpt-every``."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "young_interval_s": self.young_interval_s,
            "daly_interval_s": self.daly_interval_s,
            "periodic": {"c_star_per_hour": self.c_star_per_hour,
                         "wasted_fraction": self.periodic_wasted_fraction},
            "jit": {"wasted_fraction": self.jit_wasted_fraction},
            "checkhint_budget": self.checkhint_budget,
            "job_mtbf_s": self.job_mtbf_s,
            "ckpt_every_steps": self.ckpt_every_steps,
        }


def advise(given: AdviceInput) -> Advice:
    o, r, m = given.ckpt_cost, given.restore_cost, given.step_time
    job_rate = given.gpus * given.gpu_failure_rate
    mtbf = 1.0 / job_rate
    young = math.sqrt(2.0 * o * mtbf)
    if o < 2.0 * mtbf:
        ratio = o / (2.0 * mtbf)
        daly = young * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - o
    else:
        daly = mtbf
    c_star = math.sqrt(job_rate / (2.0 * o))
    wasted = 2.0 * math.sqrt(job_rate * o / 2.0) + job_rate * r
    wasted_jit = given.gpu_failure_rate * o + job_rate * r + job_rate * m / 2.0
    budget = checkpoint_budget(total_time=given.job_seconds, overhead=given.overhead,
                               ckpt_cost=o)
    return Advice(
        job_mtbf_s=mtbf,
        young_interval_s=young,
        daly_interval_s=daly,
        c_star_per_hour=c_star * 3600.0,
        periodic_wasted_fraction=wasted / (1.0 + wasted),
        jit_wasted_fraction=wasted_jit / (1.0 + wasted_jit),
        checkhint_budget=budget,
        ckpt_every_steps=max(1, round(daly / m)),
    )


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s"


def render_text(given: AdviceInput, advice: Advice) -> str:
    return "\n".join([
        f"job: {given.gpus} GPUs, MTBF {_duration(advice.job_mtbf_s)} "
        f"(one GPU fails every {_duration(1 / given.gpu_failure_rate)})",
        f"checkpoint interval: Young {_duration(advice.young_interval_s)}, "
        f"Daly {_duration(advice.daly_interval_s)} "
        f"(≈ --ckpt-every {advice.ckpt_every_steps} at {given.step_time:g} s/step)",
        f"periodic at the optimum: {advice.c_star_per_hour:.3g} checkpoints/hour, "
        f"{100 * advice.periodic_wasted_fraction:.3g}% of GPU time wasted",
        f"just-in-time checkpointing: {100 * advice.jit_wasted_fraction:.3g}% wasted",
        f"CheckHint budget: {advice.checkhint_budget} checkpoints for "
        f"{_duration(given.job_seconds)} of compute at {100 * given.overhead:g}% allowance",
    ])
