"""Checkpoint strategies at the step boundary: ``none``, ``blocking``, ``overlapped``.

Both saving strategies follow the boundary of seed ``000_…`` §4.3–4.6, with rank 0 the only
writer:

- ``blocking``: gather every rank's RNG states (the collective doubles as the opening barrier) →
  rank 0 snapshots the state into a buffer laid out as the file and commits it durably
  (:func:`ecrl.runtime.checkpoint.persist.commit_checkpoint`) → barrier. Training stalls for the
  whole write.
- ``overlapped``: gather → rank 0 waits for a free slot if ``max_inflight`` writes are pending
  (back-pressure) → snapshots into the slot → hands the job to the background writer process
  (:mod:`ecrl.runtime.checkpoint.bgwriter`) → barrier. Training stalls only for the copy; the
  writer hashes, writes, fsyncs and publishes ``latest.json`` while the next steps run. When the
  checkpointed state holds an optimizer, the copy itself is pipelined
  (:mod:`ecrl.runtime.checkpoint.pipeline`): the boundary copies the header, buffers and small
  objects, a thread copies the parameters and the optimizer state under the next forward and
  backward pass, and the next ``optimizer.step()`` waits for it; the job goes to the writer once
  that copy is complete and proven exact.

A checkpoint "at step c" captures the state after step c's update, and is due after every K-th
step (``(c + 1) % K == 0``), except the run's last step, which ends the run instead.
"""

from __future__ import annotations

import functools
import mmap
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ecrl.contract.ckptfile import FOOTER_SIZE, CheckpointError, encode_prefix
from ecrl.contract.runformat import CheckpointEvent, JsonlWriter, RunPaths
from ecrl.contract.semantics import Geometry
from ecrl.runtime.checkpoint import registry, statepack
from ecrl.runtime.checkpoint.bgwriter import WriterClient
from ecrl.runtime.checkpoint.digests import image_digests
from ecrl.runtime.checkpoint.persist import CrashHook, checkpoint_name, commit_checkpoint
from ecrl.runtime.checkpoint.pipeline import (
    Deferred,
    SnapshotPipeline,
    split_deferred,
    tensor_path,
    warn,
)
from ecrl.runtime.failure import disk_error

__all__ = ["CheckpointContext", "RNG_KEY", "Strategy", "NoCheckpoints", "BlockingCheckpoints",
           "OverlappedCheckpoints", "make_strategy"]

Capture = Callable[[list[dict[str, Any]]], Any]
"""Given every rank's RNG states (rank order), the state tree to save."""

RNG_KEY = "rng"
"""Where a captured state tree holds every rank's RNG states: ``{"world_size", "ranks"}``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class CheckpointContext:
    """What a strategy needs to know about the job it checkpoints."""

    paths: RunPaths
    attempt: int
    rank: int
    world_size: int
    geometry: Geometry
    target_steps: int
    every: int
    """K: checkpoint after every K-th step (0: never)."""
    keep: int
    max_inflight: int
    capture: Capture
    meta: Callable[[int], dict[str, Any]]
    """Header metadata of the checkpoint at a step."""
    optimizers: tuple[Any, ...] = ()
    """The optimizers among the checkpointed objects (``overlapped`` pipelines its copy of the
    tensors only they write to: :mod:`ecrl.runtime.checkpoint.pipeline`)."""


def _gather_rng(ctx: CheckpointContext) -> list[dict[str, Any]]:
    mine = statepack.rng_state()
    if ctx.world_size == 1:
        return [mine]
    gathered: list[Any] | None = [None] * ctx.world_size if ctx.rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return gathered or []


def _timed_digests(image: memoryview) -> tuple[dict[str, str], float]:
    t0 = time.perf_counter()
    return image_digests(image), time.perf_counter() - t0


def _barrier(ctx: CheckpointContext) -> None:
    if ctx.world_size > 1:
        dist.barrier()


class Strategy:
    """The boundary protocol; subclasses say what rank 0 does in the middle."""

    name = "none"
    """Set from :data:`ecrl.runtime.checkpoint.registry.REGISTRY` when the class is looked up
    there."""
    writes_shards = False
    """Whether every rank writes its own part (the sharded strategies): a sharded (FSDP2,
    DTensor) model's state is then captured as each rank's shards, not gathered whole."""

    def __init__(self, ctx: CheckpointContext) -> None:
        self.ctx = ctx

    def due(self, step: int) -> bool:
        every = self.ctx.every
        return every > 0 and (step + 1) % every == 0 and step < self.ctx.target_steps - 1

    def prepare(self) -> None:
        """Allocate buffers ahead of the first checkpoint (called after the attempt's 1st step)."""

    def checkpoint(self, step: int) -> None:
        raise NotImplementedError

    def settle(self) -> None:
        """Called at every step boundary before :meth:`due`: finish work a checkpoint left for
        later (``overlapped``'s pipelined copy when no optimizer step has completed it)."""

    def close(self) -> None:
        """Make every checkpoint taken so far durable (end of the attempt)."""

    def _encode(self, step: int, rngs: list[dict[str, Any]]) -> statepack.EncodedState:
        return statepack.encode(self.ctx.capture(rngs), meta=self.ctx.meta(step))

    def _size_hint(self) -> int:
        rngs = [statepack.rng_state()] * self.ctx.world_size
        return self._encode(0, rngs).layout.size


class NoCheckpoints(Strategy):
    def due(self, step: int) -> bool:
        return False


class BlockingCheckpoints(Strategy):
    def __init__(self, ctx: CheckpointContext) -> None:
        super().__init__(ctx)
        self._buffer: mmap.mmap | None = None
        self._events = JsonlWriter(ctx.paths.checkpoint_log(ctx.attempt)) if ctx.rank == 0 \
            else None
        self._crash = CrashHook.from_env(attempt=ctx.attempt)
        self._pool: ThreadPoolExecutor | None = None

    def _digester(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ecrl-digests")
        return self._pool

    def _ensure(self, size: int) -> mmap.mmap:
        need = size + FOOTER_SIZE
        if self._buffer is None or len(self._buffer) < need:
            if self._buffer is not None:
                self._buffer.close()
            capacity = need + need // 8
            # Populated up front so that page faults are not billed to the first checkpoint.
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            self._buffer = mmap.mmap(-1, capacity, flags=flags)
        return self._buffer

    def prepare(self) -> None:
        if self.ctx.rank == 0:
            self._ensure(self._size_hint())

    def checkpoint(self, step: int) -> None:
        ctx = self.ctx
        t0 = time.perf_counter()
        rngs = _gather_rng(ctx)
        if ctx.rank == 0:
            t1 = time.perf_counter()
            state = self._encode(step, rngs)
            buffer = self._ensure(state.layout.size)
            statepack.snapshot_into(state, memoryview(buffer))
            snapshot_s = time.perf_counter() - t1
            # The digests are hashed from the image while it is written and fsynced (hashlib
            # releases the GIL), so they add little or nothing to the stall.
            digesting = self._digester().submit(_timed_digests,
                                                memoryview(buffer)[:state.layout.size])
            epoch, cursor = ctx.geometry.locate(step)
            try:
                result = commit_checkpoint(
                    ctx.paths, memoryview(buffer), state.layout.size, global_step=step,
                    epoch=epoch, cursor_step=cursor, world_size=ctx.world_size, keep=ctx.keep,
                    crash=self._crash)
            except OSError as exc:  # disk full, permissions: a restart would not help
                why = disk_error(exc, ctx.paths.checkpoints / checkpoint_name(step)) or \
                    f"{exc.strerror or exc} ({exc.filename or ctx.paths.checkpoints})"
                raise CheckpointError(
                    f"writing the checkpoint of step {step} failed: {why}") from None
            digests, digest_s = digesting.result()
        _barrier(ctx)
        if ctx.rank == 0 and self._events is not None:
            # After the barrier, so that stall_s covers the whole boundary, publication included.
            # A crash between publishing and this line leaves latest.json naming a checkpoint
            # without its event; the supervisor's resume_points testify for it (docs/strategies.md).
            self._events.write(CheckpointEvent(
                global_step=step, strategy=self.name, snapshot_s=snapshot_s,
                write_s=result.write_s + result.publish_s, enqueue_s=0.0, backpressure_s=0.0,
                stall_s=time.perf_counter() - t0, bytes=result.bytes, path=result.path,
                extra={"publish_s": result.publish_s, "attempt": ctx.attempt,
                       "digest_s": digest_s, "digests": digests},
            ))

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._events is not None:
            self._events.close()
        if self._buffer is not None:
            self._buffer.close()


class OverlappedCheckpoints(Strategy):
    def __init__(self, ctx: CheckpointContext) -> None:
        super().__init__(ctx)
        self._client = WriterClient.start(
            run_dir=str(ctx.paths.root), attempt=ctx.attempt, keep=ctx.keep,
            max_inflight=ctx.max_inflight, strategy=self.name) if ctx.rank == 0 else None
        # Only rank 0 copies the state; an optimizer is what makes deferring a copy safe.
        self._pipeline = SnapshotPipeline(ctx.optimizers, on_ready=self._hand_on,
                                          on_torn=self._drop) \
            if self._client is not None and ctx.optimizers else None
        self._synchronous = False
        """Set once a pipelined checkpoint was dropped: later copies are all synchronous."""

    def prepare(self) -> None:
        if self._client is not None:
            self._client.prepare(self._size_hint())

    def settle(self) -> None:
        if self._pipeline is not None:
            self._pipeline.settle()

    def checkpoint(self, step: int) -> None:
        ctx = self.ctx
        self.settle()  # a pipelined copy no optimizer step completed yet goes first
        t0 = time.perf_counter()
        rngs = _gather_rng(ctx)
        job = None
        deferred: Deferred | None = None
        if self._client is not None:
            t1 = time.perf_counter()
            state = self._encode(step, rngs)
            encode_s = time.perf_counter() - t1
            slot, backpressure_s = self._client.acquire(state.layout.size)
            t2 = time.perf_counter()
            later: list[int] = []
            if self._pipeline is not None and not self._synchronous:
                now, later = split_deferred(state, self._pipeline.storages())
            if later:
                assert self._pipeline is not None
                image = slot.view()
                encode_prefix(state.layout, image)
                statepack.snapshot_tensors(state, image, now)
                deferred = self._pipeline.start(
                    step, [state.tensors[i] for i in later],  # type: ignore[misc]
                    functools.partial(statepack.snapshot_tensors, state, image, later),
                    context={"slot": slot, "state": state, "indices": later,
                             "snapshot_s": encode_s + time.perf_counter() - t2,
                             "backpressure_s": backpressure_s})
            else:
                statepack.snapshot_into(state, slot.view())
                snapshot_s = encode_s + time.perf_counter() - t2
                epoch, cursor = ctx.geometry.locate(step)
                t2 = time.perf_counter()
                job = self._client.submit(
                    slot, size=state.layout.size, global_step=step, epoch=epoch,
                    cursor_step=cursor, world_size=ctx.world_size, snapshot_s=snapshot_s,
                    backpressure_s=backpressure_s)
                enqueue_s = time.perf_counter() - t2
        _barrier(ctx)
        if deferred is not None:
            deferred.boundary_s = time.perf_counter() - t0
        elif self._client is not None and job is not None:
            self._client.send_timing(job, enqueue_s=enqueue_s, stall_s=time.perf_counter() - t0)

    def _hand_on(self, deferred: Deferred, wait_s: float) -> None:
        """The pipelined copy is complete and exact: the writer may have it (training thread)."""
        assert self._client is not None
        info = deferred.context
        copy_s = deferred.future.result()
        epoch, cursor = self.ctx.geometry.locate(deferred.step)
        t0 = time.perf_counter()
        job = self._client.submit(
            info["slot"], size=info["state"].layout.size, global_step=deferred.step,
            epoch=epoch, cursor_step=cursor, world_size=self.ctx.world_size,
            # The copy's share of the stall (snapshot_s <= stall_s, as for every strategy): the
            # boundary's part and the update's wait; copy_s has the background copy's seconds.
            snapshot_s=info["snapshot_s"] + wait_s, backpressure_s=info["backpressure_s"])
        enqueue_s = time.perf_counter() - t0
        # The stall is what the training thread spent blocked: the boundary, and the wait of
        # the next update for the background copy; the copy itself overlapped compute.
        self._client.send_timing(
            job, enqueue_s=enqueue_s, stall_s=deferred.boundary_s + wait_s + enqueue_s,
            extra={"pipelined": True, "boundary_s": deferred.boundary_s, "wait_s": wait_s,
                   "copy_s": copy_s, "deferred_bytes": deferred.nbytes})

    def _drop(self, deferred: Deferred, changed: list[int]) -> None:
        """Something wrote to a deferred tensor before its copy was complete: the image may mix
        two states, so it is never handed to the writer (its slot stays free)."""
        self._synchronous = True
        info = deferred.context
        where = tensor_path(info["state"].tree, info["indices"][changed[0]])
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        warn(f"checkpoint of step {deferred.step} dropped: {where}{more} was modified in place "
             "before the next optimizer step (after the step boundary, while it was being "
             "copied); later checkpoints of this attempt copy the state synchronously")

    def close(self) -> None:
        try:
            if self._pipeline is not None:
                self._pipeline.close()
        finally:
            if self._client is not None:
                self._client.close()


def make_strategy(name: str, ctx: CheckpointContext) -> Strategy:
    """The strategy :data:`ecrl.runtime.checkpoint.registry.REGISTRY` names ``name``, for this
    job."""
    cls = registry.strategy_class(name)
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise CheckpointError(f"strategy {name!r} is registered as {cls!r}, which is not a "
                              "Strategy subclass: fix its registry entry")
    return cls(ctx)
