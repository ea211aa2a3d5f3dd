"""accelerate_plain.py adopting ECRL's exact mode: ECRL's sampler, its position in Accelerate's
own checkpoints, so the loop resumes at ``tracker.next_step`` (no ``skip_first_batches``);
``ecrl-verify OUT`` checks every window (docs/frameworks.md)."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ecrl
from ecrl.integrations.accelerate import ECRLTracker


def main(out: str, steps: int = 24) -> None:
    accelerator = Accelerator(cpu=True)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = ecrl.WithSampleIds(TensorDataset(x, (x.sum(dim=1) > 0).long()))
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sampler = ecrl.GlobalBatchSampler(len(data), 8, seed=0, steps=steps)
    model, optimizer = accelerator.prepare(model, optimizer)
    tracker = ECRLTracker(accelerator, out, steps=steps, sampler=sampler)
    loader = tracker.prepare(DataLoader(data, batch_sampler=sampler))
    saved = sorted(Path(out).glob("step_*"), key=lambda p: int(p.name[5:]))
    if saved:
        accelerator.load_state(str(saved[-1]))
    step = tracker.next_step
    while step < steps:
        epoch, skip = divmod(step, len(loader))
        accelerator.print(f"epoch {epoch}, from batch {skip}")
        for batch in loader:  # ECRL's sampler starts at the resumed step's window
            _ids, (x, y) = batch
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            tracker.step(step, batch, loss=loss)
            step += 1
            if step % 3 == 0:
                accelerator.save_state(f"{out}/step_{step}")
            if step == steps:
                break
    tracker.close()


if __name__ == "__main__":
    main(sys.argv[1])
