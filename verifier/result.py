"""Verification results as data: per-run verdicts, anomalies, warnings, lineage and metrics.

``PASS`` needs evidence: a run whose lineage checked nothing is ``UNKNOWN``, never ``PASS``
(:attr:`RunResult.checked` says what was checked). ``FAIL`` wins over ``UNKNOWN``: a witness
found in the readable part of the logs refutes the run whatever the unreadable part holds. A run
that has not finished (:class:`Unfinished`) is judged on its committed prefix: ``FAIL`` with a
witness there, else ``UNKNOWN`` with one reason while steps remain.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from verifier.anomalies import Anomaly, Note

__all__ = [
    "Verdict",
    "EXIT_CODES",
    "Metrics",
    "AttemptSummary",
    "Unfinished",
    "CheckpointPoint",
    "Series",
    "ReplayCheck",
    "SameOrder",
    "StateCheck",
    "RunResult",
    "VerifyResult",
    "combine_verdicts",
]

Verdict = Literal["PASS", "FAIL", "UNKNOWN"]
EXIT_CODES: Mapping[str, int] = {"PASS": 0, "FAIL": 1, "UNKNOWN": 2}


def combine_verdicts(verdicts: Sequence[str]) -> Verdict:
    """FAIL if any run failed, else UNKNOWN if any is unknown (or there is none), else PASS."""
    if "FAIL" in verdicts:
        return "FAIL"
    if not verdicts or "UNKNOWN" in verdicts:
        return "UNKNOWN"
    return "PASS"


@dataclass(frozen=True, kw_only=True, slots=True)
class Metrics:
    """Goodput and its decomposition, from the same pass that checks the logs."""

    committed_steps: int = 0
    """Distinct steps in the committed lineage."""
    restarts: int = 0
    """Attempts after the first."""
    replayed_steps: int = 0
    """Steps some attempt executed that are not in the committed lineage (recomputed work)."""
    tentative_steps: int = 0
    """Steps an unfinished final attempt ran after the last durable checkpoint (not committed
    yet: a continuation runs them again)."""
    wall_s: float | None = None
    """First attempt's start to last attempt's end (restarts and replays included)."""
    goodput: float | None = None
    """committed_steps / wall_s, in steps per second."""
    stall_s: float = 0.0
    """Training stopped for checkpoints (sum over checkpoint events)."""
    write_s: float = 0.0
    snapshot_s: float = 0.0
    enqueue_s: float = 0.0
    backpressure_s: float = 0.0
    checkpoints: int = 0
    """Checkpoint events recorded (all attempts)."""
    records: int = 0
    """Step records read (all attempts, replayed ones included)."""
    restart_s: float | None = None
    """Between an attempt's end and the next attempt's first completed step."""
    lost_s: float | None = None
    """Wall time of failed attempts after their last committed step (work thrown away)."""
    loss_max_abs_diff: float | None = None
    """Against ``--reference``: largest |loss - reference loss| over common steps."""
    loss_mean_abs_diff: float | None = None
    loss_steps_compared: int | None = None
    replayed_per_failure: tuple[int, ...] = ()
    """Replayed steps of each attempt a later one resumed, in attempt order (``jit``: at most
    one each)."""
    endings: Mapping[str, int] = field(default_factory=dict)
    """How the attempts a later one resumed ended: status → count (failed, jit, hung, deadline,
    stopped)."""

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["replayed_per_failure"] = list(self.replayed_per_failure)
        out["endings"] = dict(self.endings)
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptSummary:
    """One attempt as the verifier reconstructed it."""

    attempt: int
    world_size: int
    resumed_from_step: int | None
    status: str
    exit_code: int | None
    first_step: int | None
    """First step any rank logged."""
    last_step: int | None
    """Last step any rank logged."""
    committed: tuple[int, int] | None
    """Inclusive range of steps this attempt contributes to the committed lineage."""
    records: int
    replayed_steps: int
    tentative_steps: int
    """Unfinished final attempt: steps run after the last durable checkpoint."""
    start_time: float | None
    end_time: float | None

    def as_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in self.__dataclass_fields__}
        out["committed"] = list(self.committed) if self.committed else None
        return out


@dataclass(frozen=True, kw_only=True, slots=True)
class Unfinished:
    """A run that has not reached its target: stopped, still running, or given up.

    Only what the durable state (``latest.json``) says was committed is held to the proof
    obligations; the final attempt's records after it are tentative (a continuation runs those
    steps again). ``message`` is the one-line account for people.
    """

    status: str
    """The run's status in supervisor.json (or the final attempt's, when the run says
    completed but its final attempt does not)."""
    attempt: int
    """The final attempt."""
    last_step: int | None
    """Last step every rank of the final attempt logged (None: not one)."""
    durable_step: int | None
    """Step of the last durable checkpoint a continuation would resume from (None: none, it
    would start fresh)."""
    committed_steps: int
    """Steps 0..committed_steps-1 are the committed prefix held to every obligation."""
    target_steps: int
    message: str
    command: str = "run"
    """What continues the run: ``run`` (``ecrl run --out``), ``launch`` for a run ``ecrl
    launch`` supervises (its ``supervisor.json`` holds the launch), or ``standalone`` for one
    launched without either (the script, launched again, resumes)."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class ReplayCheck:
    """Replay consistency: the steps a failed attempt ran after its successor's resume point,
    recomputed by the successor, compared by global loss (sum over ranks of loss × local batch
    / B, in float64, in rank order)."""

    replayed_steps: int = 0
    """Steps a failed attempt logged after its successor's resume point that the successor ran
    again (with every rank's record on both sides)."""
    compared: int = 0
    """Of those, steps with a finite loss on both sides (the ones compared)."""
    exact: int = 0
    """Compared bit for bit: same world size and deterministic kernels."""
    tolerant: int = 0
    """Compared within ``tolerance``: another world size, or a run that declares
    ``"deterministic": false``."""
    tolerance: float = 0.0
    """Relative tolerance used for the tolerant comparisons."""
    max_rel_diff: float | None = None
    """Largest relative difference among the tolerant comparisons that passed."""

    @property
    def tested(self) -> bool:
        return self.compared > 0

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class StateCheck:
    """State digests (:mod:`verifier.state`): resumes whose loaded state was compared, object by
    object, with the digests their checkpoint recorded."""

    resumes_checked: int = 0
    objects_compared: int = 0
    unattested: tuple[int, ...] = ()
    """Attempts that resumed from a checkpoint with digests but wrote no ``restored.json``."""
    undigested: tuple[int, ...] = ()
    """Attempts that resumed from a checkpoint whose event records no digests (``sharded``,
    ``sharded-async`` and ``jit`` write none): their loaded state was not compared."""
    undigested_strategies: tuple[str, ...] = ()
    """The strategies that wrote those checkpoints (sorted, once each)."""
    matched: tuple[int, ...] = ()
    """Attempts whose loaded state matched every saved digest (not in the JSON: it explains a
    replay divergence, see :func:`verifier.explain.explain`)."""

    def as_dict(self) -> dict[str, Any]:
        return {"resumes_checked": self.resumes_checked,
                "objects_compared": self.objects_compared, "unattested": list(self.unattested),
                "undigested": list(self.undigested),
                "undigested_strategies": list(self.undigested_strategies)}


@dataclass(frozen=True, kw_only=True, slots=True)
class SameOrder:
    """``--same-order RUN2``: this run's global windows against another run's, step by step."""

    other: str
    steps_compared: int
    """Committed steps both runs have (0 .. steps_compared - 1)."""
    by_ids: bool
    """Compared as sets of sample IDs (both runs log IDs), else by count + multiset hash."""
    first_difference: int | None = None
    """First step whose global windows differ (None: every compared step agrees)."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointPoint:
    attempt: int
    step: int
    stall_s: float
    write_s: float
    snapshot_s: float
    time: float | None


@dataclass(frozen=True, kw_only=True, slots=True, eq=False)
class Series:
    """Per-step and per-event data for plots (kept only when a report or reference needs it)."""

    loss: npt.NDArray[np.float64] | None = None
    """Mean loss over ranks of each committed step (NaN where unknown); index = global step."""
    reference_loss: npt.NDArray[np.float64] | None = None
    timeline: Sequence[tuple[int, npt.NDArray[np.float64], npt.NDArray[np.int64]]] = ()
    """Per attempt: (attempt, times, steps) of a subsample of its lowest rank's records."""
    checkpoints: Sequence[CheckpointPoint] = ()
    start_time: float | None = None
    window_hash: npt.NDArray[np.uint64] | None = None
    """``--same-order``: per committed step, the multiset hash of its global window."""
    window_count: npt.NDArray[np.int64] | None = None
    """``--same-order``: per committed step, the samples its ranks consumed in all."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResult:
    """The verdict on one run directory and everything that supports it."""

    path: str
    verdict: Verdict
    anomalies: tuple[Anomaly, ...] = ()
    """Witnesses, capped per kind (``anomaly_counts`` has the full scope)."""
    anomaly_counts: Mapping[str, int] = field(default_factory=dict)
    warnings: tuple[Note, ...] = ()
    unknown: tuple[str, ...] = ()
    """Why the logs cannot support a verdict (empty unless UNKNOWN, or FAIL cut short)."""
    checked: Mapping[str, int] = field(default_factory=dict)
    """What was actually checked (records, committed steps, shards, epochs, …)."""
    metrics: Metrics = field(default_factory=Metrics)
    lineage: tuple[AttemptSummary, ...] = ()
    log_ids: bool | None = None
    unfinished: Unfinished | None = None
    """Set when the run has not finished (its verdict then covers the committed prefix)."""
    series: Series | None = None
    windows_checked: bool = True
    """Whether every shard was compared with ECRL's window (False: an external sampler's run,
    audited without windows; its PASS proves exactly-once consumption, not the order)."""
    sampler: Mapping[str, Any] | None = None
    """``run.json``'s ``sampler`` (None: absent, ECRL's own)."""
    replay: ReplayCheck | None = None
    same_order: SameOrder | None = None
    state: StateCheck | None = None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "verdict": self.verdict,
            "windows_checked": self.windows_checked,
            "sampler": dict(self.sampler) if self.sampler is not None else None,
            "replay": self.replay.as_dict() if self.replay is not None else None,
            "same_order": self.same_order.as_dict() if self.same_order is not None else None,
            "state": self.state.as_dict() if self.state is not None else None,
            "anomalies": [a.as_dict() for a in self.anomalies],
            "anomaly_counts": dict(self.anomaly_counts),
            "warnings": [w.as_dict() for w in self.warnings],
            "unknown": list(self.unknown),
            "checked": dict(self.checked),
            "metrics": self.metrics.as_dict(),
            "lineage": [a.as_dict() for a in self.lineage],
            "log_ids": self.log_ids,
            "unfinished": self.unfinished.as_dict() if self.unfinished else None,
        }


@dataclass(frozen=True, kw_only=True, slots=True)
class VerifyResult:
    """The verdict on PATH: every run found under it."""

    path: str
    runs: tuple[RunResult, ...]
    unknown: tuple[str, ...] = ()
    """Problems with PATH itself (nothing to verify there)."""

    @property
    def verdict(self) -> Verdict:
        if self.unknown and not any(r.verdict == "FAIL" for r in self.runs):
            return "UNKNOWN"
        return combine_verdicts([r.verdict for r in self.runs])

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "path": self.path,
            "unknown": list(self.unknown),
            "runs": [r.as_dict() for r in self.runs],
        }
