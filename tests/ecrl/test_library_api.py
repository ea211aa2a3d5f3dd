"""The public library API in one process (world size 1, no torchrun): what it computes and how it
refuses bad use. Real files, real checkpoints; the multi-process runs are in
tests/integration/test_launch*.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

import ecrl
from ecrl.contract import semantics
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.contract.runformat import STRATEGIES, RunManifest, read_json_record
from ecrl.runtime import _attempt
from ecrl.runtime.checkpoint import registry
from ecrl.runtime.checkpoint.strategies import CheckpointContext, make_strategy


@pytest.fixture(autouse=True)
def _fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each test is a new "launch": no supervisor environment, no attempt remembered.
    for key in [k for k in __import__("os").environ if k.startswith("ECRL_")]:
        monkeypatch.delenv(key)
    _attempt._CACHE.clear()


class Squares(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((4,), float(i)), torch.tensor(i % 2)


def test_public_names_are_lazy_and_resolve() -> None:
    for name in ("GlobalBatchSampler", "WithSampleIds", "StepLog", "Checkpointer"):
        assert name in ecrl.__all__
        assert getattr(ecrl, name).__name__ == name
    with pytest.raises(AttributeError):
        _ = ecrl.NoSuchThing  # type: ignore[attr-defined]


def test_sampler_yields_this_ranks_shard_and_reshards_at_another_world_size() -> None:
    d, b, seed = 103, 12, 5
    geometry = semantics.Geometry(dataset_size=d, global_batch=b)
    two = [ecrl.GlobalBatchSampler(d, b, seed=seed, rank=r, world_size=2) for r in range(2)]
    streams = [iter(s) for s in two]
    for step in range(11):  # crosses the epoch boundary (S = 8)
        for r, stream in enumerate(streams):
            assert next(stream) == semantics.shard(geometry, seed, step, r, 2).tolist()
        for s in two:
            s.step_done(step)
    state = two[0].state_dict()
    four = [ecrl.GlobalBatchSampler(d, b, seed=seed, rank=r, world_size=4) for r in range(4)]
    for s in four:
        s.load_state_dict(state)
    union = [i for s in four for i in next(iter(s))]
    assert union == semantics.window(geometry, seed, 11).tolist()


def test_the_sampler_remembers_a_bounded_window_of_the_newest_issued_shards() -> None:
    # 2**20 remembered IDs at 2**13 per shard: the newest 128 shards, whatever the loop reads.
    d, b = 1 << 16, 1 << 13
    sampler = ecrl.GlobalBatchSampler(d, b, seed=3, rank=0, world_size=1, steps=1000)
    geometry = semantics.Geometry(dataset_size=d, global_batch=b)
    issued = list(sampler)
    assert len(issued) == 1000
    remembered = [s for s in range(1000) if sampler.take_issued(s) is not None]
    assert remembered == list(range(1000 - 128, 1000))
    sampler = ecrl.GlobalBatchSampler(d, b, seed=3, rank=0, world_size=1, steps=1000)
    for step, ids in enumerate(sampler):
        taken = sampler.take_issued(step)
        assert taken is not None and taken[0] == ids
        assert taken[1] == semantics.ids_hash(semantics.shard(geometry, 3, step, 0, 1))


def test_global_batch_not_divisible_by_world_size_is_one_clear_error() -> None:
    with pytest.raises(SemanticsError, match="global batch 8 is not divisible by world size 3"):
        ecrl.GlobalBatchSampler(100, 8, world_size=3, rank=0)


def test_state_of_another_dataset_or_seed_is_refused() -> None:
    saved = ecrl.GlobalBatchSampler(100, 8, seed=1).state_dict()
    for other in (ecrl.GlobalBatchSampler(100, 8, seed=2), ecrl.GlobalBatchSampler(120, 8, seed=1),
                  ecrl.GlobalBatchSampler(100, 4, seed=1)):
        with pytest.raises(SemanticsError, match="resume with the run's own data set"):
            other.load_state_dict(saved)


def test_sampler_iterated_before_its_pending_state_is_an_error(tmp_path: Path) -> None:
    _train(tmp_path, steps=6, every=2, stop_after=3)  # leaves a checkpoint at step 3
    _attempt._CACHE.clear()
    model, opt = _model()
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=6)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler},
                             run_dir=tmp_path, every=2)
    with pytest.raises(SemanticsError, match="iterated before its saved state was loaded"):
        next(iter(DataLoader(ecrl.WithSampleIds(Squares(64)), batch_sampler=sampler)))
    assert ckpt.restore() == 4
    assert sampler.next_step == 4


def test_the_length_does_not_shrink_while_loader_workers_prefetch() -> None:
    """Lightning reads len() after creating the iterator to know when the epoch ends: with two
    workers prefetching it used to end 4 batches early (issue 25, item 2)."""
    sampler = ecrl.GlobalBatchSampler(192, 8, seed=0, steps=24, rank=0, world_size=1)
    loader = DataLoader(ecrl.WithSampleIds(Squares(192)), batch_sampler=sampler, num_workers=2)
    assert len(loader) == 24
    iterator = iter(loader)  # the workers are handed batches ahead of the loop
    assert len(loader) == 24
    taken = [next(iterator) for _ in range(5)]
    assert len(loader) == 24 and len(taken) == 5
    assert sum(1 for _ in iterator) == 19
    del iterator
    saved = ecrl.GlobalBatchSampler(192, 8, seed=0, steps=24, rank=0, world_size=1)
    saved.step_done(9)
    resumed = ecrl.GlobalBatchSampler(192, 8, seed=0, steps=24, rank=0, world_size=1)
    resumed.load_state_dict(saved.state_dict())  # in the middle of the epoch
    loader = DataLoader(ecrl.WithSampleIds(Squares(192)), batch_sampler=resumed, num_workers=2)
    assert len(loader) == 14
    iterator = iter(loader)
    assert len(loader) == 14
    assert sum(1 for _ in iterator) == 14


def test_an_iterator_created_before_restore_is_refused_at_once(tmp_path: Path) -> None:
    """A framework that creates the loader's iterator (workers prefetching from step 0) before
    the script's restore(): one line naming the cause and the fix, before any step (issue 25,
    item 3), whether the checkpointer is made after the iterator or restore() comes later."""
    _train(tmp_path, steps=6, every=2, stop_after=3)  # leaves a checkpoint at step 3
    _attempt._CACHE.clear()
    model, opt = _model()
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=6)
    loader = DataLoader(ecrl.WithSampleIds(Squares(64)), batch_sampler=sampler, num_workers=2)
    early = iter(loader)
    with pytest.raises(SemanticsError) as refused:
        ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler},
                          run_dir=tmp_path, every=2)
    line = str(refused.value)
    assert "is being iterated from step 0" in line and "before Checkpointer.restore()" in line
    assert "\n" not in line
    saved = ecrl.GlobalBatchSampler(64, 8, seed=0, steps=6).state_dict()
    with pytest.raises(SemanticsError, match="is being iterated from step 0"):
        sampler.load_state_dict(saved)
    del early  # the workers stop; now the state can be loaded
    sampler.load_state_dict(saved)
    assert sampler.next_step == 0 and len(sampler) == 6


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.3), torch.nn.Linear(8, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


class Forwarding(torch.optim.Optimizer):
    """An optimizer wrapper shaped like Accelerate's ``AcceleratedOptimizer``: a subclass of
    torch's ``Optimizer`` that does not run its constructor and forwards to the optimizer it
    holds (so it has no step-hook registry of its own)."""

    def __init__(self, optimizer: torch.optim.Optimizer) -> None:
        self.optimizer = optimizer

    @property
    def param_groups(self) -> Any:  # type: ignore[override]
        return self.optimizer.param_groups

    @property
    def state(self) -> Any:  # type: ignore[override]
        return self.optimizer.state

    def state_dict(self) -> dict[str, Any]:  # type: ignore[override]
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:  # type: ignore[override]
        self.optimizer.load_state_dict(state_dict)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.optimizer.zero_grad(set_to_none)

    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        return self.optimizer.step(closure)


def _train(run: Path, *, steps: int, every: int, stop_after: int | None = None, seed: int = 0,
           workers: int = 0, strategy: str | None = "blocking", wrap: bool | str = False
           ) -> tuple[list[float], dict[str, torch.Tensor]]:
    """A small standalone loop; returns the losses it logged and the final weights
    (``strategy`` None: the default one; ``wrap``: the optimizer inside :class:`Forwarding`, or
    ``"accelerate"``: inside Accelerate's own ``AcceleratedOptimizer``)."""
    model, opt = _model()
    if wrap == "accelerate":
        from accelerate import Accelerator

        opt = Accelerator(cpu=True).prepare_optimizer(opt)
    elif wrap:
        opt = Forwarding(opt)
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=seed, steps=steps)
    loader = DataLoader(ecrl.WithSampleIds(Squares(64)), batch_sampler=sampler,
                        num_workers=workers)
    log = ecrl.StepLog(run, sampler=sampler, steps=steps)
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler}, log=log,
                             every=every, strategy=strategy)
    losses = []
    start = ckpt.restore()
    for step, (ids, (x, y)) in zip(range(start, steps), loader, strict=True):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        log.step(step, sample_ids=ids, loss=loss)  # before the backward pass (docs/library.md)
        opt.zero_grad()
        loss.backward()
        opt.step()
        ckpt.after_step(step)
        losses.append(float(loss.detach()))
        if step == stop_after:
            break
    ckpt.close()
    log.close()
    return losses, {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_standalone_resume_is_bit_identical_and_logs_the_ids_that_reached_the_step(
        tmp_path: Path, workers: int) -> None:
    whole, final = _train(tmp_path / "whole", steps=12, every=4, workers=workers)
    first, _ = _train(tmp_path / "cut", steps=12, every=4, stop_after=9, workers=workers)
    _attempt._CACHE.clear()
    rest, resumed = _train(tmp_path / "cut", steps=12, every=4, workers=workers)
    assert first[:8] + rest == whole  # the checkpoint after step 7: steps 8.. replayed
    assert all(torch.equal(final[k], resumed[k]) for k in final)
    manifest = read_json_record(tmp_path / "cut" / "run.json", RunManifest)
    assert manifest.sampler == {"kind": "ecrl", "name": "ecrl.GlobalBatchSampler"}
    geometry = semantics.Geometry(dataset_size=64, global_batch=8)
    records = [json.loads(line) for line in
               (tmp_path / "cut" / "logs" / "attempt-001" / "rank-000.jsonl").open()]
    assert [r["global_step"] for r in records] == list(range(8, 12))
    for r in records:
        assert r["sample_ids"] == semantics.shard(geometry, 0, r["global_step"], 0, 1).tolist()


@pytest.mark.parametrize("wrap", [True, "accelerate"], ids=["forwarding", "accelerate"])
@pytest.mark.parametrize("strategy", [None, "jit"])
def test_a_wrapped_optimizer_checkpoints_and_resumes_bit_identically(
        tmp_path: Path, strategy: str | None, wrap: bool | str) -> None:
    """Accelerate's and the transformers Trainer's optimizer wrapper crashed the default
    strategy, which hooks the optimizer's step (issue 25, item 4): the hooks go to the
    optimizer it wraps."""
    whole, final = _train(tmp_path / "whole", steps=12, every=4, strategy=strategy, wrap=wrap)
    first, _ = _train(tmp_path / "cut", steps=12, every=4, stop_after=9, strategy=strategy,
                      wrap=wrap)
    _attempt._CACHE.clear()
    rest, resumed = _train(tmp_path / "cut", steps=12, every=4, strategy=strategy, wrap=wrap)
    assert first[:8] + rest == whole
    assert all(torch.equal(final[k], resumed[k]) for k in final)


def test_a_step_logged_twice_is_an_error(tmp_path: Path) -> None:
    sampler = ecrl.GlobalBatchSampler(64, 8)
    log = ecrl.StepLog(tmp_path, sampler=sampler, steps=4)
    ids = next(iter(sampler))
    log.step(0, sample_ids=ids, loss=1.0)
    with pytest.raises(SemanticsError, match="step 0 logged twice"):
        log.step(0, sample_ids=ids, loss=1.0)


def test_ids_that_are_not_the_steps_are_refused(tmp_path: Path) -> None:
    sampler = ecrl.GlobalBatchSampler(64, 8)
    log = ecrl.StepLog(tmp_path, sampler=sampler, steps=4)
    stream = iter(sampler)
    next(stream)
    with pytest.raises(SemanticsError, match="does not hold the IDs the sampler scheduled"):
        log.step(0, sample_ids=next(stream))


@pytest.mark.parametrize(("change", "what"), [({"seed": 3}, "seed=0"),
                                              ({"dataset_size": 72}, "dataset_size=64")])
def test_restoring_a_checkpoint_of_another_dataset_or_seed_is_refused(
        tmp_path: Path, change: dict[str, int], what: str) -> None:
    _train(tmp_path, steps=6, every=2, stop_after=3)
    _attempt._CACHE.clear()
    settings = {"dataset_size": 64, "seed": 0, **change}
    sampler = ecrl.GlobalBatchSampler(settings["dataset_size"], 8, seed=settings["seed"])
    model, opt = _model()
    ckpt = ecrl.Checkpointer({"model": model, "optimizer": opt, "sampler": sampler},
                             run_dir=tmp_path)
    with pytest.raises(CheckpointError, match=f"written by a run with {what}.*does not belong"):
        ckpt.restore()


def test_a_run_json_of_another_run_is_refused(tmp_path: Path) -> None:
    _train(tmp_path, steps=6, every=2, stop_after=1)
    _attempt._CACHE.clear()
    log = ecrl.StepLog(tmp_path, sampler=ecrl.GlobalBatchSampler(64, 8, seed=9), steps=6)
    with pytest.raises(ConfigError, match="describes a run with seed 0, this script has 9"):
        log.ensure_manifest()


def test_external_sampler_needs_the_loops_epoch_and_is_declared(tmp_path: Path) -> None:
    log = ecrl.StepLog(tmp_path, sampler={"kind": "external", "name": "my.Sampler"},
                       dataset_size=64, global_batch=8, steps=4)
    with pytest.raises(ConfigError, match="needs epoch= and cursor_step="):
        log.step(0, sample_ids=np.arange(8))
    with pytest.raises(ConfigError, match="must be non-negative"):
        log.step(0, sample_ids=np.arange(8), epoch=0, cursor_step=-5)
    # IDs of another data set than the one declared (one wrapped before random_split): refused
    # in the loop, not left to the verifier's FAIL after the run.
    with pytest.raises(ConfigError, match=r"sample ID 64 is outside the data set's IDs 0\.\.63"):
        log.step(0, sample_ids=np.arange(60, 68), epoch=0, cursor_step=0)
    log.step(0, sample_ids=np.arange(8), epoch=0, cursor_step=0, loss=torch.tensor(0.5))
    log.close()
    manifest = read_json_record(tmp_path / "run.json", RunManifest)
    assert manifest.external_sampler and manifest.sampler == {"kind": "external",
                                                              "name": "my.Sampler"}
    record = json.loads((tmp_path / "logs" / "attempt-000" / "rank-000.jsonl").read_text())
    assert record["sample_ids"] == list(range(8)) and record["loss"] == 0.5


@pytest.mark.parametrize(("given", "logged"), [
    (torch.tensor(5), [5]), (torch.tensor([[1, 2], [3, 4]]), [1, 2, 3, 4]),
    (torch.tensor([7, 6], dtype=torch.int32), [7, 6]), ([3, 4], [3, 4]), (np.int64(7), [7]),
    (np.array([[2], [9]]), [2, 9]), (torch.tensor([], dtype=torch.int64), [])])
def test_ids_of_any_integer_form_are_logged_flat(tmp_path: Path, given: Any, logged: list[int]
                                                 ) -> None:
    with ecrl.StepLog(tmp_path, sampler={"kind": "external", "name": "x"}, dataset_size=64,
                      global_batch=8, steps=1) as log:
        log.step(0, sample_ids=given, epoch=0, cursor_step=0)
    record = json.loads((tmp_path / "logs" / "attempt-000" / "rank-000.jsonl").read_text())
    assert record["sample_ids"] == logged and record["sample_ids_count"] == len(logged)


@pytest.mark.parametrize("given", [torch.tensor([1.0]), [True, False], np.array([0.5]),
                                   torch.tensor([True])])
def test_ids_that_are_not_integers_are_refused(tmp_path: Path, given: Any) -> None:
    log = ecrl.StepLog(tmp_path, sampler={"kind": "external", "name": "x"}, dataset_size=64,
                       global_batch=8, steps=1)
    with pytest.raises(SemanticsError, match="sample_ids must be integers"):
        log.step(0, sample_ids=given, epoch=0, cursor_step=0)


@pytest.mark.parametrize("log_ids", [True, False])
def test_each_line_is_the_step_records_own_dict(tmp_path: Path, log_ids: bool) -> None:
    """The step log builds its lines without the StepRecord dataclass (the hot path): each line
    must still be exactly what StepRecord.to_dict() writes, fields in order, extras last."""
    from ecrl.contract.runformat import StepRecord

    sampler = ecrl.GlobalBatchSampler(64, 8, seed=3, steps=3)
    with ecrl.StepLog(tmp_path / "ours", sampler=sampler, steps=3, log_ids=log_ids) as ours:
        for step, ids in zip(range(3), sampler, strict=False):
            ours.step(step, sample_ids=torch.tensor(ids), loss=torch.tensor([1.0, 2.0]),
                      lr=0.1 * step)
    with ecrl.StepLog(tmp_path / "theirs", sampler={"kind": "external", "name": "x"},
                      dataset_size=64, global_batch=8, steps=1, log_ids=log_ids) as theirs:
        theirs.step(0, sample_ids=[5, 9, 1, 0, 2, 3, 4, 6], epoch=0, cursor_step=0,
                    loss=float("nan"))
    for run in ("ours", "theirs"):
        lines = (tmp_path / run / "logs" / "attempt-000" / "rank-000.jsonl").read_bytes()
        for line in lines.splitlines():
            written = json.loads(line)
            again = StepRecord.from_dict(written).to_dict()
            assert list(written.items()) == list(again.items())
            assert ("sample_ids" in written) == log_ids
            ids = written.get("sample_ids")
            if ids is not None:
                assert written["sample_ids_hash"] == semantics.format_hash(
                    semantics.ids_hash(np.array(ids)))
            assert written["loss"] == (None if run == "theirs" else 1.5)  # a vector's mean


def test_an_external_sampler_may_declare_that_its_epochs_drop_a_remainder(tmp_path: Path
                                                                           ) -> None:
    """DistributedSampler(drop_last=True) with D % B != 0 failed an uninterrupted audit until
    run.json said so; the keyword a user reaches for was a TypeError (issue 25, item 6)."""
    log = ecrl.StepLog(tmp_path, sampler={"kind": "external",
                                          "name": "torch.utils.data.DistributedSampler"},
                       dataset_size=410, global_batch=20, steps=20,
                       epoch_coverage="drop_remainder")
    log.step(0, sample_ids=np.arange(20), epoch=0, cursor_step=0)
    log.close()
    manifest = read_json_record(tmp_path / "run.json", RunManifest)
    assert manifest.sampler["epoch_coverage"] == "drop_remainder"
    with pytest.raises(ConfigError, match="must be one of 'all', 'drop_remainder'"):
        ecrl.StepLog(tmp_path / "b", sampler={"kind": "external", "name": "s"},
                     dataset_size=410, global_batch=20, steps=20, epoch_coverage="most")
    with pytest.raises(ConfigError, match="is for an external sampler"):
        ecrl.StepLog(tmp_path / "c", sampler=ecrl.GlobalBatchSampler(64, 8), steps=8,
                     epoch_coverage="all")


def test_with_sample_ids_carries_ids_through_workers_and_collation() -> None:
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=4, steps=3)
    batches = list(DataLoader(ecrl.WithSampleIds(Squares(64)), batch_sampler=sampler,
                              num_workers=2))
    geometry = semantics.Geometry(dataset_size=64, global_batch=8)
    for step, (ids, (x, _)) in enumerate(batches):
        assert ids.tolist() == semantics.shard(geometry, 4, step, 0, 1).tolist()
        assert x[:, 0].tolist() == [float(i) for i in ids]  # each ID rode with its own sample


def test_a_loaders_own_collate_fn_gets_items_and_the_ids_ride_beside(tmp_path: Path) -> None:
    """A custom collate_fn under WithSampleIds received (id, item) pairs and failed inside a
    worker (issue 25, item 7): WithSampleIds.collate gives it the items."""
    def as_dict(items: list[tuple[torch.Tensor, torch.Tensor]]) -> dict[str, torch.Tensor]:
        return {"x": torch.stack([x for x, _ in items]), "y": torch.stack([y for _, y in items])}

    sampler = ecrl.GlobalBatchSampler(64, 8, seed=4, steps=3)
    loader = DataLoader(ecrl.WithSampleIds(Squares(64)), batch_sampler=sampler, num_workers=2,
                        collate_fn=ecrl.WithSampleIds.collate(as_dict))
    geometry = semantics.Geometry(dataset_size=64, global_batch=8)
    for step, (ids, batch) in enumerate(loader):
        assert ids.dtype == torch.long
        assert ids.tolist() == semantics.shard(geometry, 4, step, 0, 1).tolist()
        assert batch["x"][:, 0].tolist() == [float(i) for i in ids]
    with pytest.raises(TypeError, match="needs a function"):
        ecrl.WithSampleIds.collate("stack")  # type: ignore[arg-type]


def test_checkpointer_refuses_non_stateful_values_and_the_reserved_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no state_dict/load_state_dict"):
        ecrl.Checkpointer({"x": 3}, run_dir=tmp_path)
    with pytest.raises(ConfigError, match="reserved"):
        ecrl.Checkpointer({"rng": torch.nn.Linear(1, 1)}, run_dir=tmp_path)


def test_jit_refuses_a_dataloader_among_the_checkpointed_state(tmp_path: Path) -> None:
    from torchdata.stateful_dataloader import StatefulDataLoader

    loader = StatefulDataLoader(Squares(16), batch_size=4)
    with pytest.raises(ConfigError, match="'loader' is a DataLoader"):
        ecrl.Checkpointer({"loader": loader}, run_dir=tmp_path, strategy="jit")
    ecrl.Checkpointer({"loader": loader}, run_dir=tmp_path, strategy="blocking")  # allowed


def test_the_strategy_registry_is_the_one_source(tmp_path: Path) -> None:
    assert registry.strategy_names() == STRATEGIES  # the run format's vocabulary, no other
    for name in registry.built_strategies():
        cls = registry.strategy_class(name)
        assert cls.name == name
    registry.register_strategy("unbuilt-test", None, summary="test")
    try:
        with pytest.raises(ConfigError, match="not built yet"):
            make_strategy("unbuilt-test", None)  # type: ignore[arg-type]
    finally:
        del registry.REGISTRY["unbuilt-test"]
    registry.register_strategy("custom-test", "ecrl.runtime.checkpoint.strategies:NoCheckpoints",
                               summary="test")
    try:
        ctx = CheckpointContext(paths=None, attempt=0, rank=0, world_size=1,  # type: ignore
                                geometry=semantics.Geometry(dataset_size=8, global_batch=8),
                                target_steps=4, every=1, keep=2, max_inflight=1,
                                capture=lambda r: {}, meta=lambda s: {})
        assert make_strategy("custom-test", ctx).name == "custom-test"
    finally:
        del registry.REGISTRY["custom-test"]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_sampler_rides_in_a_stateful_dataloader_state(workers: int) -> None:
    stateful = pytest.importorskip("torchdata.stateful_dataloader")

    def loader() -> Any:
        sampler = ecrl.GlobalBatchSampler(64, 8, seed=1, steps=20)
        return stateful.StatefulDataLoader(ecrl.WithSampleIds(Squares(64)),
                                           batch_sampler=sampler, num_workers=workers)

    whole = loader()
    expected = [ids.tolist() for ids, _ in whole]
    got = []
    first = loader()
    it = iter(first)
    got += [next(it)[0].tolist() for _ in range(5)]
    state = first.state_dict()
    for _ in range(2):  # resume twice: a loaded sampler keeps counting
        again = loader()
        again.load_state_dict(state)
        it = iter(again)
        got += [next(it)[0].tolist() for _ in range(4)]
        state = again.state_dict()
    assert got == expected[:13]


def test_a_batch_changed_after_the_sampler_issued_it_is_refused(tmp_path: Path) -> None:
    # The step log compares the batch with the IDs as issued, not with the caller's list.
    sampler = ecrl.GlobalBatchSampler(64, 8, seed=0, rank=0, world_size=1)
    log = ecrl.StepLog(tmp_path / "run", sampler=sampler, steps=10)
    batch = next(iter(sampler))
    batch[0] = next(i for i in range(64) if i not in batch)
    with pytest.raises(SemanticsError, match="does not hold the IDs"):
        log.step(0, sample_ids=batch)
