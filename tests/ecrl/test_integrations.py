"""The framework integrations' one-line refusals, in one process (the runs with real launchers
are in tests/integration/test_lightning.py and test_accelerate.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import ecrl  # noqa: E402
from ecrl.contract.errors import ConfigError  # noqa: E402
from ecrl.integrations.lightning import ECRLCallback  # noqa: E402


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        _ids, (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback: ECRLCallback, loader: DataLoader, **trainer: object) -> None:
    pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False,
               enable_progress_bar=False, enable_model_summary=False,
               enable_checkpointing=False, callbacks=[callback], **trainer
               ).fit(_Tiny(), loader)


def test_a_sampler_that_is_not_ecrls_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"takes an ecrl\.GlobalBatchSampler"):
        ECRLCallback("unused", sampler=torch.utils.data.SequentialSampler(range(4)))  # type: ignore[arg-type]


def test_gradient_accumulation_is_refused(tmp_path: Path) -> None:
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2 is not supported"):
        _fit(ECRLCallback(tmp_path / "run"), DataLoader(data, batch_size=4),
             accumulate_grad_batches=2)


def test_a_loader_not_built_on_the_callbacks_sampler_is_refused(tmp_path: Path) -> None:
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    sampler = ecrl.GlobalBatchSampler(16, 4, steps=4)
    with pytest.raises(ConfigError, match="batch_sampler is not that sampler"):
        _fit(ECRLCallback(tmp_path / "run", sampler=sampler), DataLoader(data, batch_size=4))
