"""The training process that torchrun launches (``python -m ecrl.runtime.trainer``: its
``__main__`` imports this module and runs :func:`main`),
one per rank: DDP, or (``--parallel fsdp|hsdp``, ``--tp``) the model sharded over this attempt's
device mesh (:func:`ecrl.init_mesh`), FSDP2 per block and at the root, tiny-gpt's layers split
over the tensor-parallel ranks, which consume the same shard of each window.

Each step follows the timeline of seed ``000_…`` §4.6, in this order:

1. this rank's shard of the step's global window (:class:`ecrl.GlobalBatchSampler`);
2. forward (the loss);
3. append the step record to ``logs/attempt-NNN/rank-NNN.jsonl`` and flush it
   (:class:`ecrl.StepLog`) — before the backward pass, so before this rank's gradients can enter
   the step's all-reduce: a rank that completed that all-reduce knows every rank logged the
   step, which is what lets ``jit`` save a survivor's live state without a per-step copy;
4. backward (DDP all-reduces the gradients; FSDP2 reduce-scatters them), optimizer and
   scheduler update;
5. the step boundary: the RNG streams of the next step, the checkpoint if one is due, then
   failure injection if one is due (:meth:`ecrl.Checkpointer.after_step`).

It uses only the public library API, as a user's own script does (``docs/library.md``).

Determinism: a fixed seed and world size give bit-identical parameters and losses whether or not
the run was interrupted, because every input of a step is restored or recomputed exactly: the
data of a sample is a function of its ID, the shard of a step is a function of the step, the
model, optimizer, scheduler and sampler come from the checkpoint, every rank's RNG streams are
derived from (seed, rank, step) at each step boundary (the run's RNG policy, whatever the
strategy), algorithms are deterministic and the thread count is fixed.

Run-level settings come from ``run.json`` (written by the supervisor); per-attempt ones (attempt
number, checkpoint to resume from, failures still to inject) from the ``ECRL_*`` environment
(:mod:`ecrl.runtime.launchenv`).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import io
import json
import os
import sys
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ecrl.contract.atomicio import atomic_write_bytes, atomic_write_text
from ecrl.contract.errors import ConfigError, EcrlError
from ecrl.contract.runformat import RunManifest, RunPaths, read_json_record
from ecrl.runtime.checkpoint.bgwriter import WriterCrashed
from ecrl.runtime.checkpoint.checkpointer import Checkpointer, seed_all
from ecrl.runtime.failure import FATAL_EXIT_CODE, fatal_reason, write_fatal
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.meshbuild import data_parallel_mesh, init_mesh
from ecrl.runtime.sampling.steplog import StepLog
from ecrl.runtime.trainer.datasets import build_dataset
from ecrl.runtime.trainer.models import build_model, parallelize
from ecrl.runtime.trainer.placement import choose_placement

__all__ = ["FINAL_DIR", "Trainer", "main", "make_optimizer", "params_digest", "train_step"]

FINAL_DIR = "final"


def params_digest(state: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in ``state_dict`` order."""
    h = hashlib.sha256()
    for name, tensor in state.items():
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return f"sha256:{h.hexdigest()}"


def make_optimizer(net: torch.nn.Module, *, lr: float, steps: int
                   ) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The built-in trainer's optimizer (SGD with momentum and weight decay) and its schedule
    (cosine over the run's ``steps``)."""
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    return optimizer, torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)


def train_step(step: int, ids: list[int], *, net: torch.nn.Module, dataset: Any,
               device: torch.device, optimizer: torch.optim.Optimizer, scheduler: Any,
               log: StepLog, ckpt: Checkpointer, previous: float | None) -> float:
    """One step of the built-in trainer on the batch of sample ``ids``: forward, the step record,
    backward, update, schedule, the checkpointer's boundary. ``previous``: when this rank's
    previous record was written (None: none yet this attempt); returns this record's time."""
    x, y = dataset.batch(np.asarray(ids, dtype=np.int64))
    x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    optimizer.zero_grad(set_to_none=True)
    # (batch, classes) or, for a language model, (batch, tokens, vocabulary)
    loss = F.cross_entropy(net(x).flatten(0, -2), y.flatten())
    # The record before the backward pass: before these gradients can enter the all-reduce.
    # step_s is record to record (one whole step); the first record of an attempt has none.
    now = time.perf_counter()
    extra: dict[str, Any] = {} if previous is None else {"step_s": now - previous}
    log.step(step, sample_ids=ids, loss=loss, **extra)
    loss.backward()
    optimizer.step()
    scheduler.step()
    ckpt.after_step(step)
    return now


class Trainer:
    """The built-in model and data set, trained with the public library API (``docs/library.md``):
    :class:`ecrl.GlobalBatchSampler`, :class:`ecrl.StepLog` and :class:`ecrl.Checkpointer`."""

    def __init__(self, *, paths: RunPaths, attempt: int) -> None:
        self.paths = paths
        self.attempt = attempt
        self.manifest = read_json_record(paths.manifest, RunManifest)
        self.config = RunConfig.from_dict(self.manifest.extra["config"])
        # Each part gets its section: what to train, how collectives behave, how to checkpoint.
        self.settings = self.config.trainer
        self.rank = int(os.environ["RANK"])
        self.world_size = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world_size)))
        self.target = self.manifest.target_steps

    def _setup_runtime(self) -> None:
        torch.set_num_threads(self.settings.threads_per_rank(self.local_world_size))
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
        placement = choose_placement(self.local_rank, self.local_world_size)
        placement.init_process_group(
            timedelta(seconds=self.config.supervisor.collective_timeout_s))
        self.device = placement.device
        if self.rank == 0 and self.device.type == "cuda":  # which GPU path ran, in torchrun.log
            print(f"ecrl trainer: ranks train on {placement.describe()}", file=sys.stderr,
                  flush=True)

    def run(self) -> int:
        self._setup_runtime()
        m = self.manifest
        t = self.settings
        dataset = build_dataset(t.dataset, data_dir=Path(t.data_dir) if t.data_dir else None,
                                size=m.dataset_size if t.dataset == "fake" else None,
                                image_size=t.image_size, model=t.model)
        if len(dataset) != m.dataset_size:
            raise ConfigError(
                f"the dataset now has {len(dataset)} samples, run.json says "
                f"{m.dataset_size}: the data changed since the run started"
            )

        c = self.config
        mesh = init_mesh(self.device.type, parallel=c.parallel, replicate=c.replicate, tp=c.tp)
        seed_all(m.seed)  # identical initial weights on every rank and attempt
        model = build_model(t.model, num_classes=dataset.num_classes,
                            side=t.image_size).to(self.device)
        net: torch.nn.Module
        if mesh is None:
            net = DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        else:  # sharded in place: the checkpointer saves it whole and reshards it on a resume
            net = parallelize(model, dp_mesh=data_parallel_mesh(mesh),
                              tp_mesh=mesh["tp"] if "tp" in mesh.mesh_dim_names else None)
        optimizer, scheduler = make_optimizer(net, lr=t.lr, steps=self.target)
        sampler = GlobalBatchSampler(m.dataset_size, m.global_batch, seed=m.seed,
                                     steps=self.target, mesh=mesh)
        log = StepLog(self.paths.root, sampler=sampler, steps=self.target, log_ids=m.log_ids,
                      model=m.model, dataset=str(m.dataset["name"]))
        ckpt = Checkpointer({"model": net, "optimizer": optimizer, "scheduler": scheduler,
                             "sampler": sampler}, log=log,
                            checkpoint=self.config.checkpoint)  # the run's: flags or defaults
        start = ckpt.restore()
        net.train()
        previous: float | None = None  # when this rank's previous record was written
        with ckpt:  # jit: an exception a dead peer causes reaches the checkpointer's rescue
            for step, ids in zip(range(start, self.target), sampler, strict=True):
                previous = train_step(step, ids, net=net, dataset=dataset, device=self.device,
                                      optimizer=optimizer, scheduler=scheduler, log=log,
                                      ckpt=ckpt, previous=previous)
        log.close()
        self._write_final(model, sharded=mesh is not None)
        if self.world_size > 1:
            dist.barrier()
        # DDP's reducer must go before its process group: with gloo, destroying the group under a
        # live reducer aborts the process at exit now and then ("terminate called without an
        # active exception"), and the supervisor would relaunch a run that had completed.
        del ckpt, optimizer, scheduler, net
        gc.collect()
        dist.destroy_process_group()
        return 0

    def _write_final(self, model: torch.nn.Module, *, sharded: bool) -> None:
        """Rank 0 writes the trained model whole; a sharded one is gathered first (by every
        rank: a collective)."""
        whole: dict[str, Any] = {}
        if sharded:
            from torch.distributed.checkpoint.state_dict import (
                StateDictOptions,
                get_model_state_dict,
            )

            whole = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                        cpu_offload=True))
        if self.rank != 0:
            return
        state = {k: v.detach().cpu() for k, v in (whole if sharded else model.state_dict()).items()}
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
    rank = int(os.environ.get("RANK", "0"))
    try:
        return Trainer(paths=paths, attempt=env.attempt).run()
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

