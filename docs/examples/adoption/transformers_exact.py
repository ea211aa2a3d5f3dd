"""transformers_plain.py adopting ECRL's exact mode: ECRL's windows are the Trainer's train
sampler, so its own resume continues at the next step's window; ``ecrl-verify OUT`` checks every
window (docs/frameworks.md)."""

import sys
from pathlib import Path

import torch
from torch import nn
from transformers import Trainer, TrainingArguments

from ecrl.integrations.transformers import ECRLCallback, GlobalBatchSampler


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


def main(out: str, steps: int = 24) -> None:
    torch.manual_seed(0)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = [{"x": xi, "labels": int(xi.sum() > 0)} for xi in x]
    args = TrainingArguments(output_dir=f"{out}/trainer", per_device_train_batch_size=4,
                             max_steps=steps, learning_rate=0.1, save_steps=3, use_cpu=True,
                             ddp_backend="gloo", report_to="none", logging_strategy="no")
    trainer = Trainer(model=Classifier(), args=args, train_dataset=data)
    sampler = GlobalBatchSampler(len(data), 8, seed=0, steps=steps)
    ECRLCallback(out, sampler=sampler).attach(trainer)
    resume = any(Path(args.output_dir).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)


if __name__ == "__main__":
    main(sys.argv[1])
