"""An HF Accelerate script with ECRL's step log (docs/library.md, "HF Accelerate").

Audit mode: Accelerate prepares the loader and the script resumes as Accelerate's docs show
(``load_state`` of the newest ``step_N`` folder, then ``skip_first_batches``); ECRL proves what
that did.

    accelerate launch --multi_gpu --num_processes 2 docs/examples/accelerate_train.py \\
        --out runs/acc --fail-at 12                                   # killed after step 12
    accelerate launch --multi_gpu --num_processes 2 docs/examples/accelerate_train.py \\
        --out runs/acc
    ecrl-verify runs/acc

(``--multi_gpu`` starts the processes with torchrun; ``Accelerator(cpu=True)`` keeps them on the
CPU over gloo. ``accelerate launch --cpu`` would start a single process.)

Exact mode (``--exact``): ECRL's sampler (the tracker turns off Accelerate's sharding of it), its
position in Accelerate's checkpoint: the same documented resume continues at the next step's
window (``skip_first_batches`` of the tracked loader skips nothing), also with ``accelerate
launch --num_processes 1`` after a run on 2.

The tracker hooks the loader (the loop gets batches without their IDs) and
``accelerator.backward`` (one step record per step): the loop is as it would be without ECRL.

Under ``ecrl launch`` the script runs as it is (``ecrl launch`` starts it with torchrun, which is
what ``accelerate launch --multi_gpu`` does: Accelerate takes its process count from torchrun's
environment); the run directory comes from ``ecrl launch --out``:

    ecrl launch --out runs/acc --world-sizes 2,1 --fail-at 5,9 -- \
        python docs/examples/accelerate_train.py --exact
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ecrl.integrations.accelerate import ECRLTracker, GlobalBatchSampler, WithSampleIds


class Points(Dataset):
    """Generated data: 8 features per sample, label = sign of their sum."""

    def __init__(self, size: int) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def latest(folder: Path) -> tuple[Path, int] | None:
    """The newest ``step_N`` checkpoint folder and N (steps completed), as Accelerate's example
    finds it."""
    found = [(int(p.name[5:]), p) for p in folder.glob("step_*") if p.name[5:].isdigit()]
    if not found:
        return None
    steps, path = max(found)
    return path, steps


def main() -> Accelerator:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("ECRL_RUN_DIR"),
                   help="run directory (under ecrl launch: its --out)")
    p.add_argument("--exact", action="store_true", help="ECRL's sampler (else Accelerate's)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--dataset-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="global batch, over all ranks")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--fail-at", type=int, default=None)
    args = p.parse_args()
    if args.out is None:
        p.error("--out is required (unless ecrl launch --out names the run directory)")
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 / (1 + 0.01 * step))
    data = WithSampleIds(Points(args.dataset_size))  # ECRL: the IDs travel with the data
    saves = Path(args.out) / "accelerate"
    found = latest(saves)
    sampler = None
    if args.exact:
        sampler = GlobalBatchSampler(len(data), args.batch, seed=0, steps=args.steps)
        loader = DataLoader(data, batch_sampler=sampler, num_workers=args.workers)
    else:
        loader = DataLoader(data, batch_size=args.batch // accelerator.num_processes,
                            shuffle=True, num_workers=args.workers)
    model, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
    tracker = ECRLTracker(accelerator, args.out, loader, steps=args.steps, sampler=sampler)  # ECRL
    starting_epoch, resume_step = 0, 0
    if found is not None:  # Accelerate's documented resume
        accelerator.load_state(str(found[0]))
        starting_epoch, resume_step = divmod(found[1], len(loader))
    step = starting_epoch * len(loader) + resume_step
    epoch = starting_epoch
    while step < args.steps:
        active = accelerator.skip_first_batches(loader, resume_step) \
            if epoch == starting_epoch and resume_step else loader
        for batch in active:
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            step += 1
            if step % args.ckpt_every == 0 and step < args.steps:
                accelerator.save_state(str(saves / f"step_{step}"))
            if step - 1 == args.fail_at:
                os._exit(137)
            if step == args.steps:
                break
        epoch += 1
    tracker.close()
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), Path(args.out) / "final.pt")
        # The counters Accelerate restores: the LR scheduler's steps (and the loop's own step).
        (Path(args.out) / "accelerate-final.json").write_text(json.dumps(
            {"scheduler_steps": scheduler.scheduler.last_epoch,
             "next_step": tracker.next_step}))
    accelerator.free_memory()  # accelerate's own references to the DDP model and optimizer
    return accelerator


if __name__ == "__main__":
    accelerator = main()
    # The DDP model holds the process group: with gloo, a group torn down while the model (or a
    # peer) still uses it sometimes aborts a rank at exit ("terminate called without an active
    # exception", exit -6). So the model goes first, then both ranks leave together.
    gc.collect()
    accelerator.wait_for_everyone()
    accelerator.end_training()
