"""lightning_plain.py adopting ECRL's audit mode: Lightning keeps its sampler, its checkpoints and
its resume; ``ecrl-verify OUT`` proves what they did (docs/frameworks.md)."""

import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ecrl.integrations.lightning import ECRLCallback, WithSampleIds


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
    loader = DataLoader(data, batch_size=4, shuffle=True)
    checkpoints = ModelCheckpoint(dirpath=f"{out}/lightning", every_n_train_steps=3,
                                  save_last=True)
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=steps,
                         callbacks=[ECRLCallback(out), checkpoints], logger=False)
    trainer.fit(Classifier(), loader, ckpt_path="last")


if __name__ == "__main__":
    main(sys.argv[1])
