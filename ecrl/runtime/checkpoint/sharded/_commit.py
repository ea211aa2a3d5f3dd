"""The sharded strategies and their commit protocol (the package's docstring gives the steps):
``sharded`` on the training thread, ``sharded-async`` on a background thread of its own."""

from __future__ import annotations

import collections
import contextlib
import functools
import hashlib
import json
import os
import threading
import time
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ecrl.contract import safepath
from ecrl.contract.atomicio import atomic_write_bytes, fsync_dir
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.gcpause import collection_paused
from ecrl.contract.runformat import CheckpointEvent, JsonlWriter, LatestPointer, write_json_record
from ecrl.contract.shardfile import (
    MANIFEST,
    METADATA_FILE,
    RECYCLED,
    chunk_key,
    encode_manifest,
    file_checksum,
    pack_chunks,
)
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.dtensor import LayoutCache, ShardLayout
from ecrl.runtime.checkpoint.persist import (
    CrashHook,
    apply_retention,
)
from ecrl.runtime.checkpoint.pipeline import Deferred, SnapshotPipeline, storage_key, warn
from ecrl.runtime.checkpoint.sharded._reuse import Encoding, KeptEncoding
from ecrl.runtime.checkpoint.sharded._storage import (
    ChunkBytes,
    ChunkPlanner,
    Crash,
    PartWriter,
    disk_problem,
    first_line,
    retire,
    shard_name,
    take_recycled,
)
from ecrl.runtime.checkpoint.strategies import RNG_KEY, CheckpointContext, Strategy


def _done_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def _placed(chunks: dict[int, torch.Tensor], place: tuple[int, int], like: torch.Tensor
            ) -> torch.Tensor:
    """The view of ``chunks`` at ``place`` (chunk, byte offset) shaped as ``like``."""
    chunk, offset = place
    nbytes = like.numel() * like.element_size()
    return chunks[chunk].narrow(0, offset, nbytes).view(like.dtype).view(like.shape)


def _tensor_key(index: int) -> str:
    """A manifest tensor's key among a job's tensors."""
    return f"t{index:05d}"


@functools.lru_cache(maxsize=4)
def _tensor_keys(count: int) -> tuple[str, ...]:
    """The keys of ``count`` tensors (made once: every checkpoint has the same count)."""
    return tuple(_tensor_key(index) for index in range(count))


def _shapes(entries: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """What a state's layout depends on, per manifest entry: its dtype, shape and size."""
    return [(e["dtype"], e["shape"], e["nbytes"]) for e in entries]


def _as_tensor(value: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A state value as the tensor a chunk holds (a NumPy array as its bytes)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value).reshape(-1).view(np.uint8))
    return value


@dataclass(slots=True)
class _Job:
    """One checkpoint on its way to disk."""

    step: int
    tensors: dict[str, torch.Tensor]
    """The state's tensors by key (``sharded``: the live ones; async: views of ``chunks``)."""
    tree: Any
    entries: list[dict[str, Any]]
    """Manifest entries, one per tensor, with its chunk and offset."""
    places: list[tuple[int, int]]
    chunk_sizes: list[int]
    meta: dict[str, Any]
    snapshot_s: float
    chunks: dict[int, torch.Tensor] | None = None
    """The chunks this rank writes, filled (async staging); None: filled from ``tensors`` while
    DCP writes."""
    backpressure_s: float = 0.0
    stall_s: float = 0.0
    staging: int | None = None
    """Index of the CPU staging set it occupies (async)."""
    stalled: threading.Event = field(default_factory=threading.Event)
    """Set once stall_s is known (the event line waits for it)."""
    copied: threading.Event = field(default_factory=_done_event)
    """Set once every tensor is in ``tensors`` (``sharded-async``'s pipelined copy)."""
    exact: bool = True
    """False when the pipelined copy's guard found a deferred tensor written to."""
    extra: dict[str, Any] = field(default_factory=dict)
    """More fields for the checkpoint event."""
    layout: object = None
    """Its tensors' dtypes and shapes (:attr:`Encoding.layout`: the same while reused)."""
    own_rng: dict[str, Any] | None = None
    """This rank's RNG states, when its capture stood them in for every rank's (async): the
    commit gathers the others' (:meth:`ShardedCheckpoints._fill_rngs`)."""

    def release(self) -> None:
        """Drop the state it holds, once committed (its staging set stays with the owner)."""
        self.tensors, self.tree, self.entries, self.chunks, self.meta = {}, None, [], None, {}


class ShardedSaveFailed(RuntimeError):
    """A sharded save failed for a reason a relaunch can fix (a peer died or hung)."""


def _default_timeout() -> timedelta | None:
    """The training's collective timeout (the default group's), for DCP's own group: a hung
    peer must end a checkpoint as soon as it ends a step, not after torch's 30 minutes."""
    group = dist.distributed_c10d._get_default_group()
    for device in ("cpu", "cuda"):
        with contextlib.suppress(Exception):  # private API: without it, torch's default
            timeout = group._get_backend(torch.device(device)).options._timeout
            if isinstance(timeout, timedelta):
                return timeout
    return None


class ShardedCheckpoints(Strategy):
    """``sharded``: every rank writes its part, training waits for the commit."""

    asynchronous = False
    writes_shards = True

    def __init__(self, ctx: CheckpointContext) -> None:
        super().__init__(ctx)
        self._events = JsonlWriter(ctx.paths.checkpoint_log(ctx.attempt)) if ctx.rank == 0 \
            else None
        self._hook = CrashHook.from_env(attempt=ctx.attempt)
        self._distributed = ctx.world_size > 1 or (dist.is_available() and dist.is_initialized())
        self._group: Any = None
        self._layouts = LayoutCache()
        """The DTensors' boxes and pieces, kept between checkpoints (:class:`ShardLayout`)."""
        self._kept = KeptEncoding()
        """The last checkpoint's encoding, reused while the state's tensors are the same."""
        self._layout: tuple[list[tuple[Any, ...]], object] | None = None
        """The entries' dtypes, shapes and places last encoded, and the token standing for them
        (:attr:`Encoding.layout`)."""

    # --- collectives -----------------------------------------------------------------------------

    def prepare(self) -> None:
        if self._distributed and self._group is None:
            # DCP's own collectives run on a gloo group of their own: its messages never mix with
            # the training's (NCCL or gloo), and the async variant may use it from its thread.
            self._group = dist.new_group(backend="gloo", timeout=_default_timeout())

    def _all_rngs(self) -> list[dict[str, Any]]:
        mine = statepack.rng_state()
        if self.ctx.world_size == 1:
            return [mine]  # one rank (torchrun initialises a group of one): nothing to gather
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, mine)
        return everyone

    def _fill_rngs(self, job: _Job) -> None:
        """Gather every rank's RNG states (on the commit's own group) and put them where the
        capture's stand-ins are: in the tree, and in the staged copies this rank writes."""
        everyone: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(everyone, job.own_rng, group=self._group)
        tree, values, entries = statepack.encode_tree(
            {"world_size": self.ctx.world_size, "ranks": everyone})
        indices = statepack.tensor_refs(job.tree[RNG_KEY])
        if _shapes(entries) != _shapes([job.entries[i] for i in indices]):
            raise CheckpointError(
                f"sharded checkpoint of step {job.step}: the RNG states of the ranks differ in "
                "their shapes (another CUDA device count or NumPy generator on some rank)")
        job.tree[RNG_KEY] = statepack.renumber_refs(tree, indices)
        for index, value in zip(indices, values, strict=True):
            staged = job.tensors.get(_tensor_key(index))
            if staged is not None:  # in a chunk this rank writes
                staged.copy_(_as_tensor(value))
        job.own_rng = None

    def _same_everywhere(self, tree: Any, entries: list[dict[str, Any]]) -> None:
        if self.ctx.world_size == 1:
            return
        digest = hashlib.sha256(json.dumps([tree, [{k: e[k] for k in ("dtype", "shape")}
                                                   for e in entries]]).encode()).hexdigest()
        digests: list[Any] = [None] * self.ctx.world_size
        dist.all_gather_object(digests, digest, group=self._group)
        odd = [r for r, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise CheckpointError(
                f"sharded checkpoint: the state of rank {odd[0]} differs in structure from rank "
                "0's; sharded checkpoints need the same state on every rank (replicated, as under "
                "DDP): use --strategy blocking or overlapped")

    # --- the boundary ----------------------------------------------------------------------------

    def _capture(self, step: int) -> _Job:
        t0 = time.perf_counter()
        self.prepare()  # a no-op after the first time (every rank gets here together)
        return self._job(self.ctx.capture(self._all_rngs()), step, t0)

    def _job(self, state: Any, step: int, t0: float) -> _Job:
        # The structure check across ranks (_same_everywhere) runs in _persist: for
        # sharded-async on its thread, not in the training's stall.
        tree, leaves = statepack.skeleton(state)
        encoding = self._kept.reuse(leaves) or self._encode_leaves(leaves)
        values = encoding.values
        tensors = dict(zip(_tensor_keys(len(values)), map(_as_tensor, values), strict=True))
        return _Job(step=step, tensors=tensors, tree=tree, entries=encoding.entries,
                    places=encoding.places, chunk_sizes=encoding.chunk_sizes,
                    meta=self.ctx.meta(step), snapshot_s=time.perf_counter() - t0,
                    layout=encoding.layout)

    def _encode_leaves(self, leaves: list[tuple[Any, dict[str, Any]]]) -> Encoding:
        """The state's tensors (a skeleton's ``leaves``) encoded and laid out in chunks, their
        nodes filled; kept for the next checkpoint (:class:`KeptEncoding`)."""
        shards = ShardLayout(self._layouts)
        values: list[Any] = []
        entries: list[dict[str, Any]] = []
        for value, node in leaves:
            statepack.encode_leaf(value, node, values, entries, shards)
        shards.keep()
        owners = shards.lay_out(values, entries, rank=self.ctx.rank,
                                world_size=self.ctx.world_size) if shards else []
        places, chunk_sizes = pack_chunks([int(e["nbytes"]) for e in entries],
                                          self.ctx.world_size, owners)
        for entry, (chunk, offset) in zip(entries, places, strict=True):
            entry["chunk"], entry["offset"] = chunk, offset
        # The same layout keeps its token, so that staging sets made for it stay in use.
        shapes = [(e["dtype"], e["shape"], e["chunk"], e["offset"]) for e in entries]
        if self._layout is None or self._layout[0] != shapes:
            self._layout = (shapes, object())
        encoding = Encoding(values=values, entries=entries, places=places,
                            chunk_sizes=chunk_sizes, layout=self._layout[1])
        self._kept.keep(leaves, encoding, self._layouts)
        return encoding

    def checkpoint(self, step: int) -> None:
        t0 = time.perf_counter()
        job = self._capture(step)
        job.stalled.set()  # the commit below finishes inside the stall; it is measured there
        self._persist(job, t0=t0)
        if self._distributed:
            dist.barrier(group=self._group)

    # --- the protocol ----------------------------------------------------------------------------

    def _gather(self, obj: Any) -> list[Any]:
        if self.ctx.world_size == 1:
            return [obj]
        out: list[Any] | None = [None] * self.ctx.world_size if self.ctx.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self._group)
        return out or []

    def _persist(self, job: _Job, *, t0: float | None = None) -> None:
        ctx = self.ctx
        crash = Crash(self._hook, ctx.rank)
        if self.asynchronous:
            crash.at("during-persist")
            if not self._agree(job):
                return
        if job.own_rng is not None:
            self._fill_rngs(job)
        self._same_everywhere(job.tree, job.entries)
        directory = ctx.paths.checkpoints
        name = shard_name(job.step)
        tmp = directory / f".{name}.a{ctx.attempt}.tmp"
        t1 = time.perf_counter()
        if ctx.rank == 0:
            safepath.require_dir(directory, error=CheckpointError)
            safepath.remove_entry(tmp)  # a link there is removed itself, never followed
            if not take_recycled(directory, tmp):
                tmp.mkdir()
        if self._distributed:
            dist.barrier(group=self._group)
        crash.at("before-parts")
        writer = PartWriter(tmp, crash)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "save in a single process"
                dcp.save(self._dcp_state(job), storage_writer=writer,
                         planner=ChunkPlanner(), process_group=self._group,
                         no_dist=not self._distributed)
            mine = writer.part_digests()
            fsync_dir(tmp)  # DCP never does: the parts' directory entries must survive too
        except (CheckpointException, OSError) as exc:
            problem = disk_problem(exc)
            if problem is None:
                # A peer died or hung during the save: a crash like any other, so the supervisor
                # relaunches from the last committed checkpoint (not a fatal error).
                raise ShardedSaveFailed(f"the sharded checkpoint of step {job.step} failed: "
                                        f"{first_line(exc)}") from None
            raise CheckpointError(
                f"writing the sharded checkpoint of step {job.step} failed: "
                f"{problem.strerror or problem} ({problem.filename or tmp})") from None
        everyone = self._gather(mine)
        if ctx.rank != 0:
            return
        parts: dict[str, dict[str, Any]] = {}
        for theirs in everyone:
            parts.update(theirs)
        checksum, size = file_checksum(tmp / METADATA_FILE)
        parts[METADATA_FILE] = {"checksum": checksum, "size": size}
        for stray in tmp.iterdir():
            if stray.name not in parts:  # a recycled part no rank of this world size wrote
                safepath.remove_entry(stray)
        manifest = encode_manifest(meta=job.meta, tree=job.tree, tensors=job.entries,
                                   chunks=job.chunk_sizes,
                                   parts=parts)
        try:
            atomic_write_bytes(tmp / MANIFEST, manifest)
            crash.at("before-rename")
            final = directory / name
            aside = directory / f".{name}.old.a{ctx.attempt}.tmp"
            if os.path.lexists(final):
                # Left by an attempt that died before publishing it (latest.json never named it,
                # or the fallback passed it over): replaced, never merged with.
                os.replace(final, aside)
            os.replace(tmp, final)
            fsync_dir(directory)
            safepath.remove_entry(aside)
        except OSError as exc:
            raise CheckpointError(f"writing the sharded checkpoint of step {job.step} failed: "
                                  f"{exc.strerror or exc} ({exc.filename or tmp})") from None
        write_s = time.perf_counter() - t1
        total = sum(int(p["size"]) for p in parts.values()) + len(manifest)
        checksum = "sha256:" + hashlib.sha256(manifest).hexdigest()
        job.stalled.wait()
        stall = job.stall_s if t0 is None else time.perf_counter() - t0
        if self._events is not None:
            # Before latest.json names it: every checkpoint the pointer ever names has its event.
            self._events.write(CheckpointEvent(
                global_step=job.step, strategy=self.name, snapshot_s=job.snapshot_s,
                write_s=write_s, enqueue_s=0.0, backpressure_s=job.backpressure_s,
                stall_s=stall, bytes=total, path=name,
                extra={"attempt": ctx.attempt, "parts": len(parts) - 1,
                       "writers": sum(1 for r in everyone if r), "async": self.asynchronous,
                       **job.extra}))
        crash.at("before-pointer")
        epoch, cursor = ctx.geometry.locate(job.step)
        try:
            write_json_record(ctx.paths.latest, LatestPointer(
                path=name, global_step=job.step, epoch=epoch, cursor_step=cursor,
                world_size=ctx.world_size, time=time.time(), checksum=checksum))
        except OSError as exc:
            raise CheckpointError(f"publishing the sharded checkpoint of step {job.step} failed: "
                                  f"{exc.strerror or exc} ({exc.filename or ctx.paths.latest})"
                                  ) from None
        crash.at("after-pointer")
        apply_retention(directory, latest_step=job.step, keep=ctx.keep, retire=retire)

    def _own_chunks(self, job: _Job) -> list[int]:
        """The chunks this rank writes: chunk ``rank`` (none when the state made fewer chunks
        than there are ranks). Each rank hands DCP only its own chunk, under a key no other rank
        uses, so no rank depends on how DCP would share out entries every rank holds."""
        return [self.ctx.rank] if self.ctx.rank < len(job.chunk_sizes) else []

    def _dcp_state(self, job: _Job) -> dict[str, ChunkBytes]:
        """What DCP saves: this rank's chunks by key, as byte entries written from their pieces
        (the staged chunk itself under async; the live tensors under ``sharded``, never copied)."""
        if job.chunks is not None:  # staged and filled already (async)
            return {chunk_key(k): ChunkBytes([(0, c)], c.numel()) for k, c in job.chunks.items()}
        pieces: dict[int, list[tuple[int, torch.Tensor]]] = {k: [] for k in self._own_chunks(job)}
        for tensor, (chunk, offset) in zip(job.tensors.values(), job.places, strict=True):
            if tensor.numel() and chunk in pieces:
                pieces[chunk].append((offset, tensor))
        return {chunk_key(k): ChunkBytes(members, job.chunk_sizes[k])
                for k, members in pieces.items()}

    def _agree(self, job: _Job) -> bool:
        """Whether every rank's copy of the job's state is complete and exact."""
        return True

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            safepath.remove_entry(self.ctx.paths.checkpoints / RECYCLED)


class AsyncShardedCheckpoints(ShardedCheckpoints):
    """``sharded-async``: the training thread only copies the state to CPU; a background thread
    runs the protocol, ``max_inflight`` checkpoints at most in flight."""

    asynchronous = True

    def __init__(self, ctx: CheckpointContext) -> None:
        super().__init__(ctx)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ecrl-sharded")
        self._inflight: collections.deque[tuple[Future[None], _Job]] = collections.deque()
        self._staging: list[tuple[Any, dict[int, torch.Tensor], dict[str, torch.Tensor]]] = []
        """Per staging set: (layout, this rank's chunks, their tensors' views of them)."""
        self._free: list[int] = []
        # The copy of parameters and optimizer state runs under the next step, as for
        # ``overlapped`` (:mod:`ecrl.runtime.checkpoint.pipeline`); the commit waits for it.
        self._pipeline = SnapshotPipeline(ctx.optimizers, on_ready=self._copied,
                                          on_torn=self._torn) if ctx.optimizers else None
        self._synchronous = False
        self._staged_ahead = False
        self._alike: bool | None = None
        """Whether the ranks' RNG states are alike (:meth:`_rngs_alike`); None: not known yet."""
        self._deferral: tuple[Any, dict[int, tuple[torch.Tensor, bool]]] = (None, {})
        """The optimizers' storages and, per tensor by id, whether its copy could wait
        (:meth:`_deferrable`)."""

    def prepare(self) -> None:
        super().prepare()
        if not self._staged_ahead:
            # One staging set is allocated and written once now (after the attempt's first
            # step), as overlapped populates its buffer: otherwise the first checkpoint's copy
            # pays every page's first touch (about 100 ms of stall for ResNet-50 here). The
            # layout comes from this rank's RNG state in every rank's place: the same dtypes and
            # shapes as the gathered ones, with no collective.
            self._staged_ahead = True
            mine = statepack.rng_state()
            if self._distributed and self.ctx.world_size > 1:
                self._rngs_alike(mine)  # its collective here, not in the first checkpoint
            rngs = [mine] * self.ctx.world_size
            job = self._job(self.ctx.capture(rngs), 0, time.perf_counter())
            self._stage(job)
            if job.staging is not None:
                self._free.append(job.staging)

    def _capture(self, step: int) -> _Job:
        t0 = time.perf_counter()
        self.prepare()
        mine = statepack.rng_state()
        if not self._distributed or self.ctx.world_size == 1:
            return self._job(self.ctx.capture([mine]), step, t0)
        if not self._rngs_alike(mine):
            return self._job(self.ctx.capture(self._all_rngs()), step, t0)
        # Every rank's RNG states are gathered with the commit, on its thread, rather than at
        # the boundary, where that first collective would also take in the ranks' skew: until
        # then this rank's own stand in for every rank's (the same dtypes and shapes, so the
        # same layout), and _fill_rngs puts the real ones in their place.
        job = self._job(self.ctx.capture([mine] * self.ctx.world_size), step, t0)
        job.own_rng = mine
        return job

    def _rngs_alike(self, mine: dict[str, Any]) -> bool:
        """Whether every rank's RNG states have the same dtypes and shapes, so that this rank's
        can stand in for all of them (not so with ranks that see different numbers of CUDA
        devices: then they are gathered at the boundary, as ``sharded`` does). Decided once, by
        a collective when the staging set is made (or at the first checkpoint, if that comes
        first): a rank's devices do not change."""
        if self._alike is None:
            shapes = _shapes(statepack.encode_tree(mine)[2])
            everyone: list[Any] = [None] * self.ctx.world_size
            dist.all_gather_object(everyone, shapes)
            self._alike = all(theirs == everyone[0] for theirs in everyone)
        return self._alike

    def _commit(self, job: _Job) -> None:
        try:
            self._persist(job)
        finally:
            # The job's thousands of small objects (tree, entries, keys) are freed here, on the
            # commit's thread, rather than at the next boundary, where it is settled.
            job.release()

    def _settle(self, future: Future[None], job: _Job) -> None:
        try:
            future.result()
        finally:
            if job.staging is not None:
                self._free.append(job.staging)

    def _reap(self, *, wait_for: int) -> float:
        """Collect finished checkpoints; wait until at most ``wait_for`` are in flight. Returns
        the seconds waited. A failed background persist is raised here, on the training thread."""
        t0 = time.perf_counter()
        while self._inflight and (len(self._inflight) > wait_for or self._inflight[0][0].done()):
            self._settle(*self._inflight.popleft())
        return time.perf_counter() - t0

    def _mine(self, job: _Job) -> set[str]:
        """The keys of the tensors in the chunks this rank writes (the only ones it stages)."""
        own = set(self._own_chunks(job))
        return {key for key, place in zip(job.tensors, job.places, strict=True)
                if place[0] in own}

    def _stage(self, job: _Job, later: frozenset[str] = frozenset()) -> None:
        """Copy the job's tensors of this rank's chunks into a free set of CPU chunks, except the
        keys in ``later``; the job then holds the chunks and its tensors become their views (at
        W ranks a rank copies about 1/W of the state: the other chunks are other ranks' to
        write)."""
        pin = torch.cuda.is_available()
        # Places and chunk sizes follow from the dtypes and shapes (and the world size).
        layout = job.layout
        if self._free:
            index = self._free.pop()
        else:
            index = len(self._staging)
            self._staging.append(([], {}, {}))
        if self._staging[index][0] is not layout:
            chunks = {k: torch.empty(job.chunk_sizes[k], dtype=torch.uint8, pin_memory=pin)
                      for k in self._own_chunks(job)}
            views = {key: _placed(chunks, place, tensor) for (key, tensor), place
                     in zip(job.tensors.items(), job.places, strict=True) if place[0] in chunks}
            self._staging[index] = (layout, chunks, views)
        _layout, chunks, views = self._staging[index]
        now = [key for key in views if key not in later]
        # One call for the lot (torch groups them by device and dtype): a model's buffers are a
        # hundred-odd small tensors, each copy_ a trip through the dispatcher.
        if now:  # (torch refuses empty lists)
            torch._foreach_copy_([views[key] for key in now],
                                 [job.tensors[key] for key in now], non_blocking=pin)
        if pin:
            torch.cuda.synchronize()
        job.staging, job.chunks, job.tensors = index, chunks, dict(views)

    def _deferrable(self, tensors: dict[str, torch.Tensor]) -> list[str]:
        """The keys of the tensors over an optimizer's storages (copied under the next step).
        Decided again only for tensor objects the previous checkpoint did not have, or when the
        optimizers' storages changed: a kept encoding hands out the same detached aliases
        while their tensors view the same memory (:class:`KeptEncoding`), and what such an
        alias views is its own to change."""
        if self._pipeline is None or self._synchronous:
            return []
        storages = self._pipeline.storages()
        known = self._deferral[1] if self._deferral[0] is storages else {}
        decided: dict[int, tuple[torch.Tensor, bool]] = {}
        later = []
        for key, value in tensors.items():
            hit = known.get(id(value))
            if hit is None or hit[0] is not value:
                hit = (value, bool(value.numel()) and storage_key(value) in storages)
            decided[id(value)] = hit
            if hit[1]:
                later.append(key)
        self._deferral = (storages, decided)
        return later

    def settle(self) -> None:
        if self._pipeline is not None:
            self._pipeline.settle()

    def checkpoint(self, step: int) -> None:
        # The boundary allocates a few thousand small objects, enough to start a collection,
        # and a full one walks every object of a process that imported torch (about 400,000:
        # 10 ms, longer than the whole boundary).
        with collection_paused():
            self._boundary(step)

    def _boundary(self, step: int) -> None:
        self.settle()  # a pipelined copy no optimizer step completed yet goes first
        t0 = time.perf_counter()
        backpressure = self._reap(wait_for=max(1, self.ctx.max_inflight) - 1)
        job = self._capture(step)
        t1 = time.perf_counter()
        sources = job.tensors
        mine = self._mine(job)
        later = self._deferrable({k: v for k, v in sources.items() if k in mine})
        self._stage(job, frozenset(later))
        deferred = None
        if later:
            assert self._pipeline is not None
            job.copied.clear()
            staged = job.tensors
            deferred = self._pipeline.start(
                step, [sources[k] for k in later],
                functools.partial(_copy_keys, sources, staged, later),
                context={"job": job, "keys": later})
        job.snapshot_s += time.perf_counter() - t1
        job.backpressure_s = backpressure
        future = self._pool.submit(self._commit, job)
        self._inflight.append((future, job))
        if deferred is not None:
            deferred.boundary_s = time.perf_counter() - t0
        else:
            job.stall_s = time.perf_counter() - t0
            job.stalled.set()

    def _copied(self, deferred: Deferred, wait_s: float) -> None:
        """The pipelined copy is complete and exact (training thread): the commit may go on."""
        job: _Job = deferred.context["job"]
        job.stall_s = deferred.boundary_s + wait_s
        job.snapshot_s += wait_s
        job.extra = {"pipelined": True, "boundary_s": deferred.boundary_s, "wait_s": wait_s,
                     "copy_s": deferred.future.result(), "deferred_bytes": deferred.nbytes}
        job.copied.set()
        job.stalled.set()

    def _torn(self, deferred: Deferred, changed: list[int]) -> None:
        job: _Job = deferred.context["job"]
        self._synchronous = True
        job.exact = False
        job.stall_s = deferred.boundary_s
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        warn(f"rank {self.ctx.rank}: sharded checkpoint of step {job.step} dropped: tensor "
             f"{deferred.context['keys'][changed[0]]}{more} of its state was modified in place "
             "before the next optimizer step (while it was being copied); later checkpoints of "
             "this attempt copy the state synchronously")
        job.copied.set()
        job.stalled.set()

    def _agree(self, job: _Job) -> bool:
        """Wait for the job's pipelined copy; True when every rank's copy is exact (a checkpoint
        one rank dropped is dropped by all: the ranks write parts of one checkpoint)."""
        job.copied.wait()
        exact = job.exact
        if self._distributed:
            flag = torch.tensor([1 if exact else 0], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self._group)
            if not exact or int(flag.item()):
                return exact
            warn(f"rank {self.ctx.rank}: sharded checkpoint of step {job.step} dropped: "
                 "another rank's copy of its state was not exact")
            return False
        return exact

    def close(self) -> None:
        try:
            if self._pipeline is not None:
                self._pipeline.close()
            self._reap(wait_for=0)
        finally:
            self._pool.shutdown(wait=True)
            super().close()


def _copy_keys(sources: dict[str, torch.Tensor], staged: dict[str, torch.Tensor],
               keys: list[str]) -> None:
    """The deferred part of a staging copy (on :mod:`ecrl.runtime.checkpoint.pipeline`'s thread)."""
    for key in keys:
        staged[key].copy_(sources[key])
