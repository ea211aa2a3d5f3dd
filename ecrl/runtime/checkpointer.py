"""``ecrl.Checkpointer``: the commit protocol and the strategies over any dict of Stateful objects.

``Checkpointer({"model": ddp_model, "optimizer": opt, "scheduler": sched, "sampler": sampler})``
saves and restores each value through torch's Stateful protocol (``state_dict`` and
``load_state_dict``; a ``DistributedDataParallel`` model is unwrapped so that the checkpoint
holds the plain module's keys). Every rank's RNG states (Python, NumPy, torch CPU, CUDA) are
gathered at each checkpoint and restored at resume; a rank that has no saved streams (the job grew,
or a fresh start) gets streams derived from the run's seed, its rank and the step, so that the
same run gives the same numbers however often it was interrupted.

:meth:`Checkpointer.restore` loads the checkpoint this attempt resumes from (the one the
supervisor chose, or ``checkpoints/latest.json`` when running standalone), verifies its checksum,
refuses one written by a run with another data set, global batch or seed, and returns the next
step to run (0 on a fresh start). :meth:`Checkpointer.after_step` is the step boundary: the
checkpoint when one is due (:mod:`ecrl.runtime.strategies`, chosen by name from
:mod:`ecrl.runtime.registry`), then the injected failure when one is due
(:mod:`ecrl.runtime.failure`).

Settings (strategy, interval, retention, failures) come from the supervisor's environment under
``ecrl launch``/``ecrl run`` and from the constructor's arguments otherwise.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ecrl import __version__
from ecrl.contract.ckptfile import CheckpointError, read_verified
from ecrl.contract.errors import ConfigError
from ecrl.contract.semantics import Geometry, mix64_int
from ecrl.runtime import statepack
from ecrl.runtime._attempt import Attempt, resolve_attempt
from ecrl.runtime.batch_sampler import GlobalBatchSampler
from ecrl.runtime.failure import FailurePlan, inject
from ecrl.runtime.persist import clean_temporaries, read_latest
from ecrl.runtime.registry import built_strategies
from ecrl.runtime.steplog import StepLog
from ecrl.runtime.strategies import CheckpointContext, Strategy, make_strategy

__all__ = ["Checkpointer", "seed_all", "rank_seed"]

RNG_KEY = "rng"


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of ``rank``'s training RNG streams from ``step`` on, when no saved state
    covers it."""
    return mix64_int(mix64_int(seed) ^ mix64_int(rank * 2**32 + step)) & (2**63 - 1)


def _unwrap(obj: Any) -> Any:
    if isinstance(obj, torch.nn.parallel.DistributedDataParallel):
        return obj.module
    return obj


def _pick(env_value: Any, arg: Any, default: Any) -> Any:
    if env_value is not None:
        return env_value
    return default if arg is None else arg


class Checkpointer:
    """Checkpoints and restores ``state`` (name → Stateful object) for one attempt.

    ``log``: the run's :class:`ecrl.StepLog` (run directory, attempt, data set and seed to check
    checkpoints against); without one, pass ``run_dir``. ``strategy`` (none, blocking,
    overlapped), ``every`` (checkpoint after every K-th step; 0: never), ``keep``,
    ``max_inflight``, ``fail_at``, ``fail_rank``: used when no supervisor set them.
    """

    def __init__(self, state: Mapping[str, Any], *, log: StepLog | None = None,
                 run_dir: str | os.PathLike[str] | None = None, strategy: str | None = None,
                 every: int | None = None, keep: int | None = None,
                 max_inflight: int | None = None, fail_at: Sequence[int] = (),
                 fail_rank: int = 0, steps: int | None = None) -> None:
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
        self.strategy_name = str(_pick(env and env.strategy, strategy, "blocking"))
        if self.strategy_name not in built_strategies():
            raise ConfigError(f"Checkpointer(strategy={self.strategy_name!r}): choose one of "
                              f"{', '.join(built_strategies())}")
        self.every = int(_pick(env and env.ckpt_every, every, 0))
        if self.strategy_name == "none":
            self.every = 0
        self.keep = int(_pick(env and env.keep_checkpoints, keep, 2))
        self.max_inflight = int(_pick(env and env.max_inflight, max_inflight, 2))
        self.failures = FailurePlan(
            steps=frozenset(env.fail_at if env is not None else fail_at),
            rank=env.fail_rank if env is not None else fail_rank)
        samplers = [o for o in self.state.values() if isinstance(o, GlobalBatchSampler)]
        self.samplers = samplers
        if log is not None:
            self.geometry: Geometry | None = log.geometry
            self.seed: int | None = log.seed
            self.target: int | None = log.steps if steps is None else steps
            if env is None:
                log._checkpointing = {"strategy": self.strategy_name, "ckpt_every": self.every,
                                      "fail_at": sorted(set(fail_at))}
        else:
            sampler = samplers[0] if samplers else None
            self.geometry = sampler.geometry if sampler is not None else None
            self.seed = sampler.seed if sampler is not None else None
            self.target = steps if steps is not None else (
                sampler.steps if sampler is not None else None)
        self._strategy: Strategy | None = None
        self._prepared = False
        self._restored: int | None = None
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

    def _capture(self, rngs: list[dict[str, Any]]) -> dict[str, Any]:
        out = {key: _unwrap(obj).state_dict() for key, obj in self.state.items()}
        out[RNG_KEY] = {"world_size": self.world_size, "ranks": rngs}
        return out

    def _build_strategy(self) -> Strategy:
        if self._strategy is None:
            run = self.run
            self._strategy = make_strategy(self.strategy_name, CheckpointContext(
                paths=run.paths, attempt=run.attempt, rank=run.rank, world_size=run.world_size,
                geometry=self.geometry or Geometry(dataset_size=1, global_batch=1),
                target_steps=self.target if self.target is not None else 2**62,
                every=self.every, keep=self.keep, max_inflight=self.max_inflight,
                capture=self._capture, meta=self._meta))
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
            clean_temporaries(checkpoints)
        point = self._resume_point()
        if point is None:
            for sampler in self.samplers:
                sampler._pending = None
            self._restore_rng(lambda: self._seed_rank(0))
            self._restored = 0
            return 0
        step, path, checksum = point
        ckpt = read_verified(checkpoints / path, expected_checksum=checksum or None)
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
        saved = statepack.decode(ckpt)
        keys = sorted(k for k in saved if k != RNG_KEY)
        if keys != sorted(self.state):
            raise CheckpointError(
                f"{ckpt.path}: holds {', '.join(keys)}, this Checkpointer has "
                f"{', '.join(sorted(self.state))}: checkpoint the same objects under the same "
                "names as the run that wrote it")
        for key, obj in self.state.items():
            _unwrap(obj).load_state_dict(saved[key])
        nxt = step + 1
        for sampler in self.samplers:
            if sampler.next_step != nxt:
                raise CheckpointError(f"{ckpt.path}: its sampler position (step "
                                      f"{sampler.next_step}) disagrees with its step {step}")
        ranks = saved[RNG_KEY]["ranks"]
        if self.rank < len(ranks):
            mine = ranks[self.rank]
            self._restore_rng(lambda: statepack.set_rng_state(mine))
        else:
            self._restore_rng(lambda: self._seed_rank(nxt))
        self._restored = nxt
        return nxt

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

    # --- the step boundary -----------------------------------------------------------------------

    def after_step(self, step: int) -> None:
        """Call after each step's update (and its ``log.step``): checkpoint when due, then the
        injected failure when due."""
        if self._restored is None:
            raise ConfigError("Checkpointer.after_step before restore(): call restore() before "
                              "the loop, and start the loop at the step it returns")
        for sampler in self.samplers:
            sampler.step_done(step)
        strategy = self._build_strategy()
        if not self._prepared:
            strategy.prepare()
            self._prepared = True
        if strategy.due(step):
            strategy.checkpoint(step)
        if self.failures.due(step, self.rank):
            inject(self.run.paths, attempt=self.run.attempt, step=step, rank=self.rank)

    def close(self) -> None:
        """Make every checkpoint taken so far durable (the end of the attempt)."""
        if self._strategy is not None:
            self._strategy.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
