"""Live resources in a resume state: data-loader iterators, SummaryWriters and open files come
back at their position (issue 30, item 3), in one process: the state is saved, the original goes
on (what an uninterrupted run does), and the state loaded again must go on the same way."""

from __future__ import annotations

import gc
import multiprocessing
import pickle
import random
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    TensorDataset,
)
from torchdata.stateful_dataloader import StatefulDataLoader

from transform.runtime._exit import CheckpointError
from transform.runtime._pickling import dumps, loads
from transform.runtime._resources import install
from transform.runtime._rng import rng_state, set_rng_state

install()


def _save(payload: dict[str, Any]) -> Callable[[], dict[str, Any]]:
    """The state now, and what loads it back (with the random state of the save, as a resume
    sets it)."""
    dumped = dumps(payload, {})
    saved_rng = rng_state()

    def load() -> dict[str, Any]:
        back = loads(dumped.data, {}, dumped.globals, dumped.blobs.__getitem__)
        set_rng_state(saved_rng)
        return back

    return load


class _Augmented(Dataset[Any]):
    """Each item draws from the random state of the process that loads it (a worker's own)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> Any:
        return torch.tensor(float(i)) + torch.rand(())


class _Stream(IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter(torch.arange(30.0) * 3)


_DATA = TensorDataset(torch.arange(100.0))


def _own_generator() -> DataLoader[Any]:
    generator = torch.Generator()
    generator.manual_seed(5)
    return DataLoader(_DATA, batch_size=7, shuffle=True, generator=generator)


def _stateful(*args: Any, **kwargs: Any) -> DataLoader[Any]:
    """torchdata's StatefulDataLoader (a pinned test dependency)."""
    return StatefulDataLoader(*args, **kwargs)


class _OwnStatefulLoader(StatefulDataLoader):  # type: ignore[misc]
    """A StatefulDataLoader subclass of the program's own (its module is not torchdata's): it
    was saved as a plain object, and every resume then failed the same way."""


class _Buckets(Sampler[list[int]]):
    """A batch sampler of the program's own that shuffles its batches with a ``random.Random``
    of its own when iterated (a bucketing sampler): its state was not among those replayed."""

    def __init__(self, size: int, batch: int, seed: int) -> None:
        self.batches = [list(range(i, min(i + batch, size))) for i in range(0, size, batch)]
        self.rng = random.Random(seed)

    def __iter__(self) -> Any:
        order = list(self.batches)
        self.rng.shuffle(order)
        return iter(order)

    def __len__(self) -> int:
        return len(self.batches)


LOADERS: dict[str, Callable[[], DataLoader[Any]]] = {
    "own-batch-sampler-with-its-own-random": lambda: DataLoader(
        _DATA, batch_sampler=_Buckets(len(_DATA), 7, 3)),
    "shuffled": lambda: DataLoader(_DATA, batch_size=7, shuffle=True),
    "infinite-with-replacement": lambda: DataLoader(
        _DATA, batch_size=7, sampler=RandomSampler(_DATA, replacement=True,
                                                   num_samples=10**10)),
    "own-generator": _own_generator,
    "workers-drawing-random-numbers": lambda: DataLoader(_Augmented(), batch_size=4,
                                                         shuffle=True, num_workers=2),
    "iterable-dataset": lambda: DataLoader(_Stream(), batch_size=4),
    "stateful-dataloader-shuffled": lambda: _stateful(_DATA, batch_size=7, shuffle=True),
    "stateful-dataloader-workers-drawing-random-numbers": lambda: _stateful(
        _Augmented(), batch_size=4, shuffle=True, num_workers=2),
    "stateful-dataloader-subclass-workers-drawing-random-numbers": lambda: _OwnStatefulLoader(
        _Augmented(), batch_size=4, shuffle=True, num_workers=2),
}


def _batches(iterator: Any, count: int) -> list[Any]:
    out = []
    for _, batch in zip(range(count), iterator, strict=False):
        out.append(batch[0] if isinstance(batch, list | tuple) else batch)
    return out


@pytest.mark.parametrize("kind", sorted(LOADERS))
@pytest.mark.parametrize("taken", [0, 3])
def test_a_data_loader_iterator_resumes_at_its_batch_in_its_order(kind: str,
                                                                   taken: int) -> None:
    torch.manual_seed(0)
    loader = LOADERS[kind]()
    torch.randn(3)
    iterator = iter(loader)
    # The program draws between creating the iterator and its first batch (the sampler's
    # seed is drawn then), and after: the re-created iterator must not depend on either.
    torch.randn(5)
    _batches(iterator, taken)
    torch.randn(2)
    load = _save({"iterator": iterator, "loader": loader})
    expected = _batches(iterator, 5)
    after_expected = torch.randn(4)
    back = load()
    assert back["iterator"]._num_yielded == taken
    got = _batches(back["iterator"], 5)
    assert len(got) == len(expected) == 5
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    # and the program's own random stream goes on as it would have
    assert torch.equal(torch.randn(4), after_expected)


def test_a_dataset_copied_for_a_resumes_walk_shares_its_arrays_and_not_its_generators() -> None:
    from transform.runtime._resources import _copy_sharing_arrays

    class Held:
        def __init__(self) -> None:
            self.images = np.zeros((4, 3))
            self.labels = torch.arange(4)
            self.rng = np.random.default_rng(1)
            self.scale = lambda v: v * 2

    held = Held()
    copied = _copy_sharing_arrays(held)
    assert copied.images is held.images and copied.labels is held.labels
    assert copied.rng is not held.rng
    assert copied.rng.random() == held.rng.random() and copied.scale(2) == 4
    copied.rng.random()
    assert copied.rng.random() != held.rng.random()


def test_a_loader_with_persistent_workers_is_refused_at_the_save() -> None:
    loader = DataLoader(_Augmented(), batch_size=4, num_workers=1, persistent_workers=True)
    iterator = iter(loader)
    next(iterator)
    with pytest.raises(pickle.PicklingError, match="persistent_workers=True"):
        dumps({"iterator": iterator}, {})


class _Keeping(DataLoader[Any]):
    """A loader with an ``__iter__`` of its own that keeps its iterator, as
    ``StatefulDataLoader`` does for its ``state_dict``."""

    def __iter__(self) -> Any:
        self.kept = super().__iter__()
        return self.kept


KEEPING_LOADERS: dict[str, Callable[[], Any]] = {
    "persistent-workers": lambda: DataLoader(_Augmented(), batch_size=4, num_workers=2,
                                             persistent_workers=True),
    "own-iter-with-workers": lambda: _Keeping(_Augmented(), batch_size=4, num_workers=2),
    "stateful-dataloader-with-workers": lambda: pytest.importorskip(
        "torchdata.stateful_dataloader").StatefulDataLoader(_Augmented(), batch_size=4,
                                                            num_workers=2),
}


@pytest.mark.parametrize("kind", sorted(KEEPING_LOADERS))
def test_a_loader_that_keeps_its_iterator_is_freed_without_the_cyclic_collector(
        kind: str) -> None:
    """The observer once held every loader strongly, so a loader that keeps its iterator made a
    cycle, and only the cyclic collector freed it: that closed the worker queues before torch's
    shutdown ran, which then waited 5 s on each worker (and left a StatefulDataLoader's running).
    Freed by reference counting, the iterator shuts its workers down at once."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        others = set(multiprocessing.active_children())
        loader = KEEPING_LOADERS[kind]()
        iterator = iter(loader)
        next(iterator)
        freed = weakref.ref(iterator)
        del iterator, loader
        assert freed() is None
        assert set(multiprocessing.active_children()) <= others
    finally:
        if enabled:
            gc.enable()


def test_the_iterator_of_a_loader_the_program_dropped_is_refused_when_held_weakly() -> None:
    iterator = iter(_Keeping(_DATA, batch_size=7))  # the loader is gone after this line
    next(iterator)
    with pytest.raises(pickle.PicklingError, match="no longer holds"):
        dumps({"iterator": iterator}, {})


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_resumed_by_the_runtime_still_gives_its_own_state(
        workers: int) -> None:
    """The program's own use of the loader goes on after the resume: the loader keeps the
    re-created iterator, and its ``state_dict`` resumes a new loader where that iterator is."""
    torch.manual_seed(0)
    loader = _stateful(_DATA, batch_size=7, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    _batches(iterator, 3)
    back = _save({"loader": loader, "iterator": iterator})()
    assert back["loader"]._iterator is back["iterator"]
    _batches(back["iterator"], 2)
    state = back["loader"].state_dict()
    _assert_state_resumes(state, workers, _batches(back["iterator"], 4))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stateful_dataloader_saved_without_its_iterator_keeps_that_iterators_place(
        workers: int) -> None:
    """The program dropped its iterator; the loader kept it, and its own ``state_dict`` says
    where it is. Saved without it, the resumed loader's state was a new iterator's (the start of
    an epoch): a program checkpointing it itself would resume from the wrong place."""
    torch.manual_seed(0)
    loader = _stateful(_DATA, batch_size=7, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    _batches(iterator, 3)
    del iterator
    load = _save({"loader": loader})
    expected = _batches(loader._iterator, 4)
    _assert_state_resumes(load()["loader"].state_dict(), workers, expected)


def _assert_state_resumes(state: dict[str, Any], workers: int, expected: list[Any]) -> None:
    """A fresh StatefulDataLoader loaded with ``state`` gives ``expected`` next."""
    torch.manual_seed(99)  # the new loader's order must come from the state alone
    fresh = _stateful(_DATA, batch_size=7, shuffle=True, num_workers=workers)
    fresh.load_state_dict(state)
    got = _batches(iter(fresh), len(expected))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_stateful_dataloader_keeps_the_iterator_it_kept_when_the_program_holds_two() -> None:
    loader = _stateful(_DATA, batch_size=7, shuffle=True)
    older = iter(loader)
    _batches(older, 2)
    newer = iter(loader)  # the loader now keeps this one
    next(newer)
    # The older one is re-created after the newer: the loader must not keep it.
    back = _save({"loader": loader, "newer": newer, "older": older})()
    assert back["loader"]._iterator is back["newer"]
    assert back["older"]._num_yielded == 2 and back["newer"]._num_yielded == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_the_observer_leaves_a_stateful_dataloaders_own_resume_exact(workers: int) -> None:
    """The runtime wraps each iterator's sampler iterator to see its first draw; the wrapper once
    hid a stateful sampler's ``state_dict`` from StatefulDataLoader, whose own resume then drew a
    new order (a program's own checkpointing, silently wrong under the transform)."""
    torch.manual_seed(0)
    loader = _stateful(_DATA, batch_size=7, shuffle=True, num_workers=workers)
    iterator = iter(loader)
    _batches(iterator, 3)
    state = loader.state_dict()
    _assert_state_resumes(state, workers, _batches(iterator, 5))


def test_an_iterator_of_a_stateful_dataloader_the_program_resumed_itself_is_refused() -> None:
    loader = _stateful(_DATA, batch_size=7, shuffle=True)
    first = iter(loader)
    _batches(first, 2)
    state = loader.state_dict()
    loader.load_state_dict(state)
    resumed = iter(loader)
    next(resumed)
    with pytest.raises(pickle.PicklingError, match="resumed from a state_dict") as refused:
        dumps({"iterator": resumed, "loader": loader}, {})
    assert "\n" not in str(refused.value)


def test_another_packages_iterator_is_refused_in_one_line() -> None:
    from torch.utils.data.dataloader import _SingleProcessDataLoaderIter

    class _Elsewhere(_SingleProcessDataLoaderIter):
        __module__ = "torchdata.nodes.loader"

    loader = DataLoader(_DATA, batch_size=7)
    iterator = _Elsewhere(loader)
    next(iterator)
    with pytest.raises(pickle.PicklingError, match="torch's DataLoader or torchdata's") as refused:
        dumps({"iterator": iterator, "loader": loader}, {})
    assert "\n" not in str(refused.value) and "torchdata.nodes.loader" in str(refused.value)


class _FileLines(Dataset[str]):
    """Items read from a file when loaded (a data set on disk, not in the state)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __len__(self) -> int:
        return len(self.path.read_text().splitlines())

    def __getitem__(self, i: int) -> str:
        return self.path.read_text().splitlines()[i]


def test_an_iterator_longer_than_its_recreation_is_refused_on_resume(tmp_path: Path) -> None:
    data = tmp_path / "items.txt"
    data.write_text("".join(f"{i}\n" for i in range(20)))
    loader = DataLoader(_FileLines(data), batch_size=2)
    iterator = iter(loader)
    _batches(iterator, 6)
    load = _save({"iterator": iterator})
    data.write_text("".join(f"{i}\n" for i in range(4)))  # the data set shrank since
    with pytest.raises(CheckpointError, match="after 6 batches ends sooner"):
        load()


# --------------------------------------------------------------------------- summary writers


def _scalars(log_dir: Path) -> list[tuple[int, float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return sorted((e.step, e.value) for e in events.Scalars("loss"))


def test_a_summary_writer_resumes_without_logging_an_event_twice(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    straight = SummaryWriter(log_dir=str(tmp_path / "straight"))
    for step in range(10):
        straight.add_scalar("loss", 1.0 / (step + 1), step)
    straight.close()

    writer = SummaryWriter(log_dir=str(tmp_path / "resumed"))
    for step in range(5):
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    load = _save({"writer": writer})
    for step in range(5, 8):  # logged after the checkpoint by the attempt that is killed
        writer.add_scalar("loss", 1.0 / (step + 1), step)
    writer.flush()
    killed_attempts_file = SummaryWriter(log_dir=str(tmp_path / "resumed"))  # a later attempt's
    killed_attempts_file.add_scalar("loss", 99.0, 5)
    killed_attempts_file.flush()
    back = load()["writer"]
    assert back is not writer and back.log_dir == str((tmp_path / "resumed").resolve())
    for step in range(5, 10):
        back.add_scalar("loss", 1.0 / (step + 1), step)
    back.close()
    assert _scalars(tmp_path / "resumed") == _scalars(tmp_path / "straight")
    assert len(_scalars(tmp_path / "resumed")) == 10


# --------------------------------------------------------------------------- open files


@pytest.mark.parametrize("mode", ["w", "wb", "a", "w+"])
def test_a_file_being_written_resumes_at_its_position_without_what_came_after(
        tmp_path: Path, mode: str) -> None:
    path = tmp_path / "log.txt"
    if "a" in mode:
        path.write_text("earlier run\n")

    def line(i: int) -> Any:
        text = f"step {i}\n"
        return text.encode() if "b" in mode else text

    f = open(path, mode)  # noqa: SIM115
    for i in range(3):
        f.write(line(i))
    load = _save({"f": f})
    for i in range(3, 6):  # written after the checkpoint, then the process is killed
        f.write(line(i))
    f.flush()
    back = load()["f"]
    for i in range(3, 5):
        back.write(line(i))
    back.close()
    f.close()
    expected = ("earlier run\n" if "a" in mode else "") + "".join(f"step {i}\n" for i in range(5))
    assert path.read_text() == expected


@pytest.mark.parametrize("mode", ["r", "rb"])
def test_a_file_being_read_resumes_at_its_position(tmp_path: Path, mode: str) -> None:
    path = tmp_path / "data.txt"
    path.write_text("".join(f"line {i} é\n" for i in range(50)), encoding="utf-8")
    with open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
        for _ in range(7):
            f.readline()
        load = _save({"f": f})
        rest = f.read()
    back = load()["f"]
    try:
        assert back.read() == rest
    finally:
        back.close()


def test_a_file_cut_short_since_the_save_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "log.txt"
    with open(path, "w") as f:
        f.write("0123456789")
        load = _save({"f": f})
    path.write_text("01")
    with pytest.raises(CheckpointError, match="shorter than at the checkpoint"):
        load()


def test_standard_streams_are_the_resumed_process_own() -> None:
    back = _save({"out": sys.stdout, "err": sys.stderr})()
    assert back["out"] is sys.stdout and back["err"] is sys.stderr
