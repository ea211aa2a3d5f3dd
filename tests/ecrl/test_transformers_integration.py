"""``ecrl.integrations.transformers`` in one process: what it hands the Trainer, and what it
refuses (the runs under torchrun are in tests/integration/test_transformers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers")

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

import ecrl
from ecrl.contract.errors import ConfigError
from ecrl.integrations.transformers import ECRLCallback, SampleIdCollator
from ecrl.runtime.integrations.transformers import IDS_KEY, _WindowStream


class _Points(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": torch.full((8,), float(i)), "labels": torch.tensor(i % 2)}


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


def _trainer(tmp_path: Path, **args: object) -> Trainer:
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                 report_to="none", disable_tqdm=True, save_strategy="no",
                                 logging_strategy="no", **args)  # type: ignore[arg-type]
    return Trainer(model=_Model(), args=training, train_dataset=_Points())


@pytest.mark.parametrize("world", [1, 2, 4])
def test_the_window_stream_dealt_out_in_turn_is_each_ranks_shard(world: int) -> None:
    # The Trainer batches the stream by the per-device batch, and Accelerate gives batch k to
    # rank k % W: that must be ECRL's shard of rank r at every step of the epoch.
    sampler = ecrl.GlobalBatchSampler(32, 8, seed=3, rank=0, world_size=world)
    stream = _WindowStream(sampler)
    stream.set_epoch(2)
    ids = list(stream)
    assert len(ids) == len(stream) == 32
    local = 8 // world
    batches = [ids[k * local:(k + 1) * local] for k in range(len(ids) // local)]
    for k, batch in enumerate(batches):
        step, rank = 2 * 4 + k // world, k % world
        shard = ecrl.GlobalBatchSampler(32, 8, seed=3, rank=rank, world_size=world)
        assert batch == shard.shard_of(step).tolist()


def test_the_collator_carries_the_ids_and_leaves_other_batches_alone() -> None:
    collate = SampleIdCollator()
    data = ecrl.WithSampleIds(_Points())
    batch = collate([data[5], data[2]])
    assert batch[IDS_KEY].tolist() == [5, 2]
    assert batch["x"].shape == (2, 8)
    plain = collate([_Points()[1]])  # an evaluation set without IDs
    assert IDS_KEY not in plain


def test_exact_mode_refuses_gradient_accumulation(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                       max_steps=2)
    sampler = ecrl.GlobalBatchSampler(32, 8, steps=2)
    ECRLCallback(tmp_path / "run", sampler=sampler).attach(trainer)
    with pytest.raises(ConfigError, match="gradient_accumulation_steps=2 is not supported"):
        trainer.train()


def test_exact_mode_refuses_a_per_device_batch_that_is_not_the_global_one(
        tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, per_device_train_batch_size=4, max_steps=2)
    ECRLCallback(tmp_path / "run", sampler=ecrl.GlobalBatchSampler(32, 8, steps=2)).attach(
        trainer)
    with pytest.raises(ConfigError, match="give per_device_train_batch_size=8"):
        trainer.train()


def test_a_callback_without_attach_refuses_batches_without_ids(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, per_device_train_batch_size=8, max_steps=2)
    trainer.add_callback(ECRLCallback(tmp_path / "run"))
    with pytest.raises(ConfigError, match="without its sample IDs"):
        trainer.train()


def test_audit_mode_logs_every_step_with_the_ids_of_its_micro_batches(tmp_path: Path) -> None:
    # Gradient accumulation: one record per optimizer step, with the IDs of both micro-batches.
    trainer = _trainer(tmp_path, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                       max_steps=8)
    ECRLCallback(tmp_path / "run").attach(trainer)
    trainer.train()
    from verifier import render_text, verify_run

    result = verify_run(tmp_path / "run")
    assert result.verdict == "PASS", render_text(result)
    assert result.checked["committed_steps"] == 8


class _SeesTheLogAtBackward(_Model):
    """Reads the step log when the backward pass reaches the loss (before any all-reduce)."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.log = log
        self.logged_at_backward: list[list[int]] = []

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        out = super().forward(x, labels)
        if self.training:
            out["loss"].register_hook(self._look)
        return out

    def _look(self, grad: torch.Tensor) -> None:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.logged_at_backward.append([__import__("json").loads(line)["global_step"]
                                        for line in lines])


@pytest.mark.parametrize("exact", [False, True])
def test_each_step_is_logged_before_its_backward(tmp_path: Path, exact: bool) -> None:
    """The step-record contract: a rank's record of step c is on disk before its gradients can
    enter step c's all-reduce (without gradient accumulation)."""
    model = _SeesTheLogAtBackward(tmp_path / "run" / "logs" / "attempt-000" / "rank-000.jsonl")
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                 report_to="none", disable_tqdm=True, save_strategy="no",
                                 logging_strategy="no", per_device_train_batch_size=8,
                                 max_steps=4)
    trainer = Trainer(model=model, args=training, train_dataset=_Points())
    sampler = ecrl.GlobalBatchSampler(32, 8, steps=4) if exact else None
    ECRLCallback(tmp_path / "run", sampler=sampler).attach(trainer)
    trainer.train()
    assert model.logged_at_backward == [list(range(step + 1)) for step in range(4)]


class _TwoForwards(Trainer):
    """A compute_loss that runs the model twice on its batch (R-Drop, consistency losses)."""

    def compute_loss(self, model: nn.Module, inputs: dict, *args: object, **kwargs: object
                     ) -> torch.Tensor:
        return model(**inputs)["loss"] + model(**inputs)["loss"]


def test_a_batch_run_through_the_model_twice_is_consumed_once(tmp_path: Path) -> None:
    training = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True,
                                 report_to="none", disable_tqdm=True, save_strategy="no",
                                 logging_strategy="no", per_device_train_batch_size=8,
                                 max_steps=8)
    trainer = _TwoForwards(model=_Model(), args=training, train_dataset=_Points())
    ECRLCallback(tmp_path / "run").attach(trainer)
    trainer.train()
    from verifier import render_text, verify_run

    result = verify_run(tmp_path / "run")
    assert result.verdict == "PASS", render_text(result)
