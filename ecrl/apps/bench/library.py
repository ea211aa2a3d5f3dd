"""``ecrl bench library``: what the library API costs a training loop, measured side by side.

- the step log and the ID-carrying wrapper on the tiny CNN: one training step with
  ``StepLog.step`` (IDs checked against the sampler and written) and the batch coming through
  ``WithSampleIds``, against the same step without either;
- ``GlobalBatchSampler`` feeding a ``DataLoader`` (``num_workers`` 0 and 2) against torch's
  ``DistributedSampler`` with ``batch_size``, over the same data set, in the same process.

Both sides of a row run alternately in one process, so their ratio holds on a loaded machine;
the absolute figures do not. Single rank (no process group): the library's per-step work does not
depend on the world size.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

from ecrl.apps.bench._common import BenchResult, BenchRow, Progress, Target, command_line

BATCH = 32
DATASET = 16384
"""Samples: one epoch (512 batches) covers every timed batch of either sampler, so neither pays
an epoch restart (DistributedSampler stops at its epoch end; GlobalBatchSampler does not)."""
ROUNDS = 5
"""Alternating rounds per sampler and DataLoader setting."""


def id_wrapper_cost(dataset: Any, *, batch: int, batches: int,
                    collate: Callable[[list[Any]], Any] | None = None,
                    collate_with_ids: Callable[[list[Any]], Any] | None = None) -> float:
    """Seconds :class:`ecrl.WithSampleIds` adds to fetching a batch of ``dataset`` (a map-style
    data set whose items are ready, so that a fetch costs the loader's work and the wrapper's):
    the same batches fetched with and without it, alternating so that both see the same
    machine, the difference of the medians. Which of the two goes first alternates too: the
    second fetch of a pair finds the loader's code in warm caches.

    ``collate``/``collate_with_ids``: the collation of each side where a framework has its own
    (the transformers ``Trainer``: its data collator, and ECRL's ``SampleIdCollator`` around it);
    default: torch's default collation on both."""
    from torch.utils.data import DataLoader

    import ecrl

    size = len(dataset)
    bare = iter(DataLoader(dataset, batch_sampler=ecrl.GlobalBatchSampler(size, batch),
                           collate_fn=collate))
    wrapped = iter(DataLoader(ecrl.WithSampleIds(dataset),
                              batch_sampler=ecrl.GlobalBatchSampler(size, batch),
                              collate_fn=collate_with_ids))
    plain: list[float] = []
    with_ids: list[float] = []
    for i in range(batches):
        for loader, times in ((bare, plain), (wrapped, with_ids))[:: 1 if i % 2 else -1]:
            t0 = time.perf_counter()
            next(loader)
            times.append(time.perf_counter() - t0)
    return max(0.0, statistics.median(with_ids) - statistics.median(plain))


def _loader_rate(loader: Any, batches: int) -> float:
    """Batches per second over ``batches`` batches (after the first, which pays start-up)."""
    it = iter(loader)
    next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    return batches / (time.perf_counter() - t0)


def run(*, quick: bool, progress: Progress) -> BenchResult:
    import torch
    import torch.nn.functional as F
    from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

    import ecrl
    from ecrl.runtime.trainer.datasets import GeneratedDataset
    from ecrl.runtime.trainer.models import build_model

    torch.set_num_threads(1)
    steps = 30 if quick else 300
    data = GeneratedDataset(size=DATASET)

    class Items(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        def __len__(self) -> int:
            return len(data)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            x, y, _ = data[i]
            return x, y

    items = Items()
    model = build_model("tiny-cnn", num_classes=data.num_classes, side=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def train(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    progress(f"tiny CNN, {steps} steps; the step log and the ID wrapper timed alone")
    with tempfile.TemporaryDirectory(prefix="ecrl-bench-library-") as tmp:
        sampler = ecrl.GlobalBatchSampler(DATASET, BATCH, seed=0)
        log = ecrl.StepLog(tmp, sampler=sampler, steps=10**9, log_ids=True)
        wrapped = iter(DataLoader(ecrl.WithSampleIds(items), batch_sampler=sampler))
        # The API's cost is timed where it is paid: StepLog.step on its own, each step, and the
        # wrapper as the difference between fetching the same batches with and without it from
        # a data set whose items are ready (below). Timed inside whole steps instead, as the
        # difference of two 2 ms fetches of generated images, the fetches' own jitter (tens of
        # µs) was the figure.
        logging: list[float] = []
        step_times: list[float] = []
        for step in range(steps):
            t0 = time.perf_counter()
            ids, (x, y) = next(wrapped)
            loss = train(x, y)
            t1 = time.perf_counter()
            log.step(step, sample_ids=ids, loss=loss)
            logging.append(time.perf_counter() - t1)
            step_times.append(t1 - t0)
        log.close()
    ready = [items[i] for i in range(BATCH * 16)]

    class Ready(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
        """The same items, made once: fetching costs the loader's own work and the wrapper's."""

        def __len__(self) -> int:
            return DATASET

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return ready[i % len(ready)]

    wrapper = id_wrapper_cost(Ready(), batch=BATCH, batches=steps * 4)
    logging_s = statistics.median(logging)
    base = statistics.median(step_times) - wrapper  # the steps fetched through the wrapper
    cost = logging_s + wrapper
    rows = [BenchRow(
        candidate="step + WithSampleIds + StepLog.step", alternative="step alone",
        metric="seconds per training step, tiny CNN, B=32, 1 thread (lower is better)",
        candidate_value=base + cost, alternative_value=base,
        note=f"the API adds {cost * 1e6:.0f} µs per step (medians): StepLog.step "
             f"{logging_s * 1e6:.0f} µs, the wrapper {wrapper * 1e6:.0f} µs per batch")]

    batches = 50 if quick else 400
    for workers in (0, 2):
        progress(f"sampler feeding a DataLoader, num_workers={workers}")
        ecrl_loader = DataLoader(items, batch_sampler=ecrl.GlobalBatchSampler(DATASET, BATCH),
                                 num_workers=workers)
        torch_loader = DataLoader(items, batch_size=BATCH, num_workers=workers, drop_last=True,
                                  sampler=DistributedSampler(items, num_replicas=1, rank=0))
        # Rounds alternate between the two; the best round of each (start-up noise aside).
        ours_rates, their_rates = [], []
        for _ in range(ROUNDS):
            ours_rates.append(_loader_rate(ecrl_loader, batches))
            their_rates.append(_loader_rate(torch_loader, batches))
        ours_rate, theirs = max(ours_rates), max(their_rates)
        paired = sorted(o / t for o, t in zip(ours_rates, their_rates, strict=True))
        rows.append(BenchRow(
            candidate="GlobalBatchSampler", alternative="DistributedSampler",
            metric=f"batches/s through DataLoader(num_workers={workers}), B=32 "
                   "(higher is better)",
            candidate_value=ours_rate, alternative_value=theirs,
            note=f"ratio of each round's pair: {paired[0]:.3f} to {paired[-1]:.3f} (median "
                 f"{statistics.median(paired):.3f}): the noise between rounds"))
    # The samplers alone, without a data set behind them: what each costs per batch of indices.
    progress("the samplers alone (indices only)")
    epochs = 4 if quick else 20
    per_epoch = DATASET // BATCH
    alone_ours, alone_theirs = [], []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _batch in itertools.islice(ecrl.GlobalBatchSampler(DATASET, BATCH), epochs * per_epoch):
            pass
        alone_ours.append(epochs * per_epoch / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        theirs_sampler: DistributedSampler[Any] = DistributedSampler(items, num_replicas=1, rank=0)
        for epoch in range(epochs):  # each epoch draws its permutation, as in training
            theirs_sampler.set_epoch(epoch)
            for _batch in BatchSampler(theirs_sampler, BATCH, drop_last=True):
                pass
        alone_theirs.append(epochs * per_epoch / (time.perf_counter() - t0))
    alone = BenchRow(
        candidate="GlobalBatchSampler", alternative="BatchSampler(DistributedSampler)",
        metric="batches of indices/s, the sampler alone, B=32 (higher is better)",
        candidate_value=max(alone_ours), alternative_value=max(alone_theirs),
        note=f"no data set, {epochs} epochs, each epoch's order drawn: the per-batch cost "
             "each adds to a DataLoader")
    overhead = cost / base
    targets = [Target(description="step log + ID wrapper overhead at most 1% of a step",
                      measured=f"{overhead * 100:+.1f}%", met=overhead <= 0.01)]
    loader_rows = rows[1:]
    rows.append(alone)
    for row in loader_rows:
        targets.append(Target(description=f"sampler throughput ≥ DistributedSampler's "
                                          f"({row.metric.split('(')[1].split(')')[0]})",
                              measured=f"ratio {row.ratio:.2f}",
                              met=(row.ratio or 0.0) >= 1.0))
    return BenchResult(name="library", command=command_line(), rows=rows, targets=targets,
                       notes=["single rank; both sides alternate in one process"])
