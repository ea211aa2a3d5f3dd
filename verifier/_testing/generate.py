"""A torch-free run generator: run directories exactly as ``ecrl run`` writes them.

Given a :class:`RunSpec` (geometry, world size per attempt, failure steps, checkpoint interval,
strategy, ID or hash logging), :func:`generate_run` simulates the supervisor and the trainer's
step timeline and writes ``run.json``, ``supervisor.json``, every rank's step log, the checkpoint
events and ``latest.json`` through :mod:`ecrl.contract.runformat` and
:class:`~ecrl.contract.runformat.RunPaths`. Shards and hashes come from
:mod:`ecrl.contract.semantics`, so a generated run is correct by construction: the verifier must
pass every one (``tests/verifier/test_verify_properties.py``), and the mutation catalogue
(:mod:`verifier._mutations`) breaks them in known ways.

What a failure leaves behind, as in the runtime: attempt ``i`` fails after step ``fail_at[i]``
(after any checkpoint due at that step). Its failing rank logged that step; the other ranks may
have logged fewer steps (``lag``), never fewer than the newest checkpoint, whose barrier they
passed; a rank's file may end with a torn line (``torn``); with the ``overlapped`` strategy the
write of the last checkpoint may not have become durable (``lost_writes``), so the next attempt
resumes from the one before. The next attempt resumes after the newest durable checkpoint, at
the next world size, or from step 0 when there is none.

An *unfinished* run (``stop_at``) ends with a final attempt that did not complete: ``stopped``
(Ctrl-C: ranks stop mid-step, so some logged one step fewer, and a line may be torn), still
``running`` (supervisor.json has no end yet), or ``failed`` (a crash after which the supervisor
gave up at its restart limit). What is durable (``latest.json``, the checkpoint events) is
exactly what a continuation would resume from.

``writer="bulk"`` writes the same bytes (a test compares them) with one ``write`` per block of
records instead of one per record, for benchmark runs of millions of records.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
import numpy.typing as npt
import orjson

from ecrl.contract import semantics
from ecrl.contract.runformat import (
    SCHEMA_VERSION,
    STRATEGIES,
    CheckpointEvent,
    JsonlWriter,
    LatestPointer,
    RunManifest,
    RunPaths,
    StepRecord,
    SupervisorAttempt,
    SupervisorState,
    write_json_record,
)
from verifier.errors import VerifierError

__all__ = ["RunSpec", "AttemptPlanned", "GeneratedRun", "generate_run", "plan_run",
           "committed_steps", "external_window", "state_digests", "STATE_OBJECTS"]

T0 = 1_795_392_000.0
"""Wall-clock start of generated runs (2026-11-22, as in docs/run-format.md)."""
_EXIT_CODES: dict[str, int | None] = {"completed": 0, "failed": 137, "stopped": 1,
                                      "running": None}
"""An attempt's exit code by status (a stopped torchrun exits 1; a running one has none yet)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSpec:
    """What run to generate. Every choice left to chance is drawn from ``chaos``."""

    dataset_size: int = 40
    """D."""
    global_batch: int = 4
    """B; every world size must divide it."""
    target_steps: int = 30
    """T: committed steps the run reaches."""
    seed: int = 0
    """Permutation seed."""
    world_sizes: tuple[int, ...] = (2,)
    """World size of attempt 0, 1, …; the last repeats."""
    fail_at: tuple[int, ...] = ()
    """Attempt i fails after global step fail_at[i] (strictly increasing, below T - 1)."""
    ckpt_every: int = 5
    """Checkpoint after steps g with (g + 1) % K == 0 (0: never)."""
    strategy: str = "blocking"
    log_ids: bool = True
    """Log full sample IDs (else count + hash only)."""
    chaos: int = 0
    """Seed for the per-failure choices below."""
    lag: bool = True
    """Ranks of a failed attempt may have logged fewer steps than the failing rank."""
    torn: bool = True
    """A failed attempt's rank files may end with a torn line."""
    lost_writes: bool = True
    """overlapped: the last checkpoint write before a failure may not have become durable."""
    step_s: float = 0.05
    """Seconds per step."""
    restart_s: float = 3.0
    """Seconds from a failure to the next attempt's start."""
    loss_noise: float = 0.0
    """Extra per-step loss noise (drawn from ``chaos``), for divergence tests."""
    writer: Literal["runformat", "bulk"] = "runformat"
    stop_at: int | None = None
    """The final attempt does not complete: its last step is this one (None: it completes)."""
    end: Literal["stopped", "running", "failed"] = "stopped"
    """How an unfinished run (``stop_at``) ends: stopped by Ctrl-C or SIGTERM, still running,
    or failed (the supervisor gave up at its restart limit)."""
    sampler: Literal["ecrl", "external"] = "ecrl"
    """``external``: the run is fed by a stand-in for a user's sampler (:func:`external_window`,
    not ECRL's order), and run.json says so; the verifier can only audit it."""
    epoch_coverage: Literal["all", "drop_remainder"] = "all"
    """External sampler: run.json's ``sampler.epoch_coverage``."""
    steps_per_epoch: int | None = None
    """External sampler: the loop's steps per epoch (None: D // B). More than D // B pads each
    epoch by wrapping around its order (as ``DistributedSampler(drop_last=False)`` does)."""
    deterministic: bool | None = None
    """Written to run.json as ``deterministic`` when set."""
    digests: bool = False
    """Checkpoint events carry state digests per saved object, and every resumed attempt writes
    ``restored.json`` with the digests of the checkpoint it loaded (:func:`state_digests`)."""
    tp_sizes: tuple[int, ...] = ()
    """A mesh run: the tensor-parallel degree of attempt 0, 1, … (the last repeats); the
    data-parallel degree is W / TP, ranks laid out as ``MeshCoords.of_rank`` lays them out, and
    records and run.json name the mesh. Empty: plain DDP (records name no mesh)."""

    def __post_init__(self) -> None:
        try:
            geometry = semantics.Geometry(dataset_size=self.dataset_size,
                                          global_batch=self.global_batch)
            if self.tp_sizes:
                for k in range(max(len(self.world_sizes), len(self.tp_sizes))):
                    dp = semantics.data_parallel_degree(self.world_size_of(k), self.tp_of(k))
                    semantics.mesh_local_batch(self.global_batch, dp)
            for w in self.world_sizes if not self.tp_sizes else ():
                geometry.local_batch(w)
        except semantics.SemanticsError as exc:
            raise VerifierError(f"RunSpec: {exc}") from None
        if not self.world_sizes:
            raise VerifierError("RunSpec: world_sizes needs at least one entry")
        if self.target_steps < 1:
            raise VerifierError("RunSpec: target_steps must be at least 1")
        if any(b <= a for a, b in zip(self.fail_at, self.fail_at[1:], strict=False)):
            raise VerifierError(f"RunSpec: fail_at must increase strictly, got {self.fail_at}")
        if any(f < 0 or f >= self.target_steps - 1 for f in self.fail_at):
            raise VerifierError(f"RunSpec: fail_at steps must lie in [0, {self.target_steps - 2}]"
                                f", got {self.fail_at}")
        if self.ckpt_every < 0:
            raise VerifierError("RunSpec: ckpt_every must be >= 0")
        if self.strategy not in STRATEGIES:
            raise VerifierError(f"RunSpec: strategy must be one of {STRATEGIES}")
        if self.stop_at is not None and not (
                max(self.fail_at, default=-1) < self.stop_at < self.target_steps):
            raise VerifierError(f"RunSpec: stop_at must lie after the last fail_at step and "
                                f"below target_steps {self.target_steps}, got {self.stop_at}")
        if self.end not in ("stopped", "running", "failed"):
            raise VerifierError("RunSpec: end must be stopped, running or failed")
        if self.sampler not in ("ecrl", "external"):
            raise VerifierError("RunSpec: sampler must be ecrl or external")
        if self.tp_sizes and self.sampler != "ecrl":
            raise VerifierError("RunSpec: a mesh run (tp_sizes) needs ECRL's sampler")
        if self.steps_per_epoch is not None and (self.sampler != "external"
                                                 or self.steps_per_epoch < 1):
            raise VerifierError("RunSpec: steps_per_epoch is for an external sampler, >= 1")

    @property
    def epoch_steps(self) -> int:
        """S as run.json declares it."""
        return self.steps_per_epoch or self.dataset_size // self.global_batch

    @property
    def finished(self) -> bool:
        return self.stop_at is None

    @property
    def run_status(self) -> str:
        """supervisor.json's status for the run (and for its final attempt)."""
        return "completed" if self.stop_at is None else self.end

    @property
    def geometry(self) -> semantics.Geometry:
        return semantics.Geometry(dataset_size=self.dataset_size, global_batch=self.global_batch)

    def world_size_of(self, attempt: int) -> int:
        return self.world_sizes[min(attempt, len(self.world_sizes) - 1)]

    def tp_of(self, attempt: int) -> int:
        """The tensor-parallel degree of ``attempt`` (1 off a mesh)."""
        return self.tp_sizes[min(attempt, len(self.tp_sizes) - 1)] if self.tp_sizes else 1

    def coords(self, attempt: int, rank: int) -> semantics.MeshCoords | None:
        """Where ``rank`` of ``attempt`` sits on its mesh (None: a DDP run)."""
        if not self.tp_sizes:
            return None
        return semantics.MeshCoords.of_rank(rank, self.world_size_of(attempt),
                                            tp_size=self.tp_of(attempt))

    def checkpoint_due(self, step: int) -> bool:
        return self.strategy != "none" and self.ckpt_every > 0 \
            and (step + 1) % self.ckpt_every == 0


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptPlanned:
    """One simulated attempt: what every rank ran and logged."""

    attempt: int
    world_size: int
    resumed_from: int | None
    start: int
    """First step (resumed_from + 1, or 0)."""
    last: int
    """Last step the attempt completed (the failure step, the stop step, or T - 1)."""
    failed: bool
    """The attempt did not complete (a failure, or the end of an unfinished run)."""
    status: str
    """Its status in supervisor.json."""
    rank_last: tuple[int, ...]
    """Last step each rank logged (start - 1: none)."""
    torn: tuple[bool, ...]
    """Whether each rank's file ends with a torn line."""
    checkpoints: tuple[int, ...]
    """Steps of the durable checkpoints it wrote."""
    lost: int | None
    """Step of a checkpoint write that never became durable."""
    committed_hi: int = -1
    """Last step it commits (below ``start``: none), known once the next attempt started."""


@dataclass(frozen=True, kw_only=True, slots=True)
class GeneratedRun:
    root: Path
    spec: RunSpec
    attempts: tuple[AttemptPlanned, ...]
    records: int
    """Step records written (torn lines excluded)."""
    committed_records: int = 0
    replayed_steps: int = 0
    tentative_steps: int = 0
    """Unfinished runs: steps the final attempt ran after the last durable checkpoint."""
    durable_step: int | None = None
    """Step of the newest durable checkpoint (what a continuation resumes from)."""

    @property
    def paths(self) -> RunPaths:
        return RunPaths.of(self.root)


def plan_run(spec: RunSpec) -> list[AttemptPlanned]:
    """Simulate the supervisor: which steps each attempt and rank ran."""
    rng = random.Random(spec.chaos)
    attempts: list[AttemptPlanned] = []
    durable: list[int] = []
    resume: int | None = None
    final = len(spec.fail_at)
    for k in range(final + 1):
        w = spec.world_size_of(k)
        start = 0 if resume is None else resume + 1
        if k < final:
            failed, status, last = True, "failed", spec.fail_at[k]
        elif spec.stop_at is not None:
            failed, status, last = True, spec.end, spec.stop_at
        else:
            failed, status, last = False, "completed", spec.target_steps - 1
        last = max(last, start)  # a failure step already passed fires after the first step
        due = [g for g in range(start, last + 1) if spec.checkpoint_due(g)]
        lost = None
        if failed and due and spec.strategy == "overlapped" and spec.lost_writes \
                and rng.random() < 0.5:
            lost = due.pop()
        durable += due
        floor = max(due) if due else start - 1
        if failed:
            failing = rng.randrange(w)
            # A crash leaves peers up to two steps behind; a stop (or a look at a running job)
            # lands mid-step, so a rank is at most one step behind.
            behind = 2 if status == "failed" else 1
            rank_last = tuple(
                last if r == failing or not spec.lag
                else rng.randint(max(floor, last - behind), last)
                for r in range(w))
            torn = tuple(spec.torn and rng.random() < 0.4 for _ in range(w))
        else:
            rank_last = (last,) * w
            torn = (False,) * w
        attempts.append(AttemptPlanned(
            attempt=k, world_size=w, resumed_from=resume, start=start, last=last, failed=failed,
            status=status, rank_last=rank_last, torn=torn, checkpoints=tuple(due), lost=lost))
        resume = max(durable) if durable else None
    out = []
    for i, a in enumerate(attempts):
        if i + 1 == len(attempts) and not a.failed:
            hi = a.last
        else:
            # A failed attempt commits up to where its successor resumed; an unfinished final
            # attempt up to where a continuation would resume (the newest durable checkpoint).
            nxt = attempts[i + 1].resumed_from if i + 1 < len(attempts) else resume
            hi = nxt if nxt is not None and nxt >= a.start else a.start - 1
        out.append(replace(a, committed_hi=hi))
    return out


def _loss(spec: RunSpec, step: int, rng_noise: float) -> float:
    base = 2.3 * math.exp(-3.0 * step / max(1, spec.target_steps)) + 0.1
    wobble = 0.05 * math.sin(step * 0.7 + spec.seed)
    return round(base + wobble + rng_noise, 6)


def generate_run(spec: RunSpec, root: str | Path) -> GeneratedRun:
    """Write the run directory for ``spec`` under ``root`` (created; must not hold a run)."""
    paths = RunPaths.of(root)
    if paths.manifest.exists():
        raise VerifierError(f"{paths.root}: already holds a run; generate into a new directory")
    geometry = spec.geometry
    attempts = plan_run(spec)
    rng = random.Random(spec.chaos ^ 0x5EED)
    noise: dict[int, float] = {}
    extra: dict[str, object] = {}
    if spec.deterministic is not None:
        extra["deterministic"] = spec.deterministic
    manifest = RunManifest(
        seed=spec.seed, dataset={"name": "generated", "size": spec.dataset_size},
        global_batch=spec.global_batch, steps_per_epoch=spec.epoch_steps,
        sampler=({"kind": "external", "name": "tests.ShuffledSampler",
                  "epoch_coverage": spec.epoch_coverage}
                 if spec.sampler == "external" else None), extra=extra,
        meshes=[{"dp_size": spec.world_size_of(k) // spec.tp_of(k), "tp_size": spec.tp_of(k)}
                for k in range(max(len(spec.world_sizes), len(spec.tp_sizes)))]
        if spec.tp_sizes else None,
        target_steps=spec.target_steps,
        permutation={"algorithm": semantics.PERMUTATION_ALGORITHM,
                     "version": semantics.PERMUTATION_VERSION},
        log_ids=spec.log_ids, strategy=spec.strategy, ckpt_every=spec.ckpt_every,
        fail_at=list(spec.fail_at), world_sizes=list(spec.world_sizes), model="generated",
        created="2026-11-22T00:00:00Z")
    paths.root.mkdir(parents=True, exist_ok=True)
    write_json_record(paths.manifest, manifest)
    now = T0
    supervisor_attempts = []
    records = committed = replayed = tentative = 0
    latest: LatestPointer | None = None
    for a in attempts:
        start_time = now
        now += 0.5  # process start, rendezvous, checkpoint load
        step_times: dict[int, float] = {}
        events: list[CheckpointEvent] = []
        for g in range(a.start, a.last + 1):
            now += spec.step_s * (1.0 + 0.1 * rng.random())
            step_times[g] = round(now, 6)
            if spec.loss_noise:
                # A replayed step starts from the same restored state: the same loss.
                drawn = rng.gauss(0.0, spec.loss_noise)
                noise.setdefault(g, drawn)
            if g in a.checkpoints or g == a.lost:
                stall = 0.02 if spec.strategy in ("overlapped", "jit") else 0.2
                write = 0.2
                if g in a.checkpoints:
                    events.append(CheckpointEvent(
                        global_step=g, strategy=spec.strategy, snapshot_s=0.01, write_s=write,
                        enqueue_s=0.001 if spec.strategy == "overlapped" else 0.0,
                        backpressure_s=0.0, stall_s=stall, bytes=4096,
                        path=f"step-{g:08d}.pt",
                        extra={"time": round(now + stall, 6),
                               **({"digests": state_digests(spec, g)} if spec.digests else {})}))
                    epoch, cursor = divmod(g, spec.epoch_steps)
                    latest = LatestPointer(path=f"step-{g:08d}.pt", global_step=g, epoch=epoch,
                                           cursor_step=cursor, world_size=a.world_size,
                                           time=round(now + stall, 6),
                                           checksum="sha256:" + f"{g:064x}"[-64:])
                now += stall
        end_time = round(now + (0.1 if a.failed else 0.05), 6)
        for rank in range(a.world_size):
            steps = range(a.start, a.rank_last[rank] + 1)
            path = paths.rank_log(a.attempt, rank)
            path.parent.mkdir(parents=True, exist_ok=True)
            lines = _records(spec, geometry, a, rank, steps, step_times, noise)
            if spec.writer == "bulk":
                with open(path, "wb") as handle:
                    for block in _blocks(lines):
                        handle.write(block)
            else:
                with JsonlWriter(path) as writer:
                    for record in lines:
                        writer.write(StepRecord.from_dict(record))
            records += len(steps)
            if a.torn[rank]:
                nxt = a.rank_last[rank] + 1
                torn = next(iter(_records(spec, geometry, a, rank, range(nxt, nxt + 1),
                                          {nxt: now}, noise)))
                with open(path, "ab") as handle:
                    handle.write(orjson.dumps(torn)[:40])
            committed += max(0, min(a.committed_hi, a.rank_last[rank]) - a.start + 1)
        if spec.digests and a.resumed_from is not None:
            paths.attempt_dir(a.attempt).mkdir(parents=True, exist_ok=True)
            (paths.attempt_dir(a.attempt) / "restored.json").write_bytes(orjson.dumps(
                {"schema_version": 1, "global_step": a.resumed_from,
                 "digests": state_digests(spec, a.resumed_from)}))
        if events:
            with JsonlWriter(paths.checkpoint_log(a.attempt)) as writer:
                for event in events:
                    writer.write(event)
        executed = max(0, max(a.rank_last) - a.start + 1)
        kept = max(0, min(a.committed_hi, max(a.rank_last)) - a.start + 1)
        if a.attempt == attempts[-1].attempt and a.failed:
            tentative += executed - kept
        else:
            replayed += executed - kept
        running = a.status == "running"
        logged = max(a.rank_last) >= a.start and not running
        supervisor_attempts.append(SupervisorAttempt(
            attempt=a.attempt, world_size=a.world_size, resumed_from_step=a.resumed_from,
            first_step=a.start if logged else None,
            last_step=max(a.rank_last) if logged else None,
            exit_code=_EXIT_CODES[a.status], status=a.status,
            start_time=round(start_time, 6), end_time=None if running else end_time))
        now = end_time + (spec.restart_s if a.failed else 0.0)
    # As the runtime's supervisor does: the checkpoint it verified before each resume.
    resume_points = {str(a.attempt): {"global_step": a.resumed_from,
                                      "path": f"step-{a.resumed_from:08d}.pt",
                                      "checksum": f"sha256:{a.resumed_from:064x}"}
                     for a in attempts if a.resumed_from is not None}
    write_json_record(paths.supervisor, SupervisorState(
        attempts=supervisor_attempts, restarts=len(attempts) - 1, status=spec.run_status,
        extra={"resume_points": resume_points} if resume_points else {}))
    if latest is not None:
        write_json_record(paths.latest, latest)
    else:
        paths.checkpoints.mkdir(parents=True, exist_ok=True)
    return GeneratedRun(root=paths.root, spec=spec, attempts=tuple(attempts), records=records,
                        committed_records=committed, replayed_steps=replayed,
                        tentative_steps=tentative,
                        durable_step=latest.global_step if latest is not None else None)


def _records(spec: RunSpec, geometry: semantics.Geometry, a: AttemptPlanned, rank: int,
             steps: range, step_times: dict[int, float], noise: dict[int, float]
             ) -> Iterator[dict[str, object]]:
    """Step records of one rank as dicts in StepRecord.to_dict() order, a block at a time."""
    coords = spec.coords(a.attempt, rank)
    dp_rank, dp_size = (rank, a.world_size) if coords is None else (coords.dp_rank,
                                                                     coords.dp_size)
    local = semantics.mesh_local_batch(geometry.global_batch, dp_size)
    s = spec.epoch_steps
    block = 1 << 14
    for lo in range(steps.start, steps.stop, block):
        chunk = np.arange(lo, min(steps.stop, lo + block), dtype=np.int64)
        if spec.sampler == "external":
            ids = np.stack([external_window(spec, g)[rank::a.world_size]
                            for g in chunk.tolist()]) if chunk.size else \
                np.zeros((0, local), dtype=np.int64)
        else:
            ids = semantics.shard_block(geometry, spec.seed, chunk, dp_rank, dp_size)
        hashes = semantics.ids_hashes(ids).tolist()
        id_lists = ids.tolist() if spec.log_ids else None
        for i, g in enumerate(chunk.tolist()):
            record: dict[str, object] = {
                "schema_version": SCHEMA_VERSION, "attempt": a.attempt, "global_step": g,
                "epoch": g // s, "cursor_step": g % s, "rank": rank,
                "world_size": a.world_size, "local_batch": local, "sample_ids_count": local,
                "sample_ids_hash": f"{hashes[i]:016x}",
                "loss": _loss(spec, g, noise.get(g, 0.0)),
                "time": round(step_times.get(g, T0) + 0.0001 * rank, 6)}
            if id_lists is not None:
                record["sample_ids"] = id_lists[i]
            if coords is not None:
                record.update(coords.as_fields())
            record["step_s"] = spec.step_s
            yield record


STATE_OBJECTS = ("model", "optimizer", "scheduler", "sampler", "rng")
"""The objects a generated checkpoint saves (with ``RunSpec.digests``)."""


def state_digests(spec: RunSpec, step: int) -> dict[str, str]:
    """Stand-in digests of each saved object's state at ``step`` (distinct per object, step)."""
    return {name: "sha256:" + hashlib.sha256(f"{spec.seed}:{name}:{step}".encode()).hexdigest()
            for name in STATE_OBJECTS}


def external_window(spec: RunSpec, step: int) -> npt.NDArray[np.int64]:
    """A stand-in for a user's sampler: each epoch a numpy shuffle of ``0 .. D-1`` seeded by
    (seed, epoch) — not ECRL's order —, ``B`` positions per step, wrapping around the epoch's
    order when S·B > D (padding). Rank r takes every W-th ID of the window (as
    ``DistributedSampler`` strides its indices)."""
    epoch, cursor = divmod(step, spec.epoch_steps)
    order = np.random.default_rng([spec.seed, epoch]).permutation(spec.dataset_size)
    positions = (cursor * spec.global_batch + np.arange(spec.global_batch)) % spec.dataset_size
    return order[positions].astype(np.int64)


def _blocks(records: Iterator[dict[str, object]], size: int = 1 << 12) -> Iterator[bytes]:
    dumps = orjson.dumps
    batch: list[bytes] = []
    for record in records:
        batch.append(dumps(record))
        if len(batch) >= size:
            yield b"\n".join(batch) + b"\n"
            batch = []
    if batch:
        yield b"\n".join(batch) + b"\n"


def committed_steps(attempts: Sequence[AttemptPlanned]) -> int:
    """Distinct committed steps of a planned run (for tests)."""
    steps: set[int] = set()
    for a in attempts:
        steps.update(range(a.start, a.committed_hi + 1))
    return len(steps)
