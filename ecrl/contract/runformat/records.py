"""The records of a run directory (``run.json``, ``supervisor.json``, step records, checkpoint
events, ``latest.json``): typed, frozen, validated when read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar

from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat._record import (
    SCHEMA_VERSION,
    Check,
    Record,
    is_bool,
    is_hash,
    is_int,
    is_nonneg_int,
    is_number,
    is_str,
    list_of,
    optional,
    spec,
)
from ecrl.contract.strategies import STRATEGIES

__all__ = ["SCHEMA_VERSION", "STRATEGIES", "SAMPLER_KINDS", "EPOCH_COVERAGES", "RunManifest",
           "SupervisorAttempt", "SupervisorState", "StepRecord", "CheckpointEvent",
           "LatestPointer", "AttemptRecord", "ATTEMPT_STATUSES"]

SAMPLER_KINDS = ("ecrl", "external")
"""``run.json`` ``sampler.kind``: ECRL's own order, or one the verifier can only audit."""
EPOCH_COVERAGES = ("all", "drop_remainder")
"""``sampler.epoch_coverage`` of an external sampler in ``run.json`` (docs/run-format.md)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunManifest(Record):
    """``run.json``: what the run was asked to do; the verifier's expectations come from here."""

    seed: int
    """Permutation (and training) seed."""
    dataset: Mapping[str, Any]
    """``{"name": str, "size": int}``."""
    global_batch: int
    """B, constant for the whole run."""
    steps_per_epoch: int
    """S = D // B, recorded so a reader can cross-check it."""
    target_steps: int
    """Committed steps the run must reach (steps 0..target_steps-1)."""
    permutation: Mapping[str, Any]
    """``{"algorithm": str, "version": int}`` of :mod:`ecrl.contract.semantics`."""
    log_ids: bool
    """Whether step records carry full ``sample_ids`` (else count + hash only)."""
    strategy: str
    """Checkpoint strategy: one of :data:`STRATEGIES`."""
    ckpt_every: int
    """Checkpoint every K committed steps (0: never)."""
    fail_at: list[int]
    """Global steps after which a failure is injected."""
    world_sizes: list[int]
    """World size per attempt; the last one repeats."""
    model: str
    created: str
    """ISO-8601 time the run directory was created."""
    sampler: Mapping[str, Any] | None = None
    """What fed the run: ``{"kind": "ecrl"}`` (windows are known and checked; also when absent)
    or ``{"kind": "external", "name": ...}`` (a sampler whose order ECRL does not know, e.g.
    ``torch.utils.data.DistributedSampler``: the verifier audits what it can prove without
    windows). Further keys describe the sampler and are kept as they are."""

    meshes: list[Mapping[str, Any]] | None = None
    """On a mesh: ``[{"dp_size": DP, "tp_size": TP, ...}, ...]``, the mesh of attempt 0, 1, …
    as planned (the last repeats, like ``world_sizes``); absent: every attempt is plain DDP.
    Further keys (``replicate``, ``shard``, ``parallel``) describe the mesh and are kept."""

    _OPTIONAL: ClassVar[frozenset[str]] = frozenset({"sampler", "meshes"})
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        seed=is_nonneg_int,
        dataset=(
            lambda v: isinstance(v, dict) and is_str(v.get("name")) and is_int(v.get("size"))
            and v["size"] > 0,
            'an object {"name": str, "size": positive int}',
        ),
        global_batch=(lambda v: is_int(v) and v > 0, "a positive integer"),
        steps_per_epoch=(lambda v: is_int(v) and v > 0, "a positive integer"),
        target_steps=is_nonneg_int,
        permutation=(
            lambda v: isinstance(v, dict) and is_str(v.get("algorithm"))
            and is_int(v.get("version")),
            'an object {"algorithm": str, "version": int}',
        ),
        log_ids=is_bool,
        strategy=is_str,
        ckpt_every=is_nonneg_int,
        fail_at=(list_of(is_nonneg_int), "a list of non-negative integers"),
        world_sizes=(
            lambda v: isinstance(v, list) and bool(v) and all(is_int(x) and x > 0 for x in v),
            "a non-empty list of positive integers",
        ),
        model=is_str,
        created=is_str,
        sampler=(
            lambda v: isinstance(v, dict) and v.get("kind") in SAMPLER_KINDS
            and (v["kind"] == "ecrl" or is_str(v.get("name"))),
            '{"kind": "ecrl"} or {"kind": "external", "name": str, ...}',
        ),
        meshes=(
            lambda v: isinstance(v, list) and bool(v) and all(
                isinstance(m, dict) and is_int(m.get("dp_size")) and m["dp_size"] > 0
                and is_int(m.get("tp_size")) and m["tp_size"] > 0 for m in v),
            'a non-empty list of {"dp_size": positive int, "tp_size": positive int, ...}',
        ),
    )

    @property
    def external_sampler(self) -> bool:
        """True when the run's order is not ECRL's (windows cannot be checked, only audited)."""
        return self.sampler is not None and self.sampler.get("kind") == "external"

    @property
    def dataset_size(self) -> int:
        return int(self.dataset["size"])

    def mesh_of(self, attempt: int) -> Mapping[str, Any] | None:
        """The mesh planned for ``attempt`` (the last entry repeats); None: plain DDP."""
        if not self.meshes:
            return None
        return self.meshes[min(attempt, len(self.meshes) - 1)]

    def world_size_of(self, attempt: int) -> int:
        """World size planned for ``attempt`` (the last entry repeats)."""
        return self.world_sizes[min(attempt, len(self.world_sizes) - 1)]


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisorAttempt:
    """One launch of ``torchrun`` as the supervisor saw it."""

    attempt: int
    world_size: int
    resumed_from_step: int | None
    """Global step of the checkpoint this attempt loaded (None: fresh start)."""
    first_step: int | None
    """First global step the attempt ran (None until known)."""
    last_step: int | None
    """Last global step the attempt completed (None if it completed none)."""
    exit_code: int | None
    status: str
    """running, completed, failed or stopped."""
    start_time: float
    end_time: float | None

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        attempt=is_nonneg_int,
        world_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
        resumed_from_step=(optional(is_nonneg_int), "a non-negative integer or null"),
        first_step=(optional(is_nonneg_int), "a non-negative integer or null"),
        last_step=(optional(is_nonneg_int), "a non-negative integer or null"),
        exit_code=(optional(is_int), "an integer or null"),
        status=is_str,
        start_time=is_number,
        end_time=(optional(is_number), "a number or null"),
    )

    @classmethod
    def from_dict(cls, data: Any, *, where: tuple[str, int | None]) -> SupervisorAttempt:
        path, line = where
        if not isinstance(data, dict):
            raise RunFormatError(path, line, "each attempt must be a JSON object")
        kwargs = {}
        for name, (check, what) in cls._SPEC.items():
            if name not in data:
                raise RunFormatError(path, line, f"attempt is missing field {name!r}")
            if not check(data[name]):
                raise RunFormatError(
                    path, line, f"attempt field {name!r} must be {what}, got {data[name]!r}"
                )
            kwargs[name] = data[name]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, kw_only=True, slots=True)
class SupervisorState(Record):
    """``supervisor.json``: every attempt, rewritten atomically as the run progresses."""

    attempts: list[SupervisorAttempt]
    restarts: int
    status: str
    """running, completed, failed (restart limit or unrecoverable) or stopped (by the user)."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        attempts=(lambda v: isinstance(v, list), "a list of attempt objects"),
        restarts=is_nonneg_int,
        status=is_str,
    )

    @classmethod
    def _build(cls, kwargs: dict[str, Any], where: tuple[str, int | None]) -> SupervisorState:
        kwargs["attempts"] = [
            SupervisorAttempt.from_dict(a, where=where) for a in kwargs["attempts"]
        ]
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        out = Record.to_dict(self)
        out["attempts"] = [a.to_dict() for a in self.attempts]
        return out


ATTEMPT_STATUSES = ("running", "completed")
"""``attempt.json`` ``status``: written as ``running`` when the attempt starts, rewritten as
``completed`` when it logged the run's last step. An attempt that died stays ``running``: how it
ended (exit code, signal) is known only to a supervisor."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptRecord(Record):
    """``logs/attempt-NNN/attempt.json``: one attempt as its own rank 0 recorded it, whatever
    launched it (``ecrl launch``, plain ``torchrun``, a framework's launcher, a requeue).

    Written atomically before the attempt's first step record, once it knows the checkpoint it
    resumed from (verified against its checksum) or that it started fresh; rewritten when it
    completed the run. With it the verifier rebuilds the committed lineage of a run that has no
    ``supervisor.json``."""

    attempt: int
    world_size: int
    resumed_from_step: int | None
    """Global step of the checkpoint this attempt loaded (None: fresh start)."""
    resumed_from_checksum: str | None
    """``algorithm:hexdigest`` of that checkpoint, as verified when it was loaded."""
    launcher: str
    """``ecrl launch`` (a supervisor also records the attempt) or ``standalone``."""
    status: str
    """One of :data:`ATTEMPT_STATUSES`."""
    start_time: float
    end_time: float | None
    last_step: int | None
    """The last step it logged, once ``completed``."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        attempt=is_nonneg_int,
        world_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
        resumed_from_step=(optional(is_nonneg_int), "a non-negative integer or null"),
        resumed_from_checksum=(optional(lambda v: isinstance(v, str) and ":" in v),
                               "'algorithm:hexdigest' or null"),
        launcher=is_str,
        status=(lambda v: v in ATTEMPT_STATUSES, " or ".join(ATTEMPT_STATUSES)),
        start_time=is_number,
        end_time=(optional(is_number), "a number or null"),
        last_step=(optional(is_nonneg_int), "a non-negative integer or null"),
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class StepRecord(Record):
    """One line of ``rank-NNN.jsonl``: what one rank consumed at one committed-or-not step."""

    attempt: int
    global_step: int
    epoch: int
    cursor_step: int
    rank: int
    world_size: int
    local_batch: int
    sample_ids_count: int
    sample_ids_hash: str
    """:func:`ecrl.contract.semantics.format_hash` of the IDs this rank consumed."""
    loss: float | None
    """Loss of this rank's shard (null when the loss was not finite)."""
    time: float
    """Wall-clock seconds (Unix time) when the step's update completed."""
    sample_ids: list[int] | None = None
    """The IDs themselves, when the run logs them (``run.json`` ``log_ids``)."""
    dp_rank: int | None = None
    """On a mesh: this rank's data-parallel coordinate (which slice of the window it consumed;
    absent: the run is plain DDP and it is ``rank``)."""
    dp_size: int | None = None
    """On a mesh: the data-parallel degree DP = W / TP (absent: ``world_size``)."""
    tp_rank: int | None = None
    """On a mesh: this rank's tensor-parallel coordinate (absent: 0)."""
    tp_size: int | None = None
    """On a mesh: the tensor-parallel degree TP, the ranks that consume each slice (absent: 1)."""

    _OPTIONAL: ClassVar[frozenset[str]] = frozenset(
        {"sample_ids", "dp_rank", "dp_size", "tp_rank", "tp_size"})
    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        attempt=is_nonneg_int,
        global_step=is_nonneg_int,
        epoch=is_nonneg_int,
        cursor_step=is_nonneg_int,
        rank=is_nonneg_int,
        world_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
        local_batch=(lambda v: is_int(v) and v > 0, "a positive integer"),
        sample_ids_count=is_nonneg_int,
        sample_ids_hash=is_hash,
        loss=(optional(is_number), "a number or null"),
        time=is_number,
        sample_ids=(list_of(is_int), "a list of integers"),
        dp_rank=is_nonneg_int,
        dp_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
        tp_rank=is_nonneg_int,
        tp_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
    )

    @property
    def mesh(self) -> tuple[int, int, int, int] | None:
        """``(dp_rank, dp_size, tp_rank, tp_size)`` when the record names all four, else
        None (a DDP record names none; a partial set is the verifier's to judge)."""
        if self.dp_rank is None or self.dp_size is None or self.tp_rank is None \
                or self.tp_size is None:
            return None
        return self.dp_rank, self.dp_size, self.tp_rank, self.tp_size


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointEvent(Record):
    """One line of ``checkpoint_rank0.jsonl``: the cost of one checkpoint, by phase."""

    global_step: int
    """Last completed step the checkpoint captures (resume runs global_step + 1)."""
    strategy: str
    snapshot_s: float
    """Copying training state off the live objects."""
    write_s: float
    """Serialising and writing durably (in the background for ``overlapped``)."""
    enqueue_s: float
    """Handing the snapshot to the background writer."""
    backpressure_s: float
    """Waiting for a free slot when the writer had ``max_inflight`` writes pending."""
    stall_s: float
    """Time training was stopped for this checkpoint, barriers included."""
    bytes: int
    path: str
    """Checkpoint file, relative to ``checkpoints/``."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        global_step=is_nonneg_int,
        strategy=is_str,
        snapshot_s=is_number,
        write_s=is_number,
        enqueue_s=is_number,
        backpressure_s=is_number,
        stall_s=is_number,
        bytes=is_nonneg_int,
        path=is_str,
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class LatestPointer(Record):
    """``checkpoints/latest.json``: the newest durable checkpoint."""

    path: str
    """Relative to ``checkpoints/``; never absolute, never outside it."""
    global_step: int
    epoch: int
    cursor_step: int
    world_size: int
    time: float
    checksum: str
    """``algorithm:hexdigest`` of the checkpoint payload."""

    _SPEC: ClassVar[dict[str, tuple[Check, str]]] = spec(
        path=(
            lambda v: isinstance(v, str) and bool(v) and not os.path.isabs(v)
            and ".." not in Path(v).parts,
            "a relative path inside checkpoints/",
        ),
        global_step=is_nonneg_int,
        epoch=is_nonneg_int,
        cursor_step=is_nonneg_int,
        world_size=(lambda v: is_int(v) and v > 0, "a positive integer"),
        time=is_number,
        checksum=(lambda v: isinstance(v, str) and ":" in v, "'algorithm:hexdigest'"),
    )
