"""The ``jit`` strategy: a healthy rank saves its live state when a peer dies or hangs.

In data parallelism every rank holds the whole model and optimizer state, so when one rank dies
the others still have it (seed ``004_…``). The survivors learn of the death from their next
collective: with gloo the all-reduce raises within milliseconds ("connection closed by peer"),
with a hung peer the watchdog (:mod:`ecrl.runtime.checkpoint.watchdog`) fires, and torchrun, once
it saw a rank exit, sends the others SIGTERM. Each of these reaches :meth:`JitCheckpoints.rescue`,
which saves **without any collective** (the peers may be gone) and commits with the same atomic
protocol as every other checkpoint (file, fsync, checkpoint event, ``latest.json``). The first
survivor to create ``logs/attempt-NNN/jit.claim`` (``O_EXCL``) writes; the others only exit.

Which step the rescued state belongs to. Every rank flushes its record of step c *before* its
gradients can enter step c's all-reduce (the step-record contract, ``docs/run-format.md``). So
when a survivor has completed step c's all-reduce, every rank has logged c; and a survivor's
state is always the state after some step k it passed the boundary of:

- its optimizer step for c ran (it is anywhere from its boundary of c to step c + 1's
  all-reduce): the live state is the state after c, and every rank logged c;
- it has not (it is in step c's forward, backward or all-reduce): parameters and optimizer state
  are still those after c - 1, which every rank logged before it could enter step c - 1's
  all-reduce (or which the attempt resumed from).

So the rescue saves the live state as it is, with the step it belongs to: no copy of parameters
or optimizer state is ever taken, in any step. What does change between a boundary and the next
update is small and is kept per step: the **module buffers** (BatchNorm's running statistics and
batch counter) move in the forward pass, so a forward pre-hook copies them once per step, as the
next step's forward found them (:class:`_BoundaryBuffers`); the sampler's position is recomputed
for the step saved (:class:`ecrl.GlobalBatchSampler` states are a function of the step); the RNG
streams are those the run's RNG policy derives from the step (below).

A survivor interrupted inside its own update (never by a peer's failure: only a signal can do
that, and :class:`JitCheckpoints` defers those to the step boundary; or the watchdog's thread,
when this rank itself is stuck in its update) holds neither state and saves nothing. The
Checkpointer refuses a loop that logs a step after its update (the optimizer step pre-hook checks
that the step's record was written): the argument above needs the record first.

At most one step is replayed per failure: step c, when a rank logged c and died before its
gradients entered c's all-reduce (the survivor then saves c - 1).

RNG streams: the survivor cannot gather the dead ranks' RNG states, so the run's RNG policy
(``per-step``, :data:`ecrl.runtime.settings.RNG_POLICY`, recorded in ``run.json`` and the same for
every strategy) reseeds every rank's streams at each step boundary from ``(seed, rank, next
step)`` (:func:`ecrl.runtime.checkpoint.checkpointer.rank_seed`); a JIT checkpoint carries no RNG
states, the resumed ranks derive the same streams from the step, and a rescued run stays
bit-identical to its uninterrupted twin under any strategy.

Module buffers under DDP: at the start of each forward DDP broadcasts rank 0's buffers to every
rank, so the state after step s holds rank 0's buffers as step s's forward left them. Every
survivor has those from the moment step s + 1's forward started (the pre-hook runs after the
broadcast); before that moment only rank 0 has them. A rank other than 0 interrupted in that
gap (rank 0 died between its update of s and its broadcast of s + 1) cannot know them and saves
nothing when the model has such buffers: the attempt then resumes from the periodic checkpoint
(``docs/strategies.md``).

``--ckpt-every K`` adds low-frequency blocking checkpoints, the fallback when no rank survives
(all killed at once, a node lost).
"""

from __future__ import annotations

import contextlib
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
from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import MAX_LINE_BYTES, CheckpointEvent, JsonlWriter, loads
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.persist import CommitResult, CrashHook, commit_checkpoint, read_latest
from ecrl.runtime.checkpoint.pipeline import stepping_optimizer
from ecrl.runtime.checkpoint.strategies import BlockingCheckpoints, CheckpointContext
from ecrl.runtime.endings import JIT_CLAIM, JIT_MARKER

__all__ = ["JIT_EXIT_CODE", "JIT_MARKER", "JIT_CLAIM", "KILL_ENV", "PeerLost", "JitCheckpoints",
           "RescueResult", "logged_through"]

JIT_EXIT_CODE = 76
"""A survivor's exit after its rescue (saved or not): the supervisor reads ``jit.json``."""
KILL_ENV = "ECRL_JIT_KILL"
"""Test hook ``STEP:PHASE[:RANK[:ATTEMPT]]``: SIGKILL rank RANK (default 1) at ``PHASE`` of
``STEP`` in attempt ATTEMPT (default 0); several, comma-separated:
``forward`` (in the model's forward, record not yet logged), ``backward`` (record logged,
gradients not yet in the all-reduce), ``pre-optimizer`` (all-reduce done, update not begun),
``post-optimizer`` (update done, boundary not reached)."""
KILL_PHASES = ("forward", "backward", "pre-optimizer", "post-optimizer")


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
    forward of the next step has already moved them. A checkpoint of "the state after step s"
    takes the buffers that step s + 1's forward *started* from instead, or a resumed run would
    apply a replayed step's batch to them twice and end with other running statistics than its
    uninterrupted twin.

    They are taken by a forward pre-hook on the unwrapped module, the first forward after each
    boundary: under DDP (``broadcast_buffers``) that is after DDP copied rank 0's buffers into
    every rank, so any survivor holds the buffers a checkpoint of rank 0 would hold. Before that
    forward only rank 0's own buffers are those (another rank's were moved by its own batch), so
    another rank then cannot save (:meth:`JitCheckpoints._choose`).
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
        self._position: Callable[[int], dict[str, Any]] = lambda step: {}
        self._logged: Callable[[], int | None] | None = None
        self._kill = _KillHook(os.environ.get(KILL_ENV), ctx.rank, ctx.attempt)
        self._handles: list[Any] = []
        self._previous_term: Any = None
        self._buffers = _BoundaryBuffers(())

    # --- wiring (the checkpointer calls these) ---------------------------------------------------

    def attach(self, *, start: int, optimizers: Iterable[torch.optim.Optimizer],
               modules: Iterable[torch.nn.Module],
               position: Callable[[int], dict[str, Any]] | None = None,
               logged: Callable[[], int | None] | None = None) -> None:
        """Hook the optimizers (the update's start), the modules (their buffers once per step)
        and torchrun's SIGTERM.

        ``position(step)``: the entries of the state tree that follow the step rather than live
        objects (the samplers' states after ``step``). ``logged()``: the last step this rank
        logged (None: none yet); without it the order of record and update is not checked."""
        self._first = start
        if position is not None:
            self._position = position
        self._logged = logged
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
                self._handles.append(module.register_full_backward_pre_hook(
                    lambda *_: self._kill.fire(self._next_step(), "backward")))
        if threading.current_thread() is threading.main_thread():
            self._previous_term = signal.signal(signal.SIGTERM, self._on_term)

    def _next_step(self) -> int:
        return self._first if self._completed is None else self._completed + 1  # type: ignore

    def _before_forward(self, *_: Any) -> None:
        step = self._next_step() - 1
        if not self._buffers.known(step):
            self._buffers.take(step)

    def _before_update(self, *_: Any) -> None:
        if self._in_update:
            return  # a second optimizer of the same step
        step = self._next_step()
        if self._logged is not None and self._logged() != step:
            raise ConfigError(
                f"--strategy jit: step {step}'s update began before this rank logged the step: "
                "call log.step(...) after the forward pass and before loss.backward() "
                "(docs/library.md), so that a rescue can prove which step a survivor's state "
                "belongs to")
        self._kill.fire(step, "pre-optimizer")
        self._in_update = self._defer = True

    def _on_term(self, signum: int, frame: FrameType | None) -> None:
        if self._rescuing.locked():
            return
        if self._defer:
            self._term_pending = True  # never cut an update or a commit in half: raise later
            return
        raise PeerLost(_PEER_EXITED)

    def step_completed(self, step: int) -> None:
        """The boundary of ``step`` (its update is done)."""
        self._completed = step
        self._in_update = False
        self._defer = True

    def boundary_done(self) -> None:
        self._defer = False
        if self._term_pending:
            self._term_pending = False
            raise PeerLost(_PEER_EXITED)

    def close(self) -> None:
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
        """(state tree, step, source, why not) of the state to save: the live state, as of the
        last step whose boundary this rank passed."""
        if self._in_update:
            return None, None, None, "this rank was inside its optimizer step"
        live = self._completed
        if live is None:
            return None, None, None, "no step completed in this attempt"
        if not self._buffers.known(live) and self.ctx.rank != 0:
            return None, None, None, (
                f"rank 0's module buffers after step {live} never reached this rank (step "
                f"{live + 1}'s forward had not broadcast them)")
        if not self._all_logged(live):
            return None, None, None, f"step {live} is missing from a rank's log"
        tree = self._buffers.state_after(self.ctx.capture([]), live)
        if isinstance(tree, dict):
            tree = {**tree, **self._position(live)}
        return tree, live, "live", None

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
