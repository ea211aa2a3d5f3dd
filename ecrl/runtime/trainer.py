"""The DDP training process that torchrun launches (``python -m ecrl.runtime.trainer``), one per
rank.

Each step follows the timeline of seed ``000_…`` §4.6, in this order:

1. build this rank's shard of the step's global window (:mod:`ecrl.runtime.sampler`);
2. forward, backward (DDP all-reduces the gradients), optimizer and scheduler update;
3. append the step record to ``logs/attempt-NNN/rank-NNN.jsonl`` and flush it;
4. the checkpoint boundary, if one is due (:mod:`ecrl.runtime.strategies`);
5. failure injection, if one is due (:mod:`ecrl.runtime.failure`).

Determinism: a fixed seed and world size give bit-identical parameters and losses whether or not
the run was interrupted, because every input of a step is restored or recomputed exactly: the
data of a sample is a function of its ID, the shard of a step is a function of the step, the
model, optimizer, scheduler and sampler come from the checkpoint, so do every rank's RNG states
(Python, NumPy, torch CPU and CUDA), algorithms are deterministic and the thread count is fixed.

Run-level settings come from ``run.json`` (written by the supervisor); per-attempt ones (attempt
number, checkpoint to resume from, failures still to inject) from the ``ECRL_*`` environment
(:mod:`ecrl.runtime.launchenv`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ecrl import __version__
from ecrl.contract.atomicio import atomic_write_bytes, atomic_write_text
from ecrl.contract.ckptfile import CheckpointError, read_verified
from ecrl.contract.errors import ConfigError, EcrlError
from ecrl.contract.runformat import JsonlWriter, RunManifest, RunPaths, StepRecord, read_json_record
from ecrl.contract.semantics import Geometry, format_hash, ids_hash, mix64_int
from ecrl.runtime import statepack
from ecrl.runtime.bgwriter import WriterCrashed
from ecrl.runtime.datasets import build_dataset
from ecrl.runtime.failure import FATAL_EXIT_CODE, FailurePlan, fatal_reason, inject, write_fatal
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.models import build_model
from ecrl.runtime.persist import clean_temporaries
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.sampler import ResumableSampler
from ecrl.runtime.strategies import CheckpointContext, make_strategy

__all__ = ["FINAL_DIR", "ResumePoint", "Trainer", "main", "params_digest"]

FINAL_DIR = "final"


def params_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in ``state_dict`` order."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"sha256:{h.hexdigest()}"


def _seed_all(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _rank_seed(seed: int, rank: int, step: int) -> int:
    """The seed of rank ``rank``'s training RNG streams when no saved state covers it."""
    return mix64_int(mix64_int(seed) ^ mix64_int(rank * 2**32 + step)) & (2**63 - 1)


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumePoint:
    """The checkpoint the supervisor chose for this attempt (what latest.json named)."""

    step: int
    path: str
    """Relative to ``checkpoints/``."""
    checksum: str


class Trainer:
    def __init__(self, *, paths: RunPaths, attempt: int, resume: ResumePoint | None,
                 failures: FailurePlan) -> None:
        self.paths = paths
        self.attempt = attempt
        self.resume = resume
        self.failures = failures
        self.manifest = read_json_record(paths.manifest, RunManifest)
        self.config = RunConfig.from_dict(self.manifest.extra["config"])
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        self.geometry = Geometry(dataset_size=self.manifest.dataset_size,
                                 global_batch=self.manifest.global_batch)
        self.target = self.manifest.target_steps

    # --- setup ---------------------------------------------------------------------------------

    def _setup_runtime(self) -> None:
        torch.set_num_threads(self.config.threads_per_rank(self.local_world_size))
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        timeout = timedelta(seconds=self.config.collective_timeout_s)
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank)
            torch.cuda.set_device(self.device)
            dist.init_process_group("nccl", timeout=timeout, device_id=self.device)
        else:
            self.device = torch.device("cpu")
            dist.init_process_group("gloo", timeout=timeout)

    def _load_checkpoint(self) -> Any:
        assert self.resume is not None
        ckpt = read_verified(self.paths.checkpoints / self.resume.path,
                             expected_checksum=self.resume.checksum)
        meta = ckpt.meta
        if meta.get("global_step") != self.resume.step:
            raise CheckpointError(
                f"{ckpt.path}: holds step {meta.get('global_step')}, the supervisor asked for "
                f"step {self.resume.step}"
            )
        expected = {"seed": self.manifest.seed, "global_batch": self.manifest.global_batch,
                    "dataset_size": self.manifest.dataset_size, "model": self.manifest.model}
        for key, mine in expected.items():
            if meta.get(key) != mine:
                raise CheckpointError(
                    f"{ckpt.path}: written by a run with {key}={meta.get(key)!r}, this run has "
                    f"{key}={mine!r}: it does not belong to this run"
                )
        return statepack.decode(ckpt)

    def _restore_rng(self, saved: dict[str, Any], next_step: int) -> None:
        ranks = saved["ranks"]
        if self.rank < len(ranks):
            # Same rank index, same streams. At another world size the extra ranks start
            # fresh streams derived from the seed and the step (documented in docs/runtime.md).
            statepack.set_rng_state(ranks[self.rank])
        else:
            _seed_all(_rank_seed(self.manifest.seed, self.rank, next_step))

    # --- the loop ------------------------------------------------------------------------------

    def run(self) -> int:
        self._setup_runtime()
        paths, rank, world = self.paths, self.rank, self.world_size
        if rank == 0:
            paths.checkpoints.mkdir(parents=True, exist_ok=True)
            clean_temporaries(paths.checkpoints)
        dataset = build_dataset(self.config.dataset,
                                data_dir=Path(self.config.data_dir)
                                if self.config.data_dir else None,
                                size=self.manifest.dataset_size
                                if self.config.dataset == "fake" else None,
                                image_size=self.config.image_size)
        if len(dataset) != self.manifest.dataset_size:
            raise ConfigError(
                f"the dataset now has {len(dataset)} samples, run.json says "
                f"{self.manifest.dataset_size}: the data changed since the run started"
            )

        _seed_all(self.manifest.seed)  # identical initial weights on every rank and attempt
        model = build_model(self.config.model, num_classes=dataset.num_classes,
                            side=self.config.image_size).to(self.device)
        saved = self._load_checkpoint() if self.resume else None
        if saved is not None:
            model.load_state_dict(saved["model"])
        ddp = DistributedDataParallel(
            model, device_ids=[self.local_rank] if self.device.type == "cuda" else None)
        optimizer = torch.optim.SGD(ddp.parameters(), lr=self.config.lr, momentum=0.9,
                                    weight_decay=5e-4)
        scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=self.target)
        sampler = ResumableSampler(self.geometry, seed=self.manifest.seed, rank=rank,
                                   world_size=world)
        if saved is not None:
            optimizer.load_state_dict(saved["optimizer"])
            scheduler.load_state_dict(saved["scheduler"])
            sampler.load_state_dict(saved["sampler"])
            assert self.resume is not None
            if sampler.next_step != self.resume.step + 1:
                raise CheckpointError("the checkpoint's sampler position disagrees with its step")
            self._restore_rng(saved["rng"], sampler.next_step)
        else:
            _seed_all(_rank_seed(self.manifest.seed, rank, 0))
        del saved

        def capture(rngs: list[dict[str, Any]]) -> dict[str, Any]:
            return {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "sampler": sampler.state_dict(),
                "rng": {"world_size": world, "ranks": rngs},
            }

        def meta(step: int) -> dict[str, Any]:
            return {"global_step": step, "attempt": self.attempt, "world_size": world,
                    "seed": self.manifest.seed, "global_batch": self.manifest.global_batch,
                    "dataset_size": self.manifest.dataset_size, "model": self.manifest.model,
                    "time": time.time(), "ecrl_version": __version__}

        strategy = make_strategy(self.manifest.strategy, CheckpointContext(
            paths=paths, attempt=self.attempt, rank=rank, world_size=world,
            geometry=self.geometry, target_steps=self.target, every=self.manifest.ckpt_every,
            keep=self.config.keep_checkpoints, max_inflight=self.config.max_inflight,
            capture=capture, meta=meta))
        log = JsonlWriter(paths.rank_log(self.attempt, rank))
        local_batch = sampler.local_batch
        first = True
        ddp.train()
        for step, ids in sampler:
            if step >= self.target:
                break
            t0 = time.perf_counter()
            x, y = dataset.batch(ids)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(ddp(x), y)
            loss.backward()
            optimizer.step()
            scheduler.step()
            value = float(loss.item())
            now = time.time()
            epoch, cursor = self.geometry.locate(step)
            log.write(StepRecord(
                attempt=self.attempt, global_step=step, epoch=epoch, cursor_step=cursor,
                rank=rank, world_size=world,
                local_batch=local_batch, sample_ids_count=int(ids.size),
                sample_ids_hash=format_hash(ids_hash(ids)),
                loss=value if math.isfinite(value) else None, time=now,
                sample_ids=ids.tolist() if self.manifest.log_ids else None,
                extra={"step_s": time.perf_counter() - t0},
            ))
            if first:
                strategy.prepare()
                first = False
            if strategy.due(step):
                strategy.checkpoint(step)
            if self.failures.due(step, rank):
                inject(paths, attempt=self.attempt, step=step, rank=rank)
        strategy.close()
        log.close()
        if rank == 0:
            self._write_final(model)
        if world > 1:
            dist.barrier()
        dist.destroy_process_group()
        return 0

    def _write_final(self, model: torch.nn.Module) -> None:
        state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        buffer = io.BytesIO()
        torch.save(state, buffer)
        final = self.paths.root / FINAL_DIR
        atomic_write_bytes(final / "model.pt", buffer.getvalue())
        summary = {"global_step": self.target - 1, "attempt": self.attempt,
                   "world_size": self.world_size, "params_digest": params_digest(state),
                   "time": time.time()}
        atomic_write_text(final / "summary.json", json.dumps(summary, indent=2) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    env = AttemptEnv.from_environ()
    if env is None:
        print("ecrl trainer: start it with `ecrl run` (it reads its attempt from the ECRL_* "
              "environment the supervisor sets)", file=sys.stderr)
        return FATAL_EXIT_CODE
    paths = RunPaths.of(env.run_dir)
    resume = None
    if env.resume_step is not None and env.resume_path is not None:
        resume = ResumePoint(step=env.resume_step, path=env.resume_path,
                             checksum=env.resume_checksum or "")
    failures = FailurePlan(steps=frozenset(env.fail_at), rank=env.fail_rank)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return Trainer(paths=paths, attempt=env.attempt, resume=resume,
                       failures=failures).run()
    except WriterCrashed as exc:
        # Restartable: the supervisor relaunches from the last durable checkpoint.
        print(f"ecrl trainer (rank {rank}): {exc}", file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        # A problem no restart can fix (ours, or failure.fatal_reason's: a full disk, a broken
        # data file, an impossible allocation): say so once, tell the supervisor not to retry.
        message = str(exc) if isinstance(exc, EcrlError) else fatal_reason(exc, paths.root)
        if message is None:
            raise  # a crash: the supervisor shows this traceback's last line and relaunches
        with contextlib.suppress(OSError):  # on a full disk even this may not fit
            write_fatal(paths, attempt=env.attempt, rank=rank, message=message)
        with contextlib.suppress(OSError):
            print(f"ecrl trainer (rank {rank}): error: {message}", file=sys.stderr, flush=True)
        return FATAL_EXIT_CODE


if __name__ == "__main__":
    sys.exit(main())
