"""jit's steady-state cost against no checkpoints, measured inside one process.

Whole ``ecrl run``s (:mod:`ecrl.apps.bench.checkpoint`) of the same seed, data and steps swing by
±10% from one run to the next on a shared 2-core VM: a start-up, a page cache or another job's
burst decides more than a 1% cost does. Here one child process trains two copies of the same
model the way the built-in trainer does (its model, fake data, SGD with momentum and its
scheduler, DDP over a process group of one, one torch thread, a ``StepLog`` and a
``Checkpointer``), one with ``strategy="none"`` and one with ``"jit"`` (no periodic
checkpoints), in alternating blocks of steps: a burst of load from elsewhere lands on both
alike, and each pair of neighbouring blocks gives a ratio — their spread is the noise. jit's own
calls (the forward pre-hook that keeps the module buffers, the optimizer's step pre-hook, the
two boundary calls) are timed where they are paid.

On this VM the pairs still spread ±10% or more (another tenant's burst lands on one block of a
pair), and which copy of the model was built first moved the ratio by up to 20% between two
runs: the blocks bound jit's cost only loosely. The timed calls measure it directly; all that
they leave out is the dispatch of the two hooks (a few microseconds).

Run as ``python -m ecrl.apps.bench.jitcost JSON``: prints one JSON line.
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ecrl.apps.bench._common import timed_calls

__all__ = ["JIT_HOOKS", "measure"]

JIT_HOOKS = ("_before_forward", "_before_update", "step_completed", "boundary_done")
"""What jit does per step beyond what every strategy does (ecrl.runtime.checkpoint.jit)."""
DATASET_SIZE = 50_000


@dataclass(slots=True)
class _Trainee:
    net: Any
    optimizer: Any
    scheduler: Any
    log: Any
    ckpt: Any
    steps: Iterator[tuple[int, list[int]]]
    previous: float | None = None
    """When this copy's previous step record was written (the trainer's ``step_s``)."""


def measure(case: dict[str, Any]) -> dict[str, Any]:
    """``case``: model, global_batch, block (steps per block), pairs, warmup (blocks)."""
    root = Path(tempfile.mkdtemp(prefix="ecrl-bench-jitcost-"))
    try:
        return _measure(case, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _measure(case: dict[str, Any], root: Path) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    import ecrl
    from ecrl.runtime.checkpoint import jit
    from ecrl.runtime.checkpoint.checkpointer import seed_all
    from ecrl.runtime.trainer.datasets import build_dataset
    from ecrl.runtime.trainer.models import build_model
    from ecrl.runtime.trainer.trainer import make_optimizer, train_step

    torch.set_num_threads(1)
    spent: list[float] = []
    for name in JIT_HOOKS:
        setattr(jit.JitCheckpoints, name, timed_calls(getattr(jit.JitCheckpoints, name), spent))
    model_name, batch = case["model"], case["global_batch"]
    block, pairs, warmup = case["block"], case["pairs"], case["warmup"]
    total = (warmup + pairs) * block
    dist.init_process_group("gloo", init_method=f"file://{root / 'store'}", rank=0, world_size=1)
    data = build_dataset("fake", data_dir=None, size=DATASET_SIZE, model=model_name)
    cpu = torch.device("cpu")

    def trainee(strategy: str) -> _Trainee:
        seed_all(0)
        net = DistributedDataParallel(build_model(model_name, num_classes=data.num_classes))
        optimizer, scheduler = make_optimizer(net, lr=0.05, steps=total)
        sampler = ecrl.GlobalBatchSampler(DATASET_SIZE, batch, seed=0, steps=total)
        log = ecrl.StepLog(root / strategy, sampler=sampler, steps=total, log_ids=False,
                           model=model_name, dataset="fake")
        ckpt = ecrl.Checkpointer({"model": net, "optimizer": optimizer, "scheduler": scheduler,
                                  "sampler": sampler}, log=log, strategy=strategy, every=0)
        start = ckpt.restore()
        net.train()
        return _Trainee(net, optimizer, scheduler, log, ckpt,
                        zip(range(start, total), sampler, strict=True))

    def run_block(t: _Trainee) -> float:
        t0 = time.perf_counter()
        for _ in range(block):
            step, ids = next(t.steps)
            t.previous = train_step(step, ids, net=t.net, dataset=data, device=cpu,
                                    optimizer=t.optimizer, scheduler=t.scheduler, log=t.log,
                                    ckpt=t.ckpt, previous=t.previous)
        return time.perf_counter() - t0

    trainees = {"none": trainee("none"), "jit": trainee("jit")}
    for _ in range(warmup):
        for t in trainees.values():
            run_block(t)
    spent.clear()
    times: dict[str, list[float]] = {"none": [], "jit": []}
    for i in range(pairs):
        # Each pair in the other order than the last: neither strategy always runs first.
        for strategy in ("none", "jit") if i % 2 == 0 else ("jit", "none"):
            times[strategy].append(run_block(trainees[strategy]))
    for t in trainees.values():
        t.ckpt.close()
        t.log.close()
    dist.destroy_process_group()
    measured = pairs * block
    paired = [n / j for n, j in zip(times["none"], times["jit"], strict=True)]
    step_s = statistics.median(times["none"]) / block
    own_s = sum(spent) / measured
    return {"model": model_name, "block": block, "pairs": pairs, "none_step_s": step_s,
            "none_rate": measured / sum(times["none"]), "jit_rate": measured / sum(times["jit"]),
            "paired_min": min(paired), "paired_max": max(paired),
            "paired_median": statistics.median(paired), "own_s": own_s,
            "own_calls_per_step": len(spent) / measured, "own_share": own_s / step_s}


if __name__ == "__main__":
    print(json.dumps(measure(json.loads(sys.argv[1]))))
