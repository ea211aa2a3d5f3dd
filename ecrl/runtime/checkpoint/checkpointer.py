"""``ecrl.Checkpointer``: the commit protocol and the strategies over any dict of Stateful objects.

``Checkpointer({"model": ddp_model, "optimizer": opt, "scheduler": sched, "sampler": sampler})``
saves and restores each value through torch's Stateful protocol (``state_dict`` and
``load_state_dict``; a ``DistributedDataParallel`` model is unwrapped so that the checkpoint
holds the plain module's keys). RNG streams follow the run's policy
(:data:`ecrl.runtime.settings.RNG_POLICY`, the same for every strategy): at each step boundary
every rank's Python, NumPy, torch CPU and CUDA generators are seeded from the run's seed, the rank
and the next step (:func:`rank_seed`), so that the same run gives the same numbers however often
it was interrupted and whatever strategy each attempt used. Checkpoints still carry every rank's
streams (as the boundary set them: the same values), and a resume sets them.

:meth:`Checkpointer.restore` loads the checkpoint this attempt resumes from (the one the
supervisor chose, or ``checkpoints/latest.json`` when running standalone), verifies its checksum,
refuses one written by a run with another data set, global batch or seed, and returns the next
step to run (0 on a fresh start). :meth:`Checkpointer.after_step` is the step boundary: the
checkpoint when one is due (:mod:`ecrl.runtime.checkpoint.strategies`, chosen by name from
:mod:`ecrl.runtime.checkpoint.registry`), then the injected failure when one is due
(:mod:`ecrl.runtime.failure`).

The checkpoint settings (:class:`ecrl.runtime.settings.CheckpointSettings`: strategy, interval,
in-flight writes, retention, deadline buffer, hang bound) resolve one way, launched or not: a flag
the user gave ``ecrl launch``/``ecrl run`` (the supervisor passes only those) > the constructor's
argument > the default. Rank 0 records the result, with each value's source, in the attempt's
``checkpoint-settings.json`` for the supervisor's summary. Failures and the deadline come from the
supervisor's environment when it started the script, else from the constructor.

Three guards ride on the same boundary. The ``jit`` strategy (:mod:`ecrl.runtime.checkpoint.jit`)
saves from a healthy rank when a peer dies: use the checkpointer as a context manager around the
loop (``with ckpt: for step …``) so that the exception a dead peer causes reaches it. The watchdog
(:mod:`ecrl.runtime.checkpoint.watchdog`) turns a hung collective into a ``hung`` attempt within
its bound. With a deadline (:mod:`ecrl.runtime.checkpoint.deadline`) the ranks agree on a last
step, rank 0 commits the final checkpoint and the process exits with ``DEADLINE_EXIT_CODE``
(``SystemExit``).
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ecrl import __version__
from ecrl.contract import safepath
from ecrl.contract.atomicio import atomic_write_bytes, atomic_write_text
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.errors import ConfigError, EcrlError
from ecrl.contract.semantics import Geometry, mix64_int
from ecrl.contract.shardfile import VerifiedShards
from ecrl.runtime._attempt import Attempt, record_attempt, record_completed, resolve_attempt
from ecrl.runtime.checkpoint import digests, statepack
from ecrl.runtime.checkpoint.deadline import (
    DEADLINE_EXIT_CODE,
    DEADLINE_MARKER,
    DeadlineClock,
    DeadlineRule,
    estimate_ckpt_s,
    resolve_deadline,
)
from ecrl.runtime.checkpoint.dtensor import FullStates
from ecrl.runtime.checkpoint.jit import JitCheckpoints, exit_after_rescue, rescue_reason
from ecrl.runtime.checkpoint.persist import (
    checkpoint_in,
    checkpoint_name,
    checkpoint_step,
    clean_temporaries,
    read_checkpoint,
    read_latest,
)
from ecrl.runtime.checkpoint.registry import built_strategies, strategy_class
from ecrl.runtime.checkpoint.strategies import (
    RNG_KEY,
    BlockingCheckpoints,
    CheckpointContext,
    Strategy,
    make_strategy,
)
from ecrl.runtime.checkpoint.watchdog import HUNG_EXIT_CODE, HUNG_MARKER, Watchdog, WatchdogConfig
from ecrl.runtime.failure import FailurePlan, fatal_reason, inject
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.steplog import StepLog
from ecrl.runtime.settings import (
    RNG_NOTE,
    SETTINGS_FILE,
    CheckpointSettings,
    ResolvedCheckpoint,
    resolve_checkpoint,
    script_values,
)

__all__ = ["Checkpointer", "seed_all", "rank_seed"]


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    # torch.manual_seed's effect on the generators ECRL runs on, without its per-call imports of
    # every backend (55 µs against 2 µs: every step boundary reseeds).
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)  # queued until CUDA initialises, as manual_seed does


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of ``rank``'s RNG streams for ``step`` (the per-step RNG policy)."""
    return mix64_int(mix64_int(seed) ^ mix64_int(rank * 2**32 + step)) & (2**63 - 1)


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
        return obj.module
    return obj


def _read_back(obj: Any, loaded: Any) -> Any:
    """The state ``obj`` holds after ``load_state_dict(loaded)``, for its digest.

    A data loader's state is not read back: ``StatefulDataLoader.state_dict()`` before the first
    batch builds the iterator, so its workers would prefetch with the sampler's epoch as it is
    now, before the loop's ``set_epoch`` (the resumed pass would replay the wrong epoch). Its
    digest is that of the state it was given; the sample-ID logs prove what it then yielded."""
    if isinstance(obj, torch.utils.data.DataLoader):
        return loaded
    return _unwrap(obj).state_dict()


class Checkpointer:
    """Checkpoints and restores ``state`` (name → Stateful object) for one attempt.

    ``log``: the run's :class:`ecrl.StepLog` (run directory, attempt, data set and seed to check
    checkpoints against); without one, pass ``run_dir``.

    ``checkpoint``: the script's checkpoint settings
    (:class:`ecrl.runtime.settings.CheckpointSettings`); ``strategy``, ``every``
    (``ckpt_every``), ``keep`` (``keep_checkpoints``), ``max_inflight`` and ``hang_timeout``
    (``hang_timeout_s``) are shorthands for its fields. A flag given to ``ecrl launch`` wins over
    them; a setting neither gives has its one default.

    ``fail_at``, ``fail_rank``, ``deadline`` (Unix time, or a string
    :func:`ecrl.runtime.checkpoint.deadline.parse_deadline` reads; default ``SLURM_JOB_END_TIME``):
    used when no supervisor started the script.
    """

    def __init__(self, state: Mapping[str, Any], *, log: StepLog | None = None,
                 run_dir: str | os.PathLike[str] | None = None,
                 checkpoint: CheckpointSettings | None = None, strategy: str | None = None,
                 every: int | None = None, keep: int | None = None,
                 max_inflight: int | None = None, fail_at: Sequence[int] = (),
                 fail_rank: int = 0, steps: int | None = None,
                 deadline: float | str | None = None,
                 hang_timeout: float | None = None) -> None:
        if RNG_KEY in state:
            raise ConfigError(f"Checkpointer: the key {RNG_KEY!r} is reserved for the RNG states "
                              "ECRL saves itself; rename that entry")
        for key, obj in state.items():
            if not (hasattr(_unwrap(obj), "state_dict")
                    and hasattr(_unwrap(obj), "load_state_dict")):
                raise ConfigError(f"Checkpointer: {key!r} ({type(obj).__name__}) has no "
                                  "state_dict/load_state_dict: pass Stateful objects only")
        self.state = dict(state)
        self.log = log
        self.run: Attempt = log.run if log is not None else resolve_attempt(run_dir)
        env = self.run.env
        script = script_values(checkpoint, strategy=strategy, ckpt_every=every,
                               keep_checkpoints=keep, max_inflight=max_inflight,
                               hang_timeout_s=hang_timeout)
        self.settings: ResolvedCheckpoint = resolve_checkpoint(
            flags=env.checkpoint if env is not None else {}, script=script)
        settings = self.settings.settings
        self.strategy_name = settings.strategy
        if self.strategy_name not in built_strategies():
            raise ConfigError(f"Checkpointer(strategy={self.strategy_name!r}): choose one of "
                              f"{', '.join(built_strategies())}")
        loaders = [k for k, o in self.state.items() if isinstance(o, torch.utils.data.DataLoader)]
        if self.strategy_name == "jit" and loaders:
            # A rescue saves mid-step: a loader has fetched (and prefetched) batches past the
            # step being saved, and its resumed position would skip them.
            raise ConfigError(
                f"Checkpointer(strategy='jit'): {loaders[0]!r} is a DataLoader, whose position "
                "moves ahead of the step a rescue saves; checkpoint its sampler "
                "(ecrl.GlobalBatchSampler) instead, or use another strategy")
        # FSDP2 / DTensor entries are gathered whole at each boundary (the sharded strategies:
        # each rank's shards) and resharded on load.
        self._full = FullStates({k: _unwrap(o) for k, o in self.state.items()})
        if self.strategy_name == "jit" and self._full:
            raise ConfigError(
                f"Checkpointer(strategy='jit'): {sorted(self._full.modules)[0]!r} is sharded "
                "(FSDP2/DTensor), so no rank holds a full replica to rescue from; use blocking, "
                "overlapped or sharded")
        self.every = settings.effective_ckpt_every
        self.keep = settings.keep_checkpoints
        self.max_inflight = settings.max_inflight
        self.failures = FailurePlan(
            steps=frozenset(env.fail_at if env is not None else fail_at),
            rank=env.fail_rank if env is not None else fail_rank)
        samplers = [o for o in self.state.values() if isinstance(o, GlobalBatchSampler)]
        self.samplers = samplers
        if log is not None:
            self.geometry: Geometry | None = log.geometry
            self.seed: int | None = log.seed
            self.target: int | None = log.steps if steps is None else steps
            # run.json says the settings in effect; failures are the supervisor's when it set them.
            log.declare_checkpointing(strategy=self.strategy_name, every=self.every,
                                      fail_at=fail_at if env is None else ())
        else:
            sampler = samplers[0] if samplers else None
            self.geometry = sampler.geometry if sampler is not None else None
            self.seed = sampler.seed if sampler is not None else None
            self.target = steps if steps is not None else (
                sampler.steps if sampler is not None else None)
        self._strategy: Strategy | None = None
        self._prepared = False
        self._jit: JitCheckpoints | None = None
        self._excepthook: tuple[Callable[..., None], Callable[..., None]] | None = None
        if env is not None:
            end = env.deadline
        else:
            end = deadline if isinstance(deadline, (int, float)) else resolve_deadline(deadline)
        rule = DeadlineRule(k1=settings.deadline_k_step, k2=settings.deadline_k_ckpt)
        self._deadline = None if end is None else DeadlineClock(deadline=float(end), rule=rule)
        # Standalone, the watchdog runs only when asked for: with no supervisor to relaunch, a
        # hang it ends would just be a failed script.
        watched = env is not None or self.settings.source("hang_timeout_s") != "default"
        self._watchdog = Watchdog(WatchdogConfig(bound_s=settings.hang_timeout_s),
                                  self._on_hang) if watched else None
        self._restored: int | None = None
        # Set by a resume until the first step boundary writes restored.json: the step loaded,
        # each object's digest as loaded, the saved RNG entry, and this rank's streams as set.
        self._attest: tuple[int, dict[str, str], Any] | None = None
        self._load_s = 0.0
        self._rng_live: dict[str, Any] | None = None
        # A checkpoint waits to be loaded: iterating the data before restore() would silently
        # restart the data order, so the samplers refuse until then.
        pending = self._resume_target()
        if pending is not None:
            for sampler in samplers:
                sampler.expect_state(f"{self.run.paths.root} resumes after step {pending}")

    # --- settings --------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.run.rank

    @property
    def world_size(self) -> int:
        return self.run.world_size

    def _resume_target(self) -> int | None:
        env = self.run.env
        if env is not None:
            return env.resume_step
        pointer = read_latest(self.run.paths)
        return None if pointer is None else pointer.global_step

    def _meta(self, step: int) -> dict[str, Any]:
        geometry = self.geometry
        return {"global_step": step, "attempt": self.run.attempt, "world_size": self.world_size,
                "seed": self.seed,
                "global_batch": geometry.global_batch if geometry else None,
                "dataset_size": geometry.dataset_size if geometry else None,
                "model": self.log.model if self.log is not None else None,
                "keys": sorted(self.state), "time": time.time(), "ecrl_version": __version__}

    def _capture(self, rngs: list[dict[str, Any]], *, shards: bool = False) -> dict[str, Any]:
        """The state to save; ``shards``: a sharded strategy's, which takes this rank's own
        shards of a sharded model here (no collective; inside the measured stall), where the
        others' are gathered whole before the capture (a collective, every rank)."""
        if shards and self._full:
            self._full.gather(full=False)
        out = {key: self._full.state_dict(key) if key in self._full
               else _unwrap(obj).state_dict() for key, obj in self.state.items()}
        out[RNG_KEY] = {"world_size": self.world_size, "ranks": rngs}
        return out

    def _context(self, *, shards: bool | None = None) -> CheckpointContext:
        """The strategy's view of the job; ``shards``: whether it writes each rank's own shards
        (default: whether this checkpointer's strategy does)."""
        run = self.run
        if shards is None:
            shards = bool(getattr(strategy_class(self.strategy_name), "writes_shards", False))
        return CheckpointContext(
            paths=run.paths, attempt=run.attempt, rank=run.rank, world_size=run.world_size,
            geometry=self.geometry or Geometry(dataset_size=1, global_batch=1),
            target_steps=self.target if self.target is not None else 2**62,
            every=self.every, keep=self.keep, max_inflight=self.max_inflight,
            capture=functools.partial(self._capture, shards=shards), meta=self._meta,
            # A sharded optimizer's state is saved from gathered copies under the single-file
            # strategies (nothing of it can be copied later by the overlapped pipeline), and
            # from its live shards under the sharded ones (which sharded-async's pipeline copies
            # under the next step, as overlapped does a replicated optimizer's).
            optimizers=tuple(o for k, o in self.state.items()
                             if isinstance(o, torch.optim.Optimizer)
                             and (k not in self._full or shards)))

    def _build_strategy(self) -> Strategy:
        if self._strategy is None:
            self._strategy = make_strategy(self.strategy_name, self._context())
        return self._strategy

    # --- restore ---------------------------------------------------------------------------------

    def _resume_point(self) -> tuple[int, str, str | None] | None:
        env = self.run.env
        point: tuple[int, str, str | None] | None
        if env is not None:
            point = None if env.resume_step is None or env.resume_path is None else (
                env.resume_step, env.resume_path, env.resume_checksum)
        else:
            pointer = read_latest(self.run.paths)
            point = None if pointer is None else (
                pointer.global_step, pointer.path, pointer.checksum)
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # Every rank resumes from rank 0's choice: with one supervisor per node, two nodes
            # could otherwise read latest.json at different moments.
            box = [point]
            dist.broadcast_object_list(box, src=0)
            point = box[0]
        return point

    def restore(self) -> int:
        """Load the checkpoint this attempt resumes from; returns the next step (0: fresh)."""
        if self._restored is not None:
            return self._restored
        if self.log is not None:
            self.log.ensure_manifest()
        checkpoints = self.run.paths.checkpoints
        if self.rank == 0:
            checkpoints.mkdir(parents=True, exist_ok=True)
            # A link in its place would take every checkpoint write out of the run directory.
            safepath.require_dir(checkpoints, error=CheckpointError)
            clean_temporaries(checkpoints)
            atomic_write_text(self.run.paths.attempt_dir(self.run.attempt) / SETTINGS_FILE,
                              json.dumps(self.settings.record()) + "\n")
        point = self._resume_point()
        if point is None:
            if self.rank == 0 and self.run.attempt == 0:
                print(RNG_NOTE, file=sys.stderr, flush=True)
            for sampler in self.samplers:
                sampler.expect_state(None)
            self._restore_rng(lambda: self._seed_rank(0))
            self._restored = 0
            record_attempt(self.run, resumed=None)
            self._start_guards(0)
            return 0
        step, path, checksum = point
        fault = digests.restore_fault()
        if fault == "previous_checkpoint":  # TEST ONLY (digests.restore_fault)
            older = sorted(s for s in map(checkpoint_step, os.listdir(checkpoints))
                           if s is not None and s < step)
            if older:
                step, path, checksum = older[-1], checkpoint_name(older[-1]), None
        started = time.perf_counter()
        # Either format, whatever this attempt's strategy: a run may change strategy between
        # attempts (a .ckpt file of rank 0, or a sharded .dcp directory). Neither is ever
        # unpickled; a sharded checkpoint's parts are hashed by its loader as they are read.
        ckpt = read_checkpoint(checkpoint_in(checkpoints, path),
                               expected_checksum=checksum or None, check_parts=False)
        meta = ckpt.meta
        if meta.get("global_step") != step:
            raise CheckpointError(f"{ckpt.path}: holds step {meta.get('global_step')}, "
                                  f"latest.json names step {step}")
        mine = {"seed": self.seed, "dataset_size": self.geometry and self.geometry.dataset_size,
                "global_batch": self.geometry and self.geometry.global_batch,
                "model": self.log.model if self.log is not None else None}
        for key, value in mine.items():
            if value is not None and meta.get(key) is not None and meta[key] != value:
                raise CheckpointError(
                    f"{ckpt.path}: written by a run with {key}={meta[key]!r}, this run has "
                    f"{key}={value!r}: it does not belong to this run (use a new run directory, "
                    "or the settings it was written with)")
        if isinstance(ckpt, VerifiedShards):
            from ecrl.runtime.checkpoint import sharded  # DCP is imported only by runs that use it

            saved = sharded.load(ckpt)
        else:
            saved = statepack.decode(ckpt)
        keys = sorted(k for k in saved if k != RNG_KEY)
        if keys != sorted(self.state):
            raise CheckpointError(
                f"{ckpt.path}: holds {', '.join(keys)}, this Checkpointer has "
                f"{', '.join(sorted(self.state))}: checkpoint the same objects under the same "
                "names as the run that wrote it")
        loaded: dict[str, str] = {}
        for key, obj in self.state.items():
            wanted = saved[key]
            if fault == "skip_scheduler" and key == "scheduler":  # TEST ONLY
                continue
            if fault == "drop_optimizer" and key == "optimizer":  # TEST ONLY
                wanted = {**wanted, "state": {}}
            if key in self._full:
                self._full.load(key, wanted)
                continue  # its digest below, once every sharded entry is loaded
            _unwrap(obj).load_state_dict(wanted)
            if self.rank == 0:  # the digest of the state as loaded, from the live object
                loaded[key] = digests.live_digest(_read_back(obj, wanted))
        self._load_s = time.perf_counter() - started  # read, checked, loaded (and resharded)
        if self._full:
            self._full.gather()  # the state as loaded, whole (a collective)
            if self.rank == 0:
                for key in self.state:
                    if key in self._full:
                        loaded[key] = digests.live_digest(self._full.state_dict(key))
        self._attest = (step, loaded, saved[RNG_KEY])
        nxt = step + 1
        for sampler in self.samplers:
            if sampler.next_step != nxt:
                raise CheckpointError(f"{ckpt.path}: its sampler position (step "
                                      f"{sampler.next_step}) disagrees with its step {step}")
        ranks = saved[RNG_KEY]["ranks"]
        if fault == "skip_rng":  # TEST ONLY: the saved streams are never set
            pass
        elif self.rank < len(ranks):
            mine = ranks[self.rank]

            def load_rng() -> None:
                statepack.set_rng_state(mine)
                self._rng_live = statepack.rng_state()

            self._restore_rng(load_rng)
        else:
            self._restore_rng(lambda: self._seed_rank(nxt))
        self._restored = nxt
        # The checkpoint was read against its checksum: the attempt's own record of its resume.
        record_attempt(self.run, resumed=(step, ckpt.checksum))
        if self.target is not None and nxt >= self.target:  # the finished state: nothing to run
            record_completed(self.run, step)
        self._start_guards(nxt)
        return nxt

    def _start_guards(self, start: int) -> None:
        if self.strategy_name == "jit":
            strategy = self._build_strategy()
            if isinstance(strategy, JitCheckpoints):
                self._jit = strategy
                log = self.log
                strategy.attach(
                    start=start,
                    optimizers=[o for o in self.state.values()
                                if isinstance(o, torch.optim.Optimizer)],
                    modules=[_unwrap(o) for o in self.state.values()
                             if isinstance(_unwrap(o), torch.nn.Module)],
                    position=self._positions,
                    logged=None if log is None else (lambda: log.last_step))
                self._hook_uncaught()
        if self._watchdog is not None:
            self._watchdog.start()

    def _positions(self, step: int) -> dict[str, Any]:
        """The samplers' states after ``step`` (a rescue saves a step the sampler may have
        moved past: the step log marks a step done when it is logged, before its update)."""
        return {key: obj.state_at(step + 1) for key, obj in self.state.items()
                if isinstance(obj, GlobalBatchSampler)}

    def _hook_uncaught(self) -> None:
        """``jit``: an exception that ends the script uncaught (a loop not inside ``with
        ckpt:``) reaches the rescue too, from ``sys.excepthook``, before the usual report. Without
        it such a loop, the way ``docs/examples/ddp_train.py`` is written, lost the rescue: the
        survivor died with the peer and the attempt restarted from the last periodic checkpoint.
        Removed again by :meth:`close`."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: Any) -> None:
            self.rescue(exc)  # does not return when it applies
            previous(kind, exc, tb)

        self._excepthook = (hook, previous)
        sys.excepthook = hook

    def _restore_rng(self, action: Callable[[], None]) -> None:
        # With ECRL's sampler, when its first batch is drawn (see
        # GlobalBatchSampler.call_on_start: the DataLoader's own seed draw comes first); else now.
        if self.samplers:
            self.samplers[0].call_on_start(action)
        else:
            action()

    def _seed_rank(self, step: int) -> None:
        if self.seed is not None:
            seed_all(rank_seed(self.seed, self.rank, step))

    def _write_restored(self) -> None:
        """``restored.json`` (rank 0, atomic): the digests of the state this attempt loaded.

        At the first step boundary rather than in restore(): the RNG streams are set when the
        first batch is drawn, and every rank's streams as set are gathered here."""
        assert self._attest is not None
        step, loaded, saved_rng = self._attest
        self._attest = None
        live: list[Any] = [self._rng_live]
        if self.world_size > 1:
            gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(self._rng_live, gathered, dst=0)
            live = gathered or []
        if self.rank != 0:
            return
        rng = digests.rng_as_loaded(saved_rng, live)
        if rng is not None:
            loaded = {**loaded, RNG_KEY: digests.live_digest(rng)}
        record = {"schema_version": 1, "global_step": step, "digests": dict(sorted(loaded.items())),
                  "load_s": round(self._load_s, 6)}
        atomic_write_bytes(self.run.paths.attempt_dir(self.run.attempt) / digests.RESTORED_FILE,
                           (json.dumps(record, separators=(",", ":")) + "\n").encode())

    # --- the step boundary -----------------------------------------------------------------------

    def after_step(self, step: int) -> None:
        """Call after each step's update (its ``log.step`` came before the backward pass): the
        next step's RNG streams, the checkpoint when due, then the injected failure when due."""
        if self._restored is None:
            raise ConfigError("Checkpointer.after_step before restore(): call restore() before "
                              "the loop, and start the loop at the step it returns")
        for sampler in self.samplers:
            sampler.step_done(step)
        if self._attest is not None:
            self._write_restored()
        strategy = self._build_strategy()
        if self._jit is not None:
            self._jit.step_completed(step)
        self._seed_rank(step + 1)  # the RNG policy, whatever the strategy: before any capture
        if self._full and not strategy.writes_shards and \
                (not self._prepared or strategy.due(step)):
            # every rank, before the capture (rank 0's only, or all): a collective (the sharded
            # strategies take each rank's own shards in the capture, which every rank runs)
            self._full.gather()
        if not self._prepared:
            strategy.prepare()
            self._prepared = True
            if self._deadline is not None:
                self._deadline.estimated_ckpt_s = estimate_ckpt_s(strategy._size_hint())
        now = time.perf_counter()
        if self._deadline is not None:
            self._deadline.step_done(now)
        strategy.settle()
        if strategy.due(step):
            strategy.checkpoint(step)
            took = time.perf_counter() - now
            if self._deadline is not None:
                self._deadline.checkpoint_took(took)
            if self._watchdog is not None:
                self._watchdog.boundary(took)
        if self.failures.due(step, self.rank):
            inject(self.run.paths, attempt=self.run.attempt, step=step, rank=self.rank)
        if self._deadline is not None and self._stop_for_deadline(step):
            self._final_checkpoint(step, strategy)
        if self._watchdog is not None:
            self._watchdog.beat(step)
        if self._jit is not None:
            self._jit.boundary_done()

    # --- the deadline ----------------------------------------------------------------------------

    def _stop_for_deadline(self, step: int) -> bool:
        clock = self._deadline
        assert clock is not None
        if self.target is not None and step >= self.target - 1:
            return False  # the run ends here anyway
        stop = clock.should_stop(time.time())
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            # One all-reduce (MAX) of the decision: the ranks stop at the same step.
            flag = torch.tensor([1 if stop else 0], dtype=torch.int32)
            if dist.get_backend() == "nccl":
                flag = flag.cuda()
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop

    def _final_checkpoint(self, step: int, strategy: Strategy) -> None:
        clock = self._deadline
        assert clock is not None
        t0 = time.perf_counter()
        saved = strategy.due(step) and strategy.name != "none"
        strategy.close()  # pending background writes first: latest.json never moves back
        if not saved:
            if self._full:
                self._full.gather()
            final = BlockingCheckpoints(self._context(shards=False))
            final.name = "deadline"
            final.checkpoint(step)
            final.close()
        if self.rank == 0:
            atomic_write_text(self.run.paths.attempt_dir(self.run.attempt) / DEADLINE_MARKER,
                              json.dumps({"global_step": step, "deadline": clock.deadline,
                                          "committed": time.time(),
                                          "final_s": time.perf_counter() - t0,
                                          "max_step_s": clock.max_step_s,
                                          "max_ckpt_s": clock.ckpt_s,
                                          "k1": clock.rule.k1, "k2": clock.rule.k2}) + "\n")
            print(f"ecrl (rank 0): deadline in {clock.deadline - time.time():.1f} s: stopped "
                  f"after step {step} with its checkpoint committed", file=sys.stderr,
                  flush=True)
        if self._watchdog is not None:
            self._watchdog.stop()
        if self.world_size > 1 and dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
        raise SystemExit(DEADLINE_EXIT_CODE)

    # --- hangs and dead peers --------------------------------------------------------------------

    def _on_hang(self, waited: float, bound: float, last_step: int | None) -> None:
        """The watchdog thread: this rank's step has not completed within the bound."""
        paths, attempt = self.run.paths, self.run.attempt
        with contextlib.suppress(OSError):
            atomic_write_text(paths.attempt_dir(attempt) / HUNG_MARKER.format(rank=self.rank),
                              json.dumps({"rank": self.rank, "last_step": last_step,
                                          "waited_s": waited, "bound_s": bound,
                                          "time": time.time(),
                                          # the supervisor ends the hung ranks once this
                                          # process is gone (supervision.hung)
                                          "pid": os.getpid(),
                                          "host": socket.gethostname()}) + "\n")
        reason = f"no step completed for {waited:.1f} s (hang bound {bound:.1f} s)"
        if self._jit is not None:
            exit_after_rescue(self._jit, reason, code=HUNG_EXIT_CODE)
        with contextlib.suppress(OSError, ValueError):
            print(f"ecrl (rank {self.rank}): {reason}; ending the attempt", file=sys.stderr,
                  flush=True)
        os._exit(HUNG_EXIT_CODE)

    def rescue(self, exc: BaseException) -> None:
        """``jit``: save from this (healthy) rank after ``exc`` ended its loop, then exit.
        Returns (doing nothing) for other strategies, a user's mistake, or a fatal error."""
        if self._jit is None or not isinstance(exc, Exception) or isinstance(exc, EcrlError) \
                or fatal_reason(exc, self.run.paths.root) is not None:
            return
        if self._watchdog is not None:
            self._watchdog.stop()
        exit_after_rescue(self._jit, rescue_reason(exc))

    def close(self) -> None:
        """Make every checkpoint taken so far durable (the end of the attempt)."""
        if self._excepthook is not None:
            hook, previous = self._excepthook
            self._excepthook = None
            if sys.excepthook is hook:
                sys.excepthook = previous
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._strategy is not None:
            self._strategy.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, kind: object, exc: BaseException | None, tb: object) -> None:
        if exc is None:
            self.close()
            return
        self.rescue(exc)  # jit: does not return when it applies
        with contextlib.suppress(Exception):  # the exception in flight says more
            self.close()
