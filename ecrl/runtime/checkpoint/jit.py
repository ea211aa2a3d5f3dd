"""The ``jit`` strategy: a healthy rank saves the state when a peer dies or hangs.

In data parallelism every rank holds the whole model and optimizer state, so when one rank dies
the others still have it (seed ``004_…``). The survivors learn of the death from their next
collective: with gloo the all-reduce raises within milliseconds ("connection closed by peer"),
with a hung peer the watchdog (:mod:`ecrl.runtime.checkpoint.watchdog`) fires, and torchrun, once
it saw a rank exit, sends the others SIGTERM. Each of these reaches :meth:`JitCheckpoints.rescue`,
which saves **without any collective** (the peers may be gone) and commits with the same atomic
protocol as every other checkpoint (file, fsync, checkpoint event, ``latest.json``). The first
survivor to create ``logs/attempt-NNN/jit.claim`` (``O_EXCL``) writes; the others only exit.

Which step the rescued state belongs to (the seed's rule for a failure during the optimizer
step). A survivor stuck in step c+1's all-reduce holds the state after step c: the update of
c+1 cannot have begun, because it needs the all-reduced gradients. But the dead rank may have
died *after* step c's all-reduce and before its record of step c reached its log (in its
optimizer step, say): step c then happened (its data reached the update) but is missing from the
dead rank's log, and a checkpoint of step c would commit a step the logs cannot prove. So:

- every rank keeps a copy of the state as it was before its latest update. It is taken as the
  state after each step, at the step boundary, with the copy of the parameters and optimizer
  state left to a background thread that runs under the next step's forward and backward pass
  (:class:`ecrl.runtime.checkpoint.pipeline.SnapshotPipeline`, as for ``overlapped``): they change
  only in the next update, whose optimizer step pre-hook waits for the copy and then makes it the
  copy in force. Two sets of buffers, allocated once on the state's device, take turns: the one in
  force stays whole while the next is being filled. A tensor written in place between the
  boundary and the update (its version counter moved) is copied again before the update, so
  the copy is the state as the update found it; an update that did not happen (a skipped
  optimizer step) leaves the older copy in force. Small models (parameters under
  :data:`_PIPELINE_MIN_BYTES`) are copied in the pre-hook instead, on the training thread;
- the survivor saves the live state of step c when every rank of the attempt logged step c
  ("the next step" of the seed), else the copy, which is the state after step c - 1 ("the
  previous consistent copy"), which every rank logged before it could enter step c's all-reduce;
- a survivor interrupted inside its own update (never by a peer's failure: only a signal can do
  that, and :class:`JitCheckpoints` defers those to the step boundary) would use the copy too.

At most one step is replayed: step c, when the dead rank did not log it.

RNG streams: the survivor cannot gather the dead ranks' RNG states, so under ``jit`` every rank
reseeds its RNG streams at each step boundary from ``(seed, rank, next step)``
(:func:`ecrl.runtime.checkpoint.checkpointer.rank_seed`), and a JIT checkpoint carries no RNG
states: the resumed ranks derive the same streams from the step, so a rescued run stays
bit-identical to its uninterrupted twin.

``--ckpt-every K`` adds low-frequency blocking checkpoints, the fallback when no rank survives
(all killed at once, a node lost).
"""

from __future__ import annotations

import contextlib
import functools
import json
import mmap
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import Any

import torch

from ecrl.contract import safepath
from ecrl.contract.atomicio import atomic_write_text
from ecrl.contract.ckptfile import FOOTER_SIZE
from ecrl.contract.runformat import MAX_LINE_BYTES, CheckpointEvent, JsonlWriter, loads
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.persist import CommitResult, CrashHook, commit_checkpoint, read_latest
from ecrl.runtime.checkpoint.pipeline import (
    Deferred,
    SnapshotPipeline,
    stepping_optimizer,
    storage_key,
)
from ecrl.runtime.checkpoint.strategies import BlockingCheckpoints, CheckpointContext
from ecrl.runtime.endings import JIT_CLAIM, JIT_MARKER

__all__ = ["JIT_EXIT_CODE", "JIT_MARKER", "JIT_CLAIM", "KILL_ENV", "PeerLost", "JitCheckpoints",
           "RescueResult", "logged_through"]

JIT_EXIT_CODE = 76
"""A survivor's exit after its rescue (saved or not): the supervisor reads ``jit.json``."""
KILL_ENV = "ECRL_JIT_KILL"
"""Test hook ``STEP:PHASE[:RANK[:ATTEMPT]]``: SIGKILL rank RANK (default 1) at ``PHASE`` of
``STEP`` in attempt ATTEMPT (default 0); several, comma-separated:
``forward`` (in the model's forward), ``pre-optimizer`` (all-reduce done, update not begun),
``post-optimizer`` (update done, record not yet logged)."""
KILL_PHASES = ("forward", "pre-optimizer", "post-optimizer")


class PeerLost(RuntimeError):
    """The attempt is over for this rank: a peer died or torchrun asked it to stop."""


class RescueResult:
    """What one rescue did (also the content of ``jit.json``)."""

    __slots__ = ("rank", "global_step", "source", "reason", "saved", "why_not")

    def __init__(self, *, rank: int, global_step: int | None, source: str | None, reason: str,
                 saved: bool, why_not: str | None = None) -> None:
        self.rank, self.global_step, self.source = rank, global_step, source
        self.reason, self.saved, self.why_not = reason, saved, why_not

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "global_step": self.global_step, "source": self.source,
                "reason": self.reason, "saved": self.saved, "why_not": self.why_not,
                "time": time.time()}


def logged_through(path: os.PathLike[str] | str, *, chunk: int = 1 << 16) -> int | None:
    """The highest ``global_step`` among the complete lines at the end of a step log; None when
    it logged none, or when the log is not a regular file (a planted link or FIFO: the rescue then
    saves nothing rather than wait on it or trust it) or its tail holds no line within the
    format's line limit."""
    try:
        with safepath.read_regular(path, error=None) as handle:
            size = handle.seek(0, os.SEEK_END)
            span = min(size, chunk)
            while span <= 2 * MAX_LINE_BYTES + chunk:
                handle.seek(size - span)
                data = handle.read(span)
                end = data.rfind(b"\n")
                lines = data[: end + 1].splitlines() if end >= 0 else []
                # The first line may be cut by the chunk's start, unless the chunk is the file.
                usable = lines if span == size else lines[1:]
                best: int | None = None
                for line in usable:
                    with contextlib.suppress(ValueError, TypeError, KeyError):
                        step = int(loads(line)["global_step"])
                        best = step if best is None else max(best, step)
                if best is not None or span == size:
                    return best
                span = min(size, span * 4)
            return None
    except (FileNotFoundError, safepath.UnsafeFileError):
        return None


_PIPELINE_MIN_BYTES = 8 << 20
"""Below this many bytes of parameters the copy is taken in the optimizer step pre-hook, on the
training thread: handing it to a thread and waiting for it costs more than it takes."""


class _CopyPlan:
    """What one copy of the state needs: the tree of targets, and how each target is filled."""

    __slots__ = ("tree", "sources", "targets", "buffers")

    def __init__(self) -> None:
        self.tree: Any = None
        self.sources: list[torch.Tensor] = []
        """Live tensors only an update changes (parameters, optimizer state): copied later."""
        self.targets: list[torch.Tensor] = []
        self.buffers: list[tuple[int, torch.Tensor]] = []
        """(position among the live module buffers, target): filled from the boundary's set."""


def _plan_copy(src: Any, dst: Any, plan: _CopyPlan, *, later: set[tuple[str, int]],
               buffers: dict[int, tuple[int, torch.Tensor]]) -> Any:
    """``src`` with every tensor replaced by a target (``dst``'s matching tensor when it fits,
    else a new one): tensors in ``later`` (storages) are left to ``plan`` to copy, module
    buffers (``buffers``: data pointer to position and the live buffer) to the boundary's set,
    the rest (small: a user's tensors) copied now. Containers are new, other leaves
    immutable."""
    if isinstance(src, torch.Tensor):
        value = src.detach()
        if isinstance(dst, torch.Tensor) and dst.shape == value.shape and \
                dst.dtype == value.dtype and dst.device == value.device:
            target = dst
        else:
            target = torch.empty_like(value)
        found = buffers.get(value.data_ptr()) if value.numel() else None
        if found is not None and found[1].shape == value.shape and \
                found[1].dtype == value.dtype:
            plan.buffers.append((found[0], target))
        elif value.numel() and storage_key(value) in later:
            plan.sources.append(value)
            plan.targets.append(target)
        else:
            target.copy_(value)
        return target
    if isinstance(src, dict):
        old = dst if isinstance(dst, dict) else {}
        return {k: _plan_copy(v, old.get(k), plan, later=later, buffers=buffers)
                for k, v in src.items()}
    if isinstance(src, list):
        old_list = dst if isinstance(dst, list) and len(dst) == len(src) else [None] * len(src)
        return [_plan_copy(v, o, plan, later=later, buffers=buffers)
                for v, o in zip(src, old_list, strict=True)]
    if isinstance(src, tuple):
        old_tuple = dst if isinstance(dst, tuple) and len(dst) == len(src) else (None,) * len(src)
        return tuple(_plan_copy(v, o, plan, later=later, buffers=buffers)
                     for v, o in zip(src, old_tuple, strict=True))
    return src  # numbers, strings, None: immutable


def _copy_into(src: Any, dst: Any) -> Any:
    """``src`` with every tensor copied now (into ``dst``'s matching tensor when it fits)."""
    return _plan_copy(src, dst, _CopyPlan(), later=set(), buffers={})


def _copy_later(plan: _CopyPlan) -> None:
    """The background part of a copy (the pipeline's thread)."""
    if plan.targets:
        torch._foreach_copy_(plan.targets, plan.sources)


def _with_buffers(tree: Any, where: dict[int, int], copies: list[torch.Tensor]) -> Any:
    """``tree`` with every tensor that is a live module buffer (``where``: its storage address
    to its position) replaced by ``copies[position]``."""
    if isinstance(tree, torch.Tensor):
        at = where.get(tree.data_ptr()) if tree.numel() else None
        return tree if at is None or copies[at].shape != tree.shape else copies[at]
    if isinstance(tree, dict):
        return {k: _with_buffers(v, where, copies) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_with_buffers(v, where, copies) for v in tree]
    if isinstance(tree, tuple):
        return tuple(_with_buffers(v, where, copies) for v in tree)
    return tree


class _BoundaryBuffers:
    """The module buffers (BatchNorm's running statistics, its batch counter) of the state after
    each of the last two steps.

    Buffers change in the *forward* pass, not in the update: by the time a survivor rescues, its
    forward of the next step has already moved them (and the copy taken before step c's update
    holds step c's forward). A checkpoint of "the state after step s" takes the buffers that
    step s + 1's forward *started* from instead, or a resumed run would apply a replayed step's
    batch to them twice and end with other running statistics than its uninterrupted twin.

    They are taken by a forward pre-hook on the unwrapped module, the first forward after each
    boundary: under DDP (``broadcast_buffers``) that is after DDP copied rank 0's buffers into
    every rank, so any survivor holds the buffers a checkpoint of rank 0 would hold. Before that
    forward only rank 0's own buffers are those (another rank's were moved by its own batch), so
    another rank then saves the state after the step before (:meth:`JitCheckpoints._choose`).
    """

    def __init__(self, modules: Iterable[torch.nn.Module]) -> None:
        seen: set[int] = set()
        self.live: list[torch.Tensor] = []
        for module in modules:
            for buffer in module.buffers():
                if buffer.numel() and id(buffer) not in seen:
                    seen.add(id(buffer))
                    self.live.append(buffer)
        self._sets: dict[int, list[torch.Tensor]] = {}

    def take(self, step: int) -> None:
        """The buffers now belong to the state after ``step`` (its boundary)."""
        if not self.live:
            return
        # Two sets at most (steps s - 1 and s): the older one is written again.
        held = self._sets.pop(min(self._sets)) if len(self._sets) >= 2 else None
        if held is None or any(h.shape != b.shape or h.dtype != b.dtype or h.device != b.device
                               for h, b in zip(held, self.live, strict=True)):
            held = [b.detach().clone() for b in self.live]
        else:
            torch._foreach_copy_(held, self.live)
        self._sets[step] = held

    def known(self, step: int) -> bool:
        return not self.live or step in self._sets

    def copies(self, step: int) -> list[torch.Tensor]:
        """The buffers after ``step`` (the live ones when they were not taken)."""
        return self._sets.get(step, self.live)

    def state_after(self, tree: Any, step: int) -> Any:
        """``tree`` (captured now) with the buffers as they were after ``step``."""
        copies = self._sets.get(step)
        if copies is None:
            return tree
        where = {b.data_ptr(): i for i, b in enumerate(self.live)}
        return _with_buffers(tree, where, copies)


class _KillHook:
    """The ``ECRL_JIT_KILL`` test hook (a real SIGKILL, at a chosen phase of a chosen step)."""

    def __init__(self, spec: str | None, rank: int, attempt: int) -> None:
        self.step: int | None = None
        self.phase = ""
        for one in (spec or "").split(","):
            if not one.strip():
                continue
            parts = one.strip().split(":")
            if not 2 <= len(parts) <= 4 or not parts[0].isdigit() \
                    or parts[1] not in KILL_PHASES or not all(p.isdigit() for p in parts[2:]):
                raise ValueError(f"{KILL_ENV}={spec!r}: expected STEP:PHASE[:RANK[:ATTEMPT]] "
                                 f"with PHASE in {KILL_PHASES}")
            want_rank = int(parts[2]) if len(parts) >= 3 else 1
            want_attempt = int(parts[3]) if len(parts) == 4 else 0
            if rank == want_rank and attempt == want_attempt:
                self.step, self.phase = int(parts[0]), parts[1]

    def fire(self, step: int | None, phase: str) -> None:
        if self.step is not None and step == self.step and phase == self.phase:
            sys.stderr.flush()
            os.kill(os.getpid(), signal.SIGKILL)


class JitCheckpoints(BlockingCheckpoints):
    """Periodic blocking checkpoints every ``--ckpt-every`` steps (0: none), plus the rescue."""

    def __init__(self, ctx: CheckpointContext) -> None:
        super().__init__(ctx)
        self._held: tuple[int | None, Any] = (None, None)
        """(step, state) of the copy in force: the state after ``step``, whole (read at once by
        a rescue, which may run on the watchdog's thread)."""
        self._spare: Any = None
        """The other set of copy buffers (filled in the background while ``_held`` stays)."""
        self._pipeline: SnapshotPipeline | None = None
        self._buffer_at: dict[int, tuple[int, torch.Tensor]] = {}
        self._for_update = False
        self._completed: int | None = None
        """The last step whose boundary this rank passed."""
        self._first: int | None = None
        """The first step of this attempt (the state before it is the resumed checkpoint)."""
        self._in_update = False
        self._defer = False
        """From the update's start to the boundary's end: a SIGTERM waits for the boundary."""
        self._term_pending = False
        self._rescuing = threading.Lock()
        self._result: RescueResult | None = None
        self._reseed: Callable[[int], None] | None = None
        self._kill = _KillHook(os.environ.get(KILL_ENV), ctx.rank, ctx.attempt)
        self._handles: list[Any] = []
        self._previous_term: Any = None
        self._buffers = _BoundaryBuffers(())

    # --- wiring (the checkpointer calls these) ---------------------------------------------------

    def attach(self, *, start: int, optimizers: Iterable[torch.optim.Optimizer],
               modules: Iterable[torch.nn.Module], reseed: Callable[[int], None]) -> None:
        """Hook the optimizers (the copy in force before each update), the modules (their
        buffers at each boundary) and torchrun's SIGTERM; start copying the restored state."""
        self._first = start
        self._reseed = reseed
        modules = list(modules)
        self._buffers = _BoundaryBuffers(modules)
        self._buffers.take(start - 1)  # as restored (or initialised): the state after start - 1
        for module in modules:
            self._handles.append(module.register_forward_pre_hook(self._before_forward))
        for optimizer in map(stepping_optimizer, optimizers):
            self._handles.append(optimizer.register_step_pre_hook(self._before_update))
            if self._kill.step is not None:
                self._handles.append(optimizer.register_step_post_hook(
                    lambda *_: self._kill.fire(self._next_step(), "post-optimizer")))
        if self._kill.step is not None:
            for module in modules:
                self._handles.append(module.register_forward_pre_hook(
                    lambda *_: self._kill.fire(self._next_step(), "forward")))
        if threading.current_thread() is threading.main_thread():
            self._previous_term = signal.signal(signal.SIGTERM, self._on_term)
        self._buffer_at = {b.data_ptr(): (i, b) for i, b in enumerate(self._buffers.live)}
        optimizers = list(optimizers)
        params = sum(p.numel() * p.element_size() for o in optimizers
                     for group in o.param_groups for p in group["params"])
        if optimizers and params >= _PIPELINE_MIN_BYTES:
            self._pipeline = SnapshotPipeline(optimizers, on_ready=self._copy_ready,
                                              on_torn=self._copy_torn)
            self._start_copy(start - 1)  # as restored (or initialised)

    @property
    def _shadow(self) -> Any:
        return self._held[1]

    @property
    def _shadow_step(self) -> int | None:
        return self._held[0]

    def _start_copy(self, step: int) -> None:
        """Copy the state after ``step`` (now, at its boundary): containers and small tensors
        here, parameters and optimizer state on the pipeline's thread under the next step."""
        pipeline = self._pipeline
        if pipeline is None or self._rescuing.locked():
            return
        pipeline.settle()  # a copy no update took (a skipped optimizer step) is settled first
        plan = _CopyPlan()
        plan.tree = _plan_copy(self.ctx.capture([]), self._spare, plan,
                               later=pipeline.storages(), buffers=self._buffer_at)
        self._spare = None  # filled from now on: never handed out again until it is in force
        pipeline.start(step, plan.sources, functools.partial(_copy_later, plan),
                       context={"plan": plan})

    def _copy_ready(self, deferred: Deferred, wait_s: float) -> None:
        """The background copy of the state after ``deferred.step`` is complete and exact: it
        becomes the copy in force (training thread)."""
        plan: _CopyPlan = deferred.context["plan"]
        copies = self._buffers.copies(deferred.step)
        for at, target in plan.buffers:
            target.copy_(copies[at])
        previous = self._held[1]
        self._held = (deferred.step, plan.tree)
        self._spare = previous

    def _copy_torn(self, deferred: Deferred, changed: list[int]) -> None:
        """A tensor was written in place after the boundary. Before the update: copied again,
        the copy is then the state the update starts from. At a boundary (no update took it):
        dropped, the older copy stays in force."""
        plan: _CopyPlan = deferred.context["plan"]
        if not self._for_update:
            self._spare = plan.tree
            return
        for index in changed:
            plan.targets[index].copy_(plan.sources[index])
        self._copy_ready(deferred, 0.0)

    def _next_step(self) -> int:
        return self._first if self._completed is None else self._completed + 1  # type: ignore

    def _before_forward(self, *_: Any) -> None:
        step = self._next_step() - 1
        if not self._buffers.known(step):
            self._buffers.take(step)

    def _before_update(self, *_: Any) -> None:
        if self._in_update:
            return  # a second optimizer of the same step: the copy is already taken
        self._kill.fire(self._next_step(), "pre-optimizer")
        step = self._next_step() - 1
        if self._pipeline is not None:
            self._for_update = True
            try:
                self._pipeline.settle()  # the copy of the state after `step`: now in force
            finally:
                self._for_update = False
        if self._held[0] != step:
            # No background copy of that state (dropped, or no optimizer in the pipeline):
            # taken now. The forward of step + 1 has moved the buffers: theirs are the
            # boundary's.
            spare = self._spare
            self._spare = None
            tree = _copy_into(self._buffers.state_after(self.ctx.capture([]), step), spare)
            self._spare, self._held = self._held[1], (step, tree)
        self._in_update = self._defer = True

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self._rescuing.locked():
            return
        if self._defer:
            self._term_pending = True  # never cut an update or a commit in half: raise later
            return
        raise PeerLost(_PEER_EXITED)

    def step_completed(self, step: int) -> None:
        """The boundary of ``step`` (its update and record are done)."""
        self._completed = step
        self._in_update = False
        self._defer = True
        if self._reseed is not None:
            self._reseed(step + 1)
        self._start_copy(step)

    def boundary_done(self) -> None:
        self._defer = False
        if self._term_pending:
            self._term_pending = False
            raise PeerLost(_PEER_EXITED)

    def close(self) -> None:
        if self._pipeline is not None:
            self._for_update = False
            self._pipeline.close()
            self._pipeline = None
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._previous_term is not None and \
                threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous_term)
            self._previous_term = None
        super().close()

    # --- the rescue ------------------------------------------------------------------------------

    def _all_logged(self, step: int) -> bool:
        ctx = self.ctx
        if self._first is not None and step < self._first:
            return True  # the checkpoint this attempt resumed from: committed already
        for rank in range(ctx.world_size):
            done = logged_through(ctx.paths.rank_log(ctx.attempt, rank))
            if done is None or done < step:
                return False
        return True

    def _choose(self) -> tuple[Any, int | None, str | None, str | None]:
        """(state tree, step, source, why not) of the state to save."""
        live = None if self._in_update else self._completed
        if live is not None and self._all_logged(live) and (
                self._buffers.known(live) or self.ctx.rank == 0):
            return self._buffers.state_after(self.ctx.capture([]), live), live, "live", None
        shadow, held = self._held
        if shadow is not None and held is not None and self._all_logged(shadow):
            return held, shadow, "previous", None
        if live is None and shadow is None:
            return None, None, None, "no step completed in this attempt"
        return None, None, None, "no state whose step every rank logged"

    def rescue(self, reason: str) -> RescueResult:
        """Save the newest state every rank's log accounts for, without any collective."""
        if not self._rescuing.acquire(blocking=False):
            # Another thread (the watchdog, or the main thread) is rescuing: let it finish.
            while self._result is None:
                time.sleep(0.05)
            return self._result
        ctx = self.ctx
        with contextlib.suppress(ValueError):  # not the main thread
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        result = RescueResult(rank=ctx.rank, global_step=None, source=None, reason=reason,
                              saved=False)
        try:
            claim = ctx.paths.attempt_dir(ctx.attempt) / JIT_CLAIM
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            except FileExistsError:
                result.why_not = "another rank saves"
                return result
            tree, step, source, why_not = self._choose()
            result.global_step, result.source, result.why_not = step, source, why_not
            latest = read_latest(ctx.paths)
            if tree is not None and step is not None and (
                    (latest is not None and latest.global_step >= step)
                    or (latest is None and self._first is not None and step < self._first)):
                result.why_not = f"step {step} is already committed"
            elif tree is not None and step is not None:
                self._commit(tree, step, source or "live", reason)
                result.saved = True
            atomic_write_text(ctx.paths.attempt_dir(ctx.attempt) / JIT_MARKER,
                              json.dumps(result.to_dict()) + "\n")
            return result
        finally:
            self._result = result

    def _commit(self, tree: Any, step: int, source: str, reason: str) -> None:
        ctx = self.ctx
        t0 = time.perf_counter()
        state = statepack.encode(tree, meta={**ctx.meta(step), "jit": {
            "source": source, "reason": reason, "rank": ctx.rank}})
        size = state.layout.size
        buffer = mmap.mmap(-1, size + FOOTER_SIZE)
        try:
            statepack.snapshot_into(state, memoryview(buffer))
            snapshot_s = time.perf_counter() - t0
            epoch, cursor = ctx.geometry.locate(step)
            events = self._events or JsonlWriter(ctx.paths.checkpoint_log(ctx.attempt))

            def record(done: CommitResult) -> None:
                # Before latest.json names the file: every pointer has its event (persist.py).
                events.write(CheckpointEvent(
                    global_step=step, strategy=self.name, snapshot_s=snapshot_s,
                    write_s=done.write_s, enqueue_s=0.0, backpressure_s=0.0,
                    stall_s=time.perf_counter() - t0, bytes=done.bytes, path=done.path,
                    extra={"attempt": ctx.attempt, "jit": {"source": source, "reason": reason,
                                                           "rank": ctx.rank}}))

            commit_checkpoint(ctx.paths, memoryview(buffer), size, global_step=step,
                              epoch=epoch, cursor_step=cursor, world_size=ctx.world_size,
                              keep=ctx.keep, crash=CrashHook.from_env(attempt=ctx.attempt),
                              before_publish=record)
            if events is not self._events:
                events.close()
        finally:
            buffer.close()


_PEER_EXITED = "torchrun's termination signal (a peer exited)"


def rescue_reason(exc: BaseException) -> str:
    """What a rescue says ended the loop: the exception's first sentence (gloo's messages go
    on with advice), or, when torchrun's SIGTERM reached this rank's DataLoader workers before
    the rank itself (the loader then reports "DataLoader worker (pid N) is killed by signal:
    Terminated"), the signal and why it was sent."""
    line = " ".join(f"{type(exc).__name__}: {exc}".split())
    if isinstance(exc, RuntimeError) and "DataLoader worker (pid" in line \
            and "killed by signal: Terminated" in line:
        return f"{_PEER_EXITED}, which stopped this rank's DataLoader workers first"
    return line.split(". ")[0][:200]


def exit_after_rescue(strategy: JitCheckpoints, reason: str, *, code: int = JIT_EXIT_CODE,
                      ) -> None:
    """Rescue, say what happened in one line, and end the process (no collective may run)."""
    result = strategy.rescue(reason)
    rank = strategy.ctx.rank
    if result.saved:
        line = f"saved step {result.global_step} ({result.source} state) after: {reason}"
    else:
        line = f"saved nothing ({result.why_not}) after: {reason}"
    with contextlib.suppress(OSError, ValueError):
        print(f"ecrl jit (rank {rank}): {line}", file=sys.stderr, flush=True)
    os._exit(code)
