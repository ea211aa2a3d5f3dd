"""A plain transformers ``Trainer`` script: the base the adoption counts of docs/frameworks.md are
measured on (transformers_audit.py and transformers_exact.py are this script adopting ECRL).
Resumes as the Trainer's docs show: ``train(resume_from_checkpoint=True)``, the newest
``checkpoint-N`` of the output folder."""

import sys
from pathlib import Path

import torch
from torch import nn
from transformers import Trainer, TrainingArguments


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
    resume = any(Path(args.output_dir).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)


if __name__ == "__main__":
    main(sys.argv[1])
