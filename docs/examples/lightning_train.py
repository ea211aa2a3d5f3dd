"""A PyTorch Lightning script with ECRL's step log (docs/library.md, "PyTorch Lightning").

Audit mode: Lightning keeps its sampler, its checkpoints and its resume; ECRL proves what they did.

    python docs/examples/lightning_train.py --out runs/pl --fail-at 12   # killed after step 12
    python docs/examples/lightning_train.py --out runs/pl                # Lightning resumes "last"
    ecrl-verify runs/pl

Exact mode (``--exact``): ECRL's sampler, whose position rides in Lightning's checkpoints, so the
resume continues at the next step's window (also with ``--devices 1`` after a run on 2).
Lightning's own launcher starts the ranks (2 CPU processes, gloo).

Under ``ecrl launch`` (its torchrun starts the processes; Lightning's device count is taken from
the environment torchrun sets, and the run directory from ``ecrl launch --out``):

    ecrl launch --out runs/pl --world-sizes 2,1 --fail-at 5,9 -- \
        python docs/examples/lightning_train.py --exact
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, Dataset

from ecrl.integrations.lightning import ECRLCallback, GlobalBatchSampler, WithSampleIds


class Points(Dataset):
    """Generated data: 8 features per sample, label = sign of their sum."""

    def __init__(self, size: int) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch  # as without ECRL: the callback takes the sample IDs off the batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class FailAfter(pl.Callback):
    """Every rank exits like a killed process after global step ``step`` (a test's crash)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        if trainer.global_step - 1 == self.step:
            os._exit(137)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("ECRL_RUN_DIR"),
                   help="run directory (under ecrl launch: its --out)")
    p.add_argument("--exact", action="store_true", help="ECRL's sampler (else Lightning's)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--dataset-size", type=int, default=64)
    p.add_argument("--batch", type=int, default=8, help="global batch, over all ranks")
    p.add_argument("--devices", type=int, default=2, help="processes (without torchrun)")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=3)
    p.add_argument("--fail-at", type=int, default=None)
    args = p.parse_args()
    if args.out is None:
        p.error("--out is required (unless ecrl launch --out names the run directory)")
    # Under torchrun (ecrl launch) the processes exist already: Lightning must be told how many.
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", args.devices))
    nodes = int(os.environ.get("WORLD_SIZE", devices)) // devices
    torch.manual_seed(0)
    data = WithSampleIds(Points(args.dataset_size))  # ECRL: the IDs travel with the data
    if args.exact:
        sampler = GlobalBatchSampler(len(data), args.batch, seed=0, steps=args.steps)
        loader = DataLoader(data, batch_sampler=sampler, num_workers=args.workers)
        ecrl_callback = ECRLCallback(args.out, sampler=sampler)
    else:
        loader = DataLoader(data, batch_size=args.batch // (devices * nodes), shuffle=True,
                            num_workers=args.workers)
        ecrl_callback = ECRLCallback(args.out)  # ECRL: the step log from Lightning's hooks
    checkpoints = ModelCheckpoint(dirpath=Path(args.out) / "lightning", save_top_k=-1,
                                  every_n_train_steps=args.ckpt_every, save_last=True)
    callbacks: list[pl.Callback] = [ecrl_callback, checkpoints]
    if args.fail_at is not None:
        callbacks.append(FailAfter(args.fail_at))
    trainer = pl.Trainer(accelerator="cpu", devices=devices, num_nodes=nodes, strategy="ddp",
                         max_steps=args.steps, max_epochs=-1, callbacks=callbacks, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         deterministic=True)
    model = Classifier()
    trainer.fit(model, loader, ckpt_path="last")
    if trainer.global_rank == 0:
        torch.save(model.state_dict(), Path(args.out) / "final.pt")
        (Path(args.out) / "lightning-final.json").write_text(json.dumps(
            {"global_step": trainer.global_step, "current_epoch": trainer.current_epoch}))


if __name__ == "__main__":
    main()
