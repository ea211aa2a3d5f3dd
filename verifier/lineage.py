"""The committed lineage: which attempt's records count as progress, for which steps.

Attempt ``k`` that resumed from the checkpoint at step ``c`` continues the history of the attempt
that *wrote* that checkpoint. Walking back from the final attempt through "loaded the checkpoint
written by" links gives the chain of attempts whose work the final model carries. An attempt on
the chain should run steps ``lo = c + 1`` (0 after a fresh start) up to ``hi``, the step of the
checkpoint its successor on the chain loaded (the final attempt: to its end). Every record it
logged up to ``hi`` is committed, so a step below ``lo`` run again is a duplicate, never ignored.
Records of a chain attempt beyond ``hi``, and every record of an attempt off the chain, are
replayed work.

In every run where each attempt resumes from the newest durable checkpoint — what the supervisor
does — the writer is the previous attempt (or an earlier one, when the previous attempt wrote no
checkpoint), and this is exactly ARCHITECTURE.md's rule: "the records of each failed attempt up to
and including the step its successor resumed from, and all records of the final attempt". The
chain only differs when an attempt resumed from a checkpoint older than its predecessor's own
starting point; then the predecessor's work is thrown away, not committed twice.

Which checkpoints exist is read from the checkpoint events (``checkpoint_rank0.jsonl``): a resume
from a step no earlier attempt recorded a checkpoint at is an ``unknown_checkpoint`` anomaly, and
the lineage falls back to the previous attempt so that the rest of the check stays meaningful.
One exception: the ``blocking`` strategy logs its event just after publishing ``latest.json``, so
a crash in between leaves a real checkpoint without an event. The supervisor verifies every
checkpoint it resumes from and records it in ``supervisor.json`` (``resume_points``); a resume
point so attested is accepted, with a warning, its writer being the newest earlier attempt that
ran that step.

*Unfinished runs.* A run that was stopped (Ctrl-C, SIGTERM), is still running, or gave up at the
restart limit has no final attempt that completed. Its final attempt is treated exactly like a
failed one: the walk starts from the attempt a continuation (``ecrl run --out RUN``) would launch,
which resumes from the checkpoint ``latest.json`` names — the durable state. Every attempt then
has a bound ``hi``; the final attempt's records after it are *tentative*: a continuation runs
those steps again, so they are never committed, but they are still held to the per-record checks
(shard, cursor, hash) because they are what the run is consuming now.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from ecrl.contract.runformat import SupervisorAttempt
from verifier.anomalies import Anomaly, Note
from verifier.schema import CheckpointRecord, RunInputs, torn_tail_ok

__all__ = ["AttemptPlan", "Lineage", "build_lineage", "lineage_of", "is_finished",
           "durable_step"]


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptPlan:
    """What one attempt is expected to contribute, before its logs are read."""

    attempt: int
    world_size: int
    resumed_from: int | None
    """Step of the checkpoint it loaded (None: fresh start)."""
    writer: int | None
    """Attempt whose checkpoint it loaded."""
    on_chain: bool
    """Whether the final model carries this attempt's work."""
    lo: int
    """First step it commits (``resumed_from + 1``, or 0)."""
    hi: int | None
    """Last step it commits; None for the final attempt of a finished run (no bound)."""
    tentative: bool
    """The final attempt of an unfinished run: its records not committed are tentative (held to
    the per-record checks, never committed)."""
    torn_ok: bool
    """Whether a torn last line is expected (the attempt did not complete)."""
    status: str
    exit_code: int | None

    def committed(self, step: int) -> bool:
        """Whether a record of ``step`` in this attempt's logs belongs to the lineage.

        No lower bound: a chain attempt that runs a step below ``lo`` (the checkpoint's step or
        earlier) consumed that data again in the history the final model carries.
        """
        return self.on_chain and (self.hi is None or step <= self.hi)

    @property
    def commits_anything(self) -> bool:
        return self.on_chain and (self.hi is None or self.hi >= self.lo)


@dataclass(frozen=True, kw_only=True, slots=True)
class Lineage:
    plans: tuple[AttemptPlan, ...]
    anomalies: tuple[Anomaly, ...]
    notes: tuple[Note, ...]
    finished: bool = True
    """False: the run has not reached its target (see the module docstring)."""
    durable: int | None = None
    """Unfinished runs: the step a continuation would resume from (None: it starts fresh)."""

    @property
    def chain(self) -> list[AttemptPlan]:
        """Attempts on the committed chain, oldest first."""
        return [p for p in self.plans if p.on_chain]


def _writer(checkpoints: Mapping[int, Sequence[CheckpointRecord]], step: int, before: int
            ) -> int | None:
    for attempt in range(before - 1, -1, -1):
        if any(r.event.global_step == step for r in checkpoints.get(attempt, ())):
            return attempt
    return None


def is_finished(inputs: RunInputs) -> bool:
    """Whether supervisor.json says the run, and its final attempt, completed."""
    state = inputs.supervisor
    return state.status == "completed" and state.attempts[-1].status == "completed"


def durable_step(inputs: RunInputs) -> tuple[int | None, Note | None]:
    """The step a continuation of ``inputs``' run would resume from, and a note when the
    checkpoint events do not back ``latest.json``.

    ``latest.json`` is what the supervisor resumes from. Its checkpoint event is written just
    after it is published, so a run stopped (or read) in between has a pointer one checkpoint
    ahead of the events; the newest recorded checkpoint before it is then taken, which claims
    less, never more, than is durable. Without ``latest.json`` nothing is durable.
    """
    recorded = sorted({r.event.global_step for events in inputs.checkpoints.values()
                       for r in events})
    latest = inputs.latest
    if latest is None:
        if not recorded:
            return None, None
        if os.path.lexists(inputs.paths.latest):
            return recorded[-1], Note(
                kind="latest", file="checkpoints/latest.json",
                message=f"unreadable: the newest recorded checkpoint, step {recorded[-1]}, is "
                        "taken as the last durable one")
        return None, Note(
            kind="latest", file="checkpoints/latest.json",
            message=f"missing although checkpoints were recorded (the newest at step "
                    f"{recorded[-1]}): a continuation starts fresh, so nothing is committed")
    if latest.global_step in recorded:
        return latest.global_step, None
    older = [s for s in recorded if s < latest.global_step]
    fallback = older[-1] if older else None
    return fallback, Note(
        kind="latest", file="checkpoints/latest.json",
        message=f"the run is unfinished and no checkpoint event backs step "
                f"{latest.global_step}: "
                + (f"the newest recorded checkpoint before it, step {fallback}, is taken as the "
                   "last durable one" if fallback is not None
                   else "no checkpoint is taken as durable"))


def lineage_of(inputs: RunInputs) -> Lineage:
    """The committed lineage of a run, finished or not (the module docstring has the rule)."""
    attempts, checkpoints = inputs.supervisor.attempts, inputs.checkpoints
    attested = attested_resume_points(inputs.supervisor.extra)
    if is_finished(inputs):
        return build_lineage(attempts, checkpoints, attested=attested)
    durable, note = durable_step(inputs)
    lineage = build_lineage(attempts, checkpoints, finished=False, durable=durable,
                            attested=attested)
    if note is None:
        return lineage
    return Lineage(plans=lineage.plans, anomalies=lineage.anomalies,
                   notes=(note, *lineage.notes), finished=False, durable=durable)


def attested_resume_points(extra: Mapping[str, object]) -> dict[int, int]:
    """``supervisor.json``'s ``resume_points``: attempt → the step of the checkpoint the
    supervisor verified before launching it (malformed entries are ignored)."""
    found: dict[int, int] = {}
    points = extra.get("resume_points")
    if isinstance(points, dict):
        for key, point in points.items():
            step = point.get("global_step") if isinstance(point, dict) else None
            if isinstance(key, str) and key.isdigit() and isinstance(step, int) \
                    and not isinstance(step, bool):
                found[int(key)] = step
    return found


def _ran(attempts: Sequence[SupervisorAttempt], step: int, before: int) -> int | None:
    """The newest attempt before ``before`` that completed ``step`` (per supervisor.json)."""
    for a in reversed([a for a in attempts if a.attempt < before]):
        if a.first_step is not None and a.last_step is not None \
                and a.first_step <= step <= a.last_step:
            return a.attempt
    return None


def build_lineage(attempts: Sequence[SupervisorAttempt],
                  checkpoints: Mapping[int, Sequence[CheckpointRecord]], *,
                  finished: bool = True, durable: int | None = None,
                  attested: Mapping[int, int] | None = None) -> Lineage:
    """Rebuild the chain of attempts from ``supervisor.json`` and the checkpoint events.

    ``finished=False``: the final attempt did not complete; the chain is walked back from a
    continuation that resumes from ``durable`` (None: it would start fresh, nothing is
    committed).
    """
    anomalies: list[Anomaly] = []
    notes: list[Note] = []
    bounds: dict[int, tuple[int, int | None, int | None]] = {}
    by_number = {a.attempt: a for a in attempts}
    # Numbers may skip a stray log folder (verifier.schema): "the attempt before" is the one
    # listed before, not the number before.
    before = {b.attempt: a.attempt for a, b in pairwise(attempts)}
    final = attempts[-1].attempt
    k: int | None = final
    hi: int | None = None
    if not finished:
        hi = durable
        # The pointer's step is recorded (durable_step makes sure); its writer is the newest
        # attempt that recorded it.
        k = None if durable is None else _writer(checkpoints, durable, final + 1)
        if durable is not None and k is None:
            k = final
    top = k
    while k is not None:
        c = by_number[k].resumed_from_step
        lo = 0 if c is None else c + 1
        if c is None:
            bounds[k] = (lo, hi, None)
            break
        writer = _writer(checkpoints, c, k)
        if writer is None and (attested or {}).get(k) == c:
            writer = _ran(attempts, c, k)
            if writer is not None:
                notes.append(Note(
                    kind="attested_checkpoint", file="supervisor.json",
                    message=f"attempt {k} resumed from step {c}, which has no checkpoint event "
                            "(its writer died between publishing latest.json and logging the "
                            f"event); that checkpoint was verified against its checksum for "
                            f"attempt {k}, and attempt {writer} ran step {c}"))
        if writer is None:
            recorded = sorted({r.event.global_step for j in range(k)
                               for r in checkpoints.get(j, ())})
            anomalies.append(Anomaly(
                kind="unknown_checkpoint", file="supervisor.json", attempt=k, step=c,
                expected="a checkpoint event at step " + str(c), actual="none",
                evidence={"recorded": recorded[-8:]}))
            writer = before.get(k)
        bounds[k] = (lo, hi, writer)
        hi = c
        k = writer
    for a in attempts:
        if a.attempt in bounds:
            continue
        later = min((j for j in bounds if j > a.attempt), default=None)
        if later is not None:
            loaded = by_number[later].resumed_from_step
            why = (f"attempt {later} " + (
                "started fresh" if loaded is None else
                f"resumed from step {loaded}, a checkpoint of attempt {bounds[later][2]}"))
        elif durable is None:
            why = "the run is unfinished and has no durable checkpoint, so a continuation " \
                  "starts fresh"
        else:
            why = (f"the run is unfinished and a continuation resumes from step {durable}, a "
                   f"checkpoint of attempt {top}")
        fate = ("all of its steps are tentative" if not finished and a.attempt == final
                else f"all of attempt {a.attempt}'s steps count as replayed")
        notes.append(Note(kind="off_chain", file="supervisor.json",
                          message=f"attempt {a.attempt} is not in the committed lineage: "
                                  f"{why}; {fate}"))
    for a in attempts:
        if a.attempt > 0 and a.resumed_from_step is None and any(
                checkpoints.get(j) for j in range(a.attempt)):
            notes.append(Note(
                kind="fresh_restart", file="supervisor.json",
                message=f"attempt {a.attempt} started fresh although earlier attempts recorded "
                        "checkpoints; their progress was thrown away"))
        prev = before.get(a.attempt, -1)
        here = a.resumed_from_step
        there = by_number[prev].resumed_from_step if prev >= 0 else None
        if here is not None and there is not None and here < there:
            notes.append(Note(
                kind="resume_backwards", file="supervisor.json",
                message=f"attempt {a.attempt} resumed from step {here}, before the step "
                        f"{there} attempt {prev} resumed from"))
    plans = []
    for a in attempts:
        on_chain = a.attempt in bounds
        start = 0 if a.resumed_from_step is None else a.resumed_from_step + 1
        lo, hi_k, writer = bounds.get(a.attempt, (start, start - 1, None))
        plans.append(AttemptPlan(
            attempt=a.attempt, world_size=a.world_size, resumed_from=a.resumed_from_step,
            writer=writer, on_chain=on_chain, lo=lo, hi=hi_k,
            tentative=not finished and a.attempt == final, torn_ok=torn_tail_ok(a),
            status=a.status, exit_code=a.exit_code))
    return Lineage(plans=tuple(plans), anomalies=tuple(anomalies), notes=tuple(notes),
                   finished=finished, durable=durable if not finished else None)
