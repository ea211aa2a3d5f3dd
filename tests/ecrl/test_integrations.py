"""The framework integrations in one process: what the script's step gets, what the step log
holds, the one-line refusals (the runs with real launchers, kills and resumes are in
tests/integration/test_lightning.py and test_accelerate.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

pl = pytest.importorskip("lightning.pytorch")

import torch  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset, default_collate  # noqa: E402

import ecrl  # noqa: E402
from ecrl.contract.errors import ConfigError  # noqa: E402
from ecrl.integrations.lightning import ECRLCallback  # noqa: E402


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(2, 1)
        self.batches: list = []
        self.validated: list = []

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        self.batches.append(batch)
        x = batch[1][0] if isinstance(batch, tuple) else batch[0]
        return self.net(x).pow(2).mean()

    def validation_step(self, batch: tuple, batch_idx: int) -> None:
        self.validated.append(batch)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit(callback: ECRLCallback, loader: DataLoader,
         val_dataloaders: DataLoader | None = None, **trainer: object) -> _Tiny:
    module = _Tiny()
    pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False,
               enable_progress_bar=False, enable_model_summary=False,
               enable_checkpointing=False, callbacks=[callback], num_sanity_val_steps=0,
               limit_val_batches=1, **trainer
               ).fit(module, loader, val_dataloaders)
    return module


@pytest.mark.parametrize("keep_ids", [False, True])
def test_training_step_gets_the_batch_without_its_ids_unless_asked(tmp_path: Path,
                                                                   keep_ids: bool) -> None:
    x = torch.randn(16, 2)
    data = ecrl.WithSampleIds(TensorDataset(x))
    module = _fit(ECRLCallback(tmp_path / "run", keep_ids=keep_ids),
                  DataLoader(data, batch_size=4), val_dataloaders=DataLoader(data, batch_size=8))
    assert len(module.batches) == 4
    for n, batch in enumerate(module.batches):
        if keep_ids:
            ids, (xs,) = batch
            assert ids.tolist() == list(range(4 * n, 4 * n + 4))
        else:
            assert isinstance(batch, list) and len(batch) == 1  # as the bare data set's batch
            (xs,) = batch
        assert torch.equal(xs, x[4 * n:4 * n + 4])
    # A validation loader over a wrapped data set feeds validation_step as the bare one would.
    assert module.validated and all(
        isinstance(b, tuple) if keep_ids else isinstance(b, list) for b in module.validated)
    # The callback's wrappers are gone after fit: the module is as the script made it.
    assert "training_step" not in vars(module) and "validation_step" not in vars(module)
    # and the step log holds the IDs the callback took off.
    log = tmp_path / "run" / "logs" / "attempt-000" / "rank-000.jsonl"
    steps = [json.loads(line) for line in log.read_text().splitlines()]
    assert [s["sample_ids"] for s in steps if "sample_ids" in s] == [
        list(range(4 * n, 4 * n + 4)) for n in range(4)]


def test_the_module_stays_picklable_while_its_training_step_is_wrapped(tmp_path: Path) -> None:
    module, callback = _Tiny(), ECRLCallback(tmp_path / "run")
    callback.setup(None, module, "fit")  # type: ignore[arg-type]
    copy = pickle.loads(pickle.dumps(module))
    batch = default_collate([ecrl.WithSampleIds(TensorDataset(torch.ones(1, 2)))[0]])
    copy.training_step(batch, 0)  # the copy's step takes the IDs off too
    assert isinstance(copy.batches[0], list) and torch.equal(copy.batches[0][0], torch.ones(1, 2))
    callback.teardown(None, module, "fit")  # type: ignore[arg-type]
    assert "training_step" not in vars(module)


def test_only_a_batch_that_carries_its_ids_gives_sample_ids() -> None:
    from ecrl.runtime.integrations._hooks import batch_ids

    data = ecrl.WithSampleIds(TensorDataset(torch.arange(8).view(4, 2), torch.zeros(4)))
    assert batch_ids(default_collate([data[2], data[0]])).tolist() == [2, 0]
    assert batch_ids({"sample_ids": [5], "x": 0}) == [5]
    # A plain batch of two (token IDs and labels) is not (ids, batch): refused, not logged.
    tokens = default_collate([data.dataset[2], data.dataset[0]])
    with pytest.raises(ConfigError, match=r"wrap the training data set in ecrl\.WithSampleIds"):
        batch_ids(tokens)


def test_a_sampler_that_is_not_ecrls_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"takes an ecrl\.GlobalBatchSampler"):
        ECRLCallback("unused", sampler=torch.utils.data.SequentialSampler(range(4)))  # type: ignore[arg-type]


def test_gradient_accumulation_is_refused(tmp_path: Path) -> None:
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    with pytest.raises(ConfigError, match="accumulate_grad_batches=2 is not supported"):
        _fit(ECRLCallback(tmp_path / "run"), DataLoader(data, batch_size=4),
             accumulate_grad_batches=2)


class _LogCheckedAtBackward(_Tiny):
    """Reads the step log when Lightning runs the step's backward (before any all-reduce)."""

    def __init__(self, log: Path) -> None:
        super().__init__()
        self.log = log
        self.logged_at_backward: list[list[int]] = []

    def backward(self, loss: torch.Tensor, *args: object, **kwargs: object) -> None:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.logged_at_backward.append([json.loads(line)["global_step"] for line in lines])
        super().backward(loss, *args, **kwargs)


@pytest.mark.parametrize("exact", [False, True])
def test_each_step_is_logged_before_its_backward(tmp_path: Path, exact: bool) -> None:
    """The step-record contract: a rank's record of step c is on disk before its gradients can
    enter step c's all-reduce (a rank killed after it must not leave a checkpointed step
    unlogged)."""
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    sampler = ecrl.GlobalBatchSampler(16, 4, steps=4) if exact else None
    loader = DataLoader(data, batch_sampler=sampler) if exact else DataLoader(data, batch_size=4)
    module = _LogCheckedAtBackward(tmp_path / "run" / "logs" / "attempt-000" / "rank-000.jsonl")
    pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False,
               enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
               callbacks=[ECRLCallback(tmp_path / "run", sampler=sampler)]).fit(module, loader)
    assert module.logged_at_backward == [list(range(step + 1)) for step in range(4)]


class _StepsEveryOtherBatch(_Tiny):
    """Manual optimization that accumulates two batches per update: the global step (the
    optimizer's steps) does not advance after every backward."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch: tuple, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.manual_backward(loss)
        if batch_idx % 2:
            optimizer = self.optimizers()
            optimizer.step()  # type: ignore[union-attr]
            optimizer.zero_grad()  # type: ignore[union-attr]
        return loss


def test_a_backward_without_an_optimizer_step_is_refused(tmp_path: Path) -> None:
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    with pytest.raises(ConfigError, match="no optimizer step followed"):
        pl.Trainer(accelerator="cpu", devices=1, max_steps=4, logger=False,
                   enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, callbacks=[ECRLCallback(tmp_path / "run")]
                   ).fit(_StepsEveryOtherBatch(), DataLoader(data, batch_size=4))


def test_a_loader_not_built_on_the_callbacks_sampler_is_refused(tmp_path: Path) -> None:
    data = ecrl.WithSampleIds(TensorDataset(torch.randn(16, 2)))
    sampler = ecrl.GlobalBatchSampler(16, 4, steps=4)
    with pytest.raises(ConfigError, match="batch_sampler is not that sampler"):
        _fit(ECRLCallback(tmp_path / "run", sampler=sampler), DataLoader(data, batch_size=4))


# --- HF Accelerate ------------------------------------------------------------------------------

accelerate = pytest.importorskip("accelerate")
from ecrl.integrations.accelerate import (  # noqa: E402
    ECRLTracker,
    GlobalBatchSampler,
    WithSampleIds,
)


def _accelerate_loop(run: Path, *, exact: bool, skip: int = 0, steps: int = 4,
                     restored: int | None = None) -> list:
    """A one-process Accelerate loop over 16 points (batch 4) with the tracker; what the loop
    got, batch by batch."""
    accelerator = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    data = WithSampleIds(TensorDataset(torch.arange(32.0).view(16, 2)))
    sampler = GlobalBatchSampler(16, 4, steps=steps) if exact else None
    loader = DataLoader(data, batch_sampler=sampler) if exact else DataLoader(data, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    tracker = ECRLTracker(accelerator, run, loader, steps=steps, sampler=sampler)
    if restored is not None:  # what load_state hands the tracker
        tracker.load_state_dict({"last_step": restored - 1, **(
            {"sampler": {**sampler.state_dict(), **_position(sampler, restored)}}
            if sampler is not None else {})})
    got = []
    for (x,) in accelerator.skip_first_batches(loader, skip) if skip else loader:
        got.append(x)
        accelerator.backward(model(x).pow(2).mean())
        optimizer.step()
        optimizer.zero_grad()
    tracker.close()
    return got


def _position(sampler: GlobalBatchSampler, step: int) -> dict:
    probe = GlobalBatchSampler(16, 4, steps=sampler.steps)
    for _ in zip(range(step), probe, strict=False):
        pass
    return probe.state_dict()


def _step_ids(run: Path, attempt: int = 0) -> dict[int, list[int]]:
    log = run / "logs" / f"attempt-{attempt:03d}" / "rank-000.jsonl"
    return {r["global_step"]: r["sample_ids"] for r in map(json.loads, log.read_text().splitlines())
            if "sample_ids" in r}


def test_accelerate_loop_gets_batches_without_ids_and_each_backward_is_a_step(
        tmp_path: Path) -> None:
    got = _accelerate_loop(tmp_path / "run", exact=False)
    points = torch.arange(32.0).view(16, 2)
    assert [x.tolist() for x in got] == [points[4 * n:4 * n + 4].tolist() for n in range(4)]
    assert _step_ids(tmp_path / "run") == {n: list(range(4 * n, 4 * n + 4)) for n in range(4)}


def test_accelerate_skip_first_batches_is_tracked_and_skips_nothing_in_exact_mode(
        tmp_path: Path) -> None:
    # Audit: Accelerate's skip of the tracked loader is tracked too (the IDs of the batches the
    # loop really got). Exact: ECRL's sampler restored at step 2 starts there already, and the
    # documented resume's skip of 2 batches skips nothing.
    _accelerate_loop(tmp_path / "audit", exact=False, skip=2, restored=2)
    assert _step_ids(tmp_path / "audit") == {2: [8, 9, 10, 11], 3: [12, 13, 14, 15]}
    whole = tmp_path / "whole"
    _accelerate_loop(whole, exact=True)
    _accelerate_loop(tmp_path / "exact", exact=True, skip=2, restored=2)
    assert _step_ids(tmp_path / "exact") == {s: ids for s, ids in _step_ids(whole).items()
                                            if s >= 2}


def test_accelerate_tracker_refuses_an_unprepared_loader(tmp_path: Path) -> None:
    accelerator = accelerate.Accelerator(cpu=True)
    sampler = GlobalBatchSampler(16, 4, steps=4)
    loader = DataLoader(WithSampleIds(TensorDataset(torch.randn(16, 2))), batch_sampler=sampler)
    with pytest.raises(ConfigError, match=r"as accelerator\.prepare returned it"):
        ECRLTracker(accelerator, tmp_path / "run", loader, steps=4, sampler=sampler)
