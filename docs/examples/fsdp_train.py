"""A user's own FSDP2 training script with ECRL adopted (docs/library.md, "FSDP2, HSDP and tensor
parallelism"): own model sharded with ``fully_shard`` over a 1-D device mesh, own data set.

    ecrl launch --out runs/fsdp --world-sizes 2,1 --fail-at 9 --ckpt-every 4 \
        -- python docs/examples/fsdp_train.py --steps 20
    ecrl-verify runs/fsdp

The data-parallel degree changes from 2 to 1 at the resume: the sampler re-cuts the same windows,
and the checkpointer saves the model and optimizer whole (gathered from their shards) and reshards
them for the mesh of the attempt that resumes. With ``--tp 2`` the mesh is 2-D (``dp`` x ``tp``):
the first layer is split column-wise and the last row-wise over ``tp``, FSDP2 shards over ``dp``,
and tensor-parallel peers consume the same batch (``--world-sizes 4,2``: DP 2 x TP 2, then
DP 1 x TP 2).

The mesh comes from ``ecrl.init_mesh``, which takes the script's own choice (``--tp`` here) unless
the launch was given one: ``ecrl launch --parallel hsdp --replicate 2 --world-sizes 4,2 -- python
docs/examples/fsdp_train.py`` trains it as HSDP (2 replica groups of 2 shards, then 1 of 2) with
no change to the script."""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, Dataset

import ecrl


class Points(Dataset):
    """Generated data: 16 features per sample, label = sign of their sum."""

    def __init__(self, size: int) -> None:
        self.x = torch.randn(size, 16, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=8, help="global batch, over all ranks")
    p.add_argument("--out", help="run directory when not started by `ecrl launch`")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same initial weights on every rank, before sharding
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2))
    # The mesh: FSDP2 unless `ecrl launch --parallel` says otherwise, --tp unless `ecrl launch
    # --tp` does (named dp, or dp_replicate x dp_shard, then tp).
    mesh = ecrl.init_mesh("cpu", parallel="fsdp", tp=args.tp)
    if "tp" in mesh.mesh_dim_names:
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            RowwiseParallel,
            parallelize_module,
        )

        parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=ecrl.data_parallel_mesh(mesh))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    data = Points(200)

    # ECRL: the sampler (given the mesh), the step log and the checkpointer.
    sampler = ecrl.GlobalBatchSampler(len(data), args.batch, seed=0, steps=args.steps,
                                      mesh=mesh)
    loader = DataLoader(ecrl.WithSampleIds(data), batch_sampler=sampler)
    log = ecrl.StepLog(args.out, sampler=sampler, steps=args.steps)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler}, log=log,
                             every=4)
    start = ckpt.restore()

    for step, (ids, (x, y)) in zip(range(start, args.steps), loader, strict=False):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log.step(step, sample_ids=ids, loss=loss)
        ckpt.after_step(step)

    ckpt.close()
    log.close()
    dist.barrier()  # gloo aborts a rank that leaves while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
