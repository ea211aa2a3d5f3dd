"""What every case-study script shares and what is not under study: a toy data set, a tiny
model, DDP on gloo, and the command line.

The case scripts (``case_*.py`` beside this file, ``docs/case-studies.md``) differ only in the
part being judged: the data loader and the script's own resume logic. Each runs under
``ecrl launch --out RUN ... -- python docs/examples/case_NAME.py``, which starts it under torchrun,
injects the failures and relaunches it (at another world size when asked); ``ecrl-verify RUN``
then judges what the logs say reached each step.
"""

from __future__ import annotations

import argparse
import gc
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

import ecrl

FEATURES = 8
CLASSES = 2


def parse_args(argv: Sequence[str] | None = None, *, dataset_size: int = 40,
               global_batch: int = 8, steps: int = 15,
               extra: Sequence[tuple[str, dict[str, Any]]] = ()) -> argparse.Namespace:
    """The flags every case takes; ``extra`` adds a case's own (``(flag, add_argument kw)``)."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", default=None,
                        help="run directory when started without `ecrl launch`")
    parser.add_argument("--dataset-size", type=int, default=dataset_size)
    parser.add_argument("--global-batch", type=int, default=global_batch)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epoch-coverage", choices=("all", "drop_remainder"), default=None,
                        help="drop_remainder: the loader's epochs leave some IDs out "
                             "(drop_last with a remainder)")
    for flag, kwargs in extra:
        parser.add_argument(flag, **kwargs)
    return parser.parse_args(argv)


def external_step_log(args: argparse.Namespace, steps_per_epoch: int,
                      **sampler: Any) -> ecrl.StepLog:
    """The step log of a loop fed by a sampler ECRL does not know (the verifier's audit mode):
    ``sampler`` describes it in ``run.json``; the loop passes its own epoch and cursor step."""
    return ecrl.StepLog(
        args.run_dir, steps=args.steps, dataset_size=args.dataset_size,
        global_batch=args.global_batch, seed=args.seed, steps_per_epoch=steps_per_epoch,
        sampler={"kind": "external", **sampler}, epoch_coverage=args.epoch_coverage)


def distributed_loader(data: Dataset[Any], args: argparse.Namespace, world: int, *,
                       drop_last: bool) -> tuple[DistributedSampler[int], DataLoader[Any]]:
    """torch's ``DistributedSampler`` (shuffled, seeded) and a ``DataLoader`` of this rank's
    share of the global batch, as most DDP scripts build them."""
    sampler: DistributedSampler[int] = DistributedSampler(data, shuffle=True, seed=args.seed,
                                                          drop_last=drop_last)
    return sampler, DataLoader(data, batch_size=args.global_batch // world, sampler=sampler,
                               drop_last=drop_last)


def init_distributed() -> tuple[int, int]:
    """Rank and world size, with a gloo process group when torchrun started us."""
    if "WORLD_SIZE" in os.environ and not dist.is_initialized():
        dist.init_process_group("gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class Points(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """``size`` labelled points, the same for a given seed on every rank and every launch."""

    def __init__(self, size: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, FEATURES, generator=g)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def make_model(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    """A linear classifier (DDP-wrapped when distributed) and its optimizer."""
    torch.manual_seed(seed)
    model: nn.Module = nn.Linear(FEATURES, CLASSES)
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: torch.Tensor,
               y: torch.Tensor) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


class LoopState:
    """The loop's own counters, checkpointed through the Stateful protocol."""

    def __init__(self, **values: int) -> None:
        self.values = dict(values)

    def __getitem__(self, key: str) -> int:
        return self.values[key]

    def __setitem__(self, key: str, value: int) -> None:
        self.values[key] = int(value)

    def state_dict(self) -> dict[str, int]:
        return dict(self.values)

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.values = {k: int(v) for k, v in state.items()}


def finish() -> None:
    """End the process group; call it after ``main()`` has returned.

    By then the DDP model, which holds the process group, has gone with ``main``'s frame: with
    gloo on torch 2.14, a DDP module that outlives ``destroy_process_group`` (or is torn down
    at interpreter exit) sometimes aborts the process ("terminate called without an active
    exception") after a run that completed, and the supervisor then relaunches it.
    """
    if dist.is_initialized():
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
