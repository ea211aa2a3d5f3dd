"""A transformers ``Trainer`` script with ECRL's step log (docs/library.md, "transformers Trainer").

Audit mode: the Trainer keeps its sampler, its checkpoints (``checkpoint-N`` every
``--ckpt-every`` steps) and its resume (``train(resume_from_checkpoint=True)``, the newest
checkpoint); ECRL proves what they did.

    torchrun --nproc-per-node 2 docs/examples/transformers_train.py --out runs/hf --fail-at 6
    torchrun --nproc-per-node 2 docs/examples/transformers_train.py --out runs/hf
    ecrl-verify runs/hf

Exact mode (``--exact``): ECRL's windows are the Trainer's train sampler, so the Trainer's own
resume continues at the next step's window (also with ``--nproc-per-node 1`` after a run on 2:
the per-device batch is the global batch over the world size). 2 CPU processes over gloo.
Under ``ecrl launch`` (the run directory is the launch's ``--out``; failures come from its
``--fail-at``, injected by the callback):

    ecrl launch --out runs/hfx --world-sizes 2,2,1 --fail-at 6,8 -- \\
        python docs/examples/transformers_train.py --exact
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from ecrl.integrations.transformers import ECRLCallback, GlobalBatchSampler


class Points(Dataset):
    """Generated data: 8 features per sample, label = sign of their sum."""

    def __init__(self, size: int) -> None:
        self.x = torch.randn(size, 8, generator=torch.Generator().manual_seed(1234))
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Classifier(nn.Module):
    """A tiny model the Trainer can drive: keyword inputs, a dict with the loss."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, labels: torch.Tensor | None = None) -> dict:
        logits = self.net(x)
        loss = None if labels is None else nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


class FailAfter(TrainerCallback):
    """Every rank exits like a killed process after global step ``step`` (0-based) and the
    checkpoint the Trainer saves at its end, if any (a test's crash)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        if state.global_step == self.step + 1:
            os._exit(137)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("ECRL_RUN_DIR"),
                   help="run directory (under ecrl launch: its --out)")
    p.add_argument("--exact", action="store_true", help="ECRL's sampler (else the Trainer's)")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--dataset-size", type=int, default=32)
    p.add_argument("--batch", type=int, default=8, help="global batch, over all ranks")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=2)
    p.add_argument("--fail-at", type=int, default=None)
    args = p.parse_args()
    if args.out is None:
        p.error("--out is required (outside ecrl launch)")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    torch.manual_seed(0)
    training = TrainingArguments(
        output_dir=str(Path(args.out) / "trainer"), per_device_train_batch_size=args.batch // world,
        max_steps=args.steps, learning_rate=0.1, save_strategy="steps", save_steps=args.ckpt_every,
        logging_strategy="no", report_to="none", disable_tqdm=True, use_cpu=True,
        ddp_backend="gloo", dataloader_num_workers=args.workers, seed=0)
    trainer = Trainer(model=Classifier(), args=training, train_dataset=Points(args.dataset_size))
    if args.exact:
        sampler = GlobalBatchSampler(args.dataset_size, args.batch, seed=0, steps=args.steps)
        ECRLCallback(args.out, sampler=sampler).attach(trainer)  # ECRL: its windows
    else:
        ECRLCallback(args.out).attach(trainer)  # ECRL: the step log from the Trainer's hooks
    if args.fail_at is not None:
        trainer.add_callback(FailAfter(args.fail_at))
    resume = any((Path(training.output_dir)).glob("checkpoint-*"))
    trainer.train(resume_from_checkpoint=True if resume else None)
    if trainer.is_world_process_zero():
        torch.save(trainer.model.state_dict(), Path(args.out) / "final.pt")
        (Path(args.out) / "trainer-final.json").write_text(json.dumps(
            {"global_step": trainer.state.global_step, "epoch": trainer.state.epoch}))
    trainer.accelerator.free_memory()  # Accelerate's references to the DDP model


if __name__ == "__main__":
    main()
    # The DDP model holds the process group: with gloo, a group torn down while the model (or a
    # peer) still uses it sometimes aborts a rank at exit ("terminate called without an active
    # exception", exit -6). So the model goes first (with main's frame), then both ranks leave
    # together.
    gc.collect()
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
