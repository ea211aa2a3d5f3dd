"""A user's own DDP training script with ECRL adopted (docs/library.md): own model, own data set.

    ecrl launch --out runs/example --world-sizes 2,1 --fail-at 9,21 --ckpt-every 4 \
        -- python docs/examples/ddp_train.py --steps 30
    ecrl-verify runs/example

or without ECRL's supervisor, each launch a new attempt that resumes where the last one left:

    torchrun --standalone --nproc-per-node 2 docs/examples/ddp_train.py --out runs/plain
    ecrl-verify runs/plain"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
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
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=8, help="global batch, over all ranks")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", help="run directory when not started by `ecrl launch`")
    p.add_argument("--step-delay", type=float, default=0.0,
                   help="seconds of extra work per step (stands for a bigger model's)")
    args = p.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(0)  # the same initial weights on every rank
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 2))
    model = nn.parallel.DistributedDataParallel(net.to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
    data = Points(200)

    # ECRL: the sampler, the step log and the checkpointer (settings from `ecrl launch`).
    sampler = ecrl.GlobalBatchSampler(len(data), args.batch, seed=0, steps=args.steps)
    loader = DataLoader(ecrl.WithSampleIds(data), batch_sampler=sampler,
                        num_workers=args.workers)
    log = ecrl.StepLog(args.out, sampler=sampler, steps=args.steps)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "scheduler": sched,
                              "sampler": sampler}, log=log, every=10)
    start = ckpt.restore()  # 0, or the step after the checkpoint this attempt resumes from

    for step, (ids, (x, y)) in zip(range(start, args.steps), loader, strict=False):
        loss = F.cross_entropy(model(x.to(device)), y.to(device))
        # The IDs this batch really carried, logged before the gradients reach the all-reduce.
        log.step(step, sample_ids=ids, loss=loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        time.sleep(args.step_delay)
        ckpt.after_step(step)  # the next step's RNG streams; checkpoint when due; injected failure

    ckpt.close()
    log.close()
    if dist.get_rank() == 0:
        torch.save(net.state_dict(), log.paths.root / "final.pt")
    dist.barrier()  # gloo aborts a rank that leaves while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
