"""accelerate_plain.py adopting ECRL's audit mode: Accelerate keeps its sampler, its
checkpoints and the documented resume; ``ecrl-verify OUT`` proves what they did
(docs/frameworks.md). The tracker hooks the loader and ``accelerator.backward``: the loop is
unchanged."""

import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ecrl.integrations.accelerate import ECRLTracker, WithSampleIds


def main(out: str, steps: int = 24) -> None:
    accelerator = Accelerator(cpu=True)
    x = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))
    data = WithSampleIds(TensorDataset(x, (x.sum(dim=1) > 0).long()))
    model = nn.Linear(8, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    ECRLTracker(accelerator, out, loader, steps=steps)
    saved = sorted(Path(out).glob("step_*"), key=lambda p: int(p.name[5:]))
    step = 0
    if saved:
        accelerator.load_state(str(saved[-1]))
        step = int(saved[-1].name[5:])
    while step < steps:
        epoch, skip = divmod(step, len(loader))
        accelerator.print(f"epoch {epoch}, from batch {skip}")
        batches = accelerator.skip_first_batches(loader, skip) if skip else loader
        for i, batch in enumerate(batches, start=skip):  # noqa: B007 (i: the batch's index)
            x, y = batch
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step % 3 == 0:
                accelerator.save_state(f"{out}/step_{step}")
            if step == steps:
                break


if __name__ == "__main__":
    main(sys.argv[1])
