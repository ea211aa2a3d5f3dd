"""lightning_plain.py adopting ECRL's exact mode: ECRL's sampler, its position in Lightning's own
checkpoints; ``ecrl-verify OUT`` checks every window (docs/frameworks.md)."""

import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ecrl.integrations.lightning import ECRLCallback, GlobalBatchSampler, WithSampleIds


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main(out: str, steps: int = 24) -> None:
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = TensorDataset(x, (x.sum(dim=1) > 0).long())
    data = WithSampleIds(data)
    sampler = GlobalBatchSampler(len(data), 8, seed=0, steps=steps)
    loader = DataLoader(data, batch_sampler=sampler)
    checkpoints = ModelCheckpoint(dirpath=f"{out}/lightning", every_n_train_steps=3,
                                  save_last=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps,
                         callbacks=[ECRLCallback(out, sampler=sampler), checkpoints], logger=False)
    trainer.fit(Classifier(), loader, ckpt_path="last")


if __name__ == "__main__":
    main(sys.argv[1])
