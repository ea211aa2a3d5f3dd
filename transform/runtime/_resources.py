"""Live resources in a resume state: saved as what re-creates them at their position.

A program keeps things across its loop that are not values: a ``DataLoader`` iterator (an
"infinite" loader wrapper), a tensorboard ``SummaryWriter``, an open file. None of them pickles;
each is saved as the recipe that gives the resumed program the same object at the same point.

* **DataLoader iterators** are re-created from their loader and advanced to the saved batch. The
  order a shuffling loader yields is drawn from the random state at two moments the program does
  not see: the iterator's creation (the workers' base seed) and the sampler's first draw. The
  runtime records the random states at both (an observer on torch's iterator class, installed
  when ``torch.utils.data`` is imported; it changes nothing the iterator does), and the
  re-creation replays them. Without workers the sampler is advanced without loading the skipped
  batches (the global random state is restored afterwards, so what the skipped loads would have
  drawn does not matter); with workers, or over an iterable dataset, the skipped batches are
  loaded and dropped, because the workers' random streams advance with every item they load.
  Persistent workers are refused: their iterator is reset each epoch and its workers' streams
  carry over, which a fresh iterator cannot reproduce. The observer holds the loader weakly when
  the loader keeps its iterator (``loader._iterator``: torch's with persistent workers, and
  loaders with an ``__iter__`` of their own, such as ``StatefulDataLoader``): a strong hold there
  would close a reference cycle, and an iterator in a cycle is shut down by the cyclic collector,
  which closes its queues first, so torch's shutdown waited 5 s on each worker and could leave
  them running. Such an iterator saves while its loader is alive; one whose loader the program
  dropped is refused at the save. torchdata's ``StatefulDataLoader`` saves the iterator it
  keeps as its re-creation, made once the rest of the loader is back, so its own ``state_dict``
  goes on as in an uninterrupted run whether or not the program still holds that iterator.
* **SummaryWriters** are flushed at the save, and the size of every event file under their
  directory recorded. On resume the files are cut back to those sizes and event files that
  appeared after the checkpoint (written by the killed attempt) are removed, so no event is
  logged twice; the writer is re-opened on the same directory (a new event file, which
  TensorBoard reads with the others).
* **Open files** are flushed (and fsynced, for files open for writing) at the save; on resume they
  are re-opened at the saved position, a file open for writing cut back to its size at the save
  (what the killed attempt wrote after it is written again). ``sys.stdin``, ``stdout`` and
  ``stderr`` are the resumed process's own.

Everything else without a pickled form (a generator, a socket, a thread) is refused at the save
with the value's name.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import os
import pickle
import random
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, ClassVar

import cloudpickle
import wrapt

from transform.runtime._exit import CheckpointError
from transform.runtime._rng import rng_state, set_rng_state

__all__ = ["LoaderInBar", "LoopOrigin", "LoopWindow", "bar_loader", "enumerated", "install",
           "loop_iterator", "loop_origin", "reduce_resource", "resumed_loop"]

_LOADER_MODULE = "torch.utils.data.dataloader"
_WRITER_MODULE = "torch.utils.tensorboard.writer"
_STATEFUL_LOADER_MODULE = "torchdata.stateful_dataloader.stateful_dataloader"
"""torchdata's ``StatefulDataLoader``, whose iterators subclass torch's and are re-created the
same way; the loader keeps its current iterator, which its own pickled form leaves out."""
_OTHER_LOADER_PACKAGES = ("torchdata.",)
"""Packages whose other iterators subclass torch's but keep state the runtime does not
re-create: refused in one line instead of pickle's own error."""
_TQDM_UTILS = "tqdm.utils"
_EVENTS_PREFIX = "events.out.tfevents."
_installed = False


def install() -> None:
    """Observe torch's data-loader iterators from now on (at once when torch is imported)."""
    global _installed
    if not _installed:
        _installed = True
        wrapt.register_post_import_hook(_observe_loader_iterators, _LOADER_MODULE)


def reduce_resource(obj: Any) -> Any:
    """The reduction of a live resource, or NotImplemented for anything else."""
    if isinstance(obj, io.IOBase):
        return _reduce_file(obj)
    if _is_stateful(obj):
        return _reduce_stateful_loader(obj)
    module = type(obj).__module__
    if module == _LOADER_MODULE or module.startswith(_OTHER_LOADER_PACKAGES):
        torch_data = sys.modules[_LOADER_MODULE]
        if isinstance(obj, torch_data._BaseDataLoaderIter):
            if module not in (_LOADER_MODULE, _STATEFUL_LOADER_MODULE):
                raise pickle.PicklingError(
                    f"it is a data-loader iterator from {module}, which the runtime does not "
                    "re-create at its position; an iterator kept across a checkpoint must come "
                    "from torch's DataLoader or torchdata's StatefulDataLoader")
            return _reduce_loader_iterator(obj)
    elif module == _WRITER_MODULE and type(obj).__name__ == "SummaryWriter":
        return _reduce_summary_writer(obj)
    elif module == _TQDM_UTILS and isinstance(obj, sys.modules[_TQDM_UTILS].ObjectWrapper):
        return _wrapper_of, (type(obj), dict(vars(obj)))
    return NotImplemented


def _wrapper_of(cls: type, attributes: dict[str, Any]) -> Any:
    """A tqdm stream wrapper (a progress bar's ``fp``) made again without its ``__getattr__``,
    which forwards every name to the wrapped stream and recursed for ever when pickle looked
    for ``__setstate__`` on the empty object: every resume of a program holding a bar failed."""
    wrapper: Any = object.__new__(cls)
    vars(wrapper).update(attributes)
    return wrapper


# --------------------------------------------------------------------------- data loaders


class _Origin:
    """Where an iterator came from: its loader and the random states its order was drawn
    from (at creation, and at the sampler's first draw once it has happened)."""

    __slots__ = ("_strong", "_weak", "created", "first_draw", "from_loaded_state", "tracked",
                 "last_draw")

    def __init__(self, loader: Any, created: tuple[Any, Any]) -> None:
        # A StatefulDataLoader's iterator made from a state the program loaded into it starts
        # where that state says, not at the loader's start.
        self.from_loaded_state = getattr(loader, "next_iter_state", None) is not None
        # Weakly where the loader keeps the iterator: a strong hold would close a cycle.
        weak = _keeps_its_iterator(loader)
        self._strong = None if weak else loader
        self._weak = weakref.ref(loader) if weak else None
        self.created = created
        self.first_draw: tuple[Any, Any] | None = None
        self.tracked = False
        """Iterated by a ``for`` loop that holds a checkpoint (:func:`loop_iterator`)."""
        self.last_draw: dict[str, Any] | None = None
        """Tracked: the global random state as the latest batch was about to be loaded."""

    @property
    def loader(self) -> Any:
        """The loader, or None once a weakly held one is gone."""
        return self._weak() if self._weak is not None else self._strong


def _keeps_its_iterator(loader: Any) -> bool:
    """Whether ``loader`` holds the iterators it makes (``loader._iterator``): torch's
    ``DataLoader`` does with persistent workers; a loader with its own ``__iter__`` may at any
    time (``StatefulDataLoader`` keeps every one, for its ``state_dict``)."""
    base = sys.modules[_LOADER_MODULE].DataLoader
    if getattr(type(loader), "__iter__", None) is not base.__iter__:
        return True
    return bool(getattr(loader, "persistent_workers", False)) \
        and int(getattr(loader, "num_workers", 0)) > 0


class _FirstDraw:
    """Wraps an iterator's sampler iterator: records the random states at its first ``next``
    (when a shuffling sampler draws its seed), then only passes items on."""

    __slots__ = ("inner", "origin", "before_first")

    def __init__(self, inner: Iterator[Any], origin: _Origin) -> None:
        self.inner = inner
        self.origin = origin
        self.before_first: Callable[[], None] | None = None
        """Called just before the first draw: a re-created iterator (:class:`LoopWindow`) sets
        its loader's generator states and its dataset then, once the iterator is complete."""

    def __iter__(self) -> _FirstDraw:
        return self

    def __next__(self) -> Any:
        origin = self.origin
        if origin.first_draw is None:
            if self.before_first is not None:
                self.before_first()
                self.before_first = None
            origin.first_draw = _random_states(origin.loader)
        item = next(self.inner)
        if origin.tracked:
            # what loading the batch draws from (augmentations): its resume loads it again
            origin.last_draw = rng_state()
        return item

    def __getattr__(self, name: str) -> Any:
        # Everything else is the wrapped iterator's: a stateful sampler iterator's
        # ``state_dict``/``load_state_dict`` above all, which StatefulDataLoader looks for to
        # save and restore its position (without them it re-draws its order on resume).
        if name in _FirstDraw.__slots__:
            raise AttributeError(name)
        return getattr(self.inner, name)


class LoopWindow:
    """The DataLoader iterators made while a ``for`` loop begins (from its start to its first
    item), other than the loader, ``enumerate`` or ``tqdm`` bar the loop itself iterates
    (:func:`resumed_loop`): those of ``zip(a, b)``, of a generator of the program's, of any
    wrapper. A run notes them; a save keeps how each was made (:func:`loop_origin`); the
    resume's window re-creates them in the same order from those random states, as they are
    made again by the fast-forward, and their batches are loaded from a copy of the dataset
    until the resume reaches its checkpoint (:meth:`settle`), when the loaders' generators are
    put back to their states of the save and the datasets their loads go on from are the
    restored ones. Without this the fast-forward iterated the restored loaders: a loader with
    its own generator shuffled anew, and the batches passed over advanced a dataset's own
    random state (wrong results with exit 0)."""

    current: ClassVar[LoopWindow | None] = None

    def __init__(self, replay: list[LoopOrigin | None] | None = None) -> None:
        self.made: list[weakref.ref[Any]] = []
        self.replay: list[Any] = list(replay or [])
        self.settles: list[Callable[[], None]] = []
        LoopWindow.current = self

    def close(self) -> None:
        if LoopWindow.current is self:
            LoopWindow.current = None
        self.replay = []

    def origins(self) -> list[tuple[Any, LoopOrigin] | None]:
        """How each iterator the window saw was made, while it lives (None: gone, or one that
        resumes otherwise: a loader that keeps its iterator)."""
        found: list[tuple[Any, LoopOrigin] | None] = []
        for ref in self.made:
            iterator = ref()
            origin: _Origin | None = getattr(iterator, "_ecrl_origin", None)
            loader = origin.loader if origin is not None else None
            if origin is None or loader is None or origin.from_loaded_state \
                    or _keeps_its_iterator(loader):
                found.append(None)
            else:
                found.append((_identity(loader), (origin.created, origin.first_draw,
                                                  origin.last_draw)))
        return found

    def replayed(self, iterator: Any, saved: LoopOrigin | None, before: tuple[Any, Any]
                 ) -> None:
        """``iterator`` was just made again under the generator states it was made under."""
        if saved is None:
            return
        first_draw = saved[1]
        loader = iterator._ecrl_origin.loader
        made = weakref.ref(iterator)  # the iterator holds what is called at its first draw
        swapped: list[tuple[Any, Any]] = []

        def before_first() -> None:
            if first_draw is not None:
                _set_generator_states(loader, first_draw[1])
            current: Any = made()
            fetcher = getattr(current, "_dataset_fetcher", None)  # made after the base class
            if fetcher is not None and current._num_workers == 0:
                real = fetcher.dataset
                # not copyable (an open file, a lock): loaded from itself, as before
                with contextlib.suppress(Exception):
                    fetcher.dataset = _copy_sharing_arrays(real)
                    swapped.append((fetcher, real))

        sampler_iter = getattr(iterator, "_sampler_iter", None)
        if isinstance(sampler_iter, _FirstDraw) and iterator._ecrl_origin.first_draw is None:
            sampler_iter.before_first = before_first

        def settle() -> None:
            _set_generator_states(loader, before[1])
            for fetcher, real in swapped:
                fetcher.dataset = real

        self.settles.append(settle)


def _identity(loader: Any) -> tuple[str, int | None, list[str]]:
    """What tells a loop's loaders apart when they are made again: the loader's class, its
    dataset's length and the kinds of its generators."""
    dataset = getattr(loader, "dataset", None)
    try:
        size: int | None = len(dataset)  # type: ignore[arg-type]
    except TypeError:
        size = None
    return (type(loader).__qualname__, size, [type(g).__qualname__ for g in _generators(loader)])


def _observe_loader_iterators(module: Any) -> None:
    base = module._BaseDataLoaderIter

    @wrapt.patch_function_wrapper(base, "__init__")
    def _init(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> Any:
        loader = args[0] if args else kwargs["loader"]
        window = LoopWindow.current
        made_again = window.replay.pop(0) if window is not None and window.replay else None
        replay, before = None, None
        if made_again is not None:
            identity, replay = made_again
            if identity != _identity(loader):
                # the loop makes its loaders in another order than when it was saved: a saved
                # origin applied to another loader would resume it wrong
                raise CheckpointError(
                    "cannot resume: a loop makes its DataLoader iterators in another order (or "
                    "others) than when it was saved, so where each order came from is unknown; "
                    "make the loaders before the loop, or remove the resume state to start over")
            before = _random_states(loader)
            _set_generator_states(loader, replay[0][1])
        origin = _Origin(loader, _random_states(loader))
        instance._ecrl_origin = origin
        result = wrapped(*args, **kwargs)
        _wrap_sampler(instance)
        if window is not None:
            window.made.append(weakref.ref(instance))
            if replay is not None and before is not None:
                window.replayed(instance, replay, before)
        return result

    @wrapt.patch_function_wrapper(base, "_reset")
    def _reset(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
               ) -> Any:
        # The base _reset makes a fresh sampler iterator; a subclass's _reset (the
        # multi-process iterator's, called by its __init__) calls it and then prefetches:
        # wrapping here comes before anything draws from it.
        result = wrapped(*args, **kwargs)
        _wrap_sampler(instance)
        return result


def _wrap_sampler(iterator: Any) -> None:
    origin = getattr(iterator, "_ecrl_origin", None)
    current = getattr(iterator, "_sampler_iter", None)
    if origin is not None and current is not None and not isinstance(current, _FirstDraw):
        iterator._sampler_iter = _FirstDraw(current, origin)


def _generators(loader: Any) -> list[Any]:
    """The random generators a loader's order can draw from: torch generators of the loader and
    of its samplers, and any random generator a sampler keeps in an attribute (a sampler of the
    program's own with a ``random.Random``, a NumPy generator or a torch generator)."""
    torch = sys.modules["torch"]
    np = sys.modules.get("numpy")
    kinds: tuple[type, ...] = (torch.Generator, random.Random)
    if np is not None:
        kinds += (np.random.Generator, np.random.RandomState)
    found: list[Any] = []

    def add(value: Any) -> None:
        if isinstance(value, kinds) and all(g is not value for g in found):
            found.append(value)

    batch_sampler = getattr(loader, "batch_sampler", None)
    add(getattr(loader, "generator", None))
    for holder in (getattr(loader, "sampler", None), batch_sampler,
                   getattr(batch_sampler, "sampler", None)):
        add(getattr(holder, "generator", None))
        for name in sorted(getattr(holder, "__dict__", {})):
            add(vars(holder)[name])
    return found


def _generator_state(generator: Any) -> Any:
    if isinstance(generator, random.Random):
        return generator.getstate()
    if hasattr(generator, "bit_generator"):  # numpy's Generator
        return generator.bit_generator.state
    return generator.get_state()  # torch's Generator, numpy's RandomState


def _set_generator_state(generator: Any, state: Any) -> None:
    if isinstance(generator, random.Random):
        generator.setstate(state)
    elif hasattr(generator, "bit_generator"):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


def _random_states(loader: Any) -> tuple[Any, Any]:
    return rng_state(), [_generator_state(g) for g in _generators(loader)]


def _set_random_states(loader: Any, states: tuple[Any, Any]) -> None:
    global_state, generator_states = states
    set_rng_state(global_state)
    _set_generator_states(loader, generator_states)


def _set_generator_states(loader: Any, generator_states: list[Any]) -> None:
    for generator, state in zip(_generators(loader), generator_states, strict=True):
        _set_generator_state(generator, state)


def _recipe(iterator: Any) -> tuple[Any, tuple[Any, Any], tuple[Any, Any] | None, int]:
    """What re-creates ``iterator``: its loader, the random states its order was drawn from, the
    batches it gave. Refused, in one line, where that would not give the same iterator."""
    origin: _Origin | None = getattr(iterator, "_ecrl_origin", None)
    if origin is None:
        raise pickle.PicklingError(
            "it is a DataLoader iterator created before the transformed program's runtime was "
            "loaded, so where its order came from is unknown; create it in the program")
    if getattr(iterator, "_persistent_workers", False):
        raise pickle.PicklingError(
            "it is the iterator of a DataLoader with persistent_workers=True, whose workers' "
            "random streams carry over from epoch to epoch and cannot be re-created at this "
            "position; use persistent_workers=False, or create the iterator after the "
            "checkpoint")
    if origin.from_loaded_state:
        raise pickle.PicklingError(
            "it is (or holds) the iterator of a StatefulDataLoader that the program resumed "
            "from a state_dict of its own (load_state_dict), so its position is not the "
            "loader's start plus the batches it gave; let the transformed program's "
            "checkpoints resume it, or create the iterator after the checkpoint")
    loader = origin.loader
    if loader is None:
        raise pickle.PicklingError(
            "it is the iterator of a DataLoader the program no longer holds (a loader with an "
            "__iter__ of its own may keep its iterator, so the runtime holds it only weakly); "
            "keep the loader in a variable while its iterator is used")
    return loader, origin.created, origin.first_draw, iterator._num_yielded


LoopOrigin = tuple[tuple[Any, Any], tuple[Any, Any] | None, dict[str, Any] | None]
"""How a loop's DataLoader iterator was made and where it stands: the random states at its
creation and at its sampler's first draw, and the global one as its latest batch was loaded."""


def loop_iterator(iterable: Any, iterator: Any) -> Any:
    """The DataLoader iterator a ``for`` loop over ``iterable`` (a loader, or ``enumerate`` of
    one) draws from, marked to be re-created on resume (:func:`resumed_loop`); None for any
    other iterable, and for a loader that keeps its iterator (``StatefulDataLoader``, persistent
    workers), which resumes through its own state."""
    inner = enumerated(iterable)[0] if type(iterable) is enumerate else iterator
    origin: _Origin | None = getattr(inner, "_ecrl_origin", None)
    if origin is None or origin.from_loaded_state:
        return None
    loader = origin.loader
    if loader is None or _keeps_its_iterator(loader):
        return None
    # without workers the resume loads the saved iteration's batch again, under the global
    # random state it was loaded under (with workers, the workers' streams are replayed)
    origin.tracked = _skips_without_loading(inner)
    return inner


def enumerated(iterable: enumerate[Any]) -> tuple[Any, int]:
    """The iterator an ``enumerate`` draws from, and its next count."""
    reduced: Any = iterable.__reduce__()
    inner, count = reduced[1]
    return inner, int(count)


def bar_loader(iterable: Any) -> Any:
    """The DataLoader a ``tqdm`` progress bar iterates, or None."""
    if not type(iterable).__module__.startswith("tqdm"):
        return None
    inner = getattr(iterable, "iterable", None)
    loader_module = sys.modules.get(_LOADER_MODULE)
    if loader_module is None or not isinstance(inner, loader_module.DataLoader):
        return None
    return inner


class LoaderInBar:
    """Stands in a progress bar for its loader until the bar starts iterating (it reads its
    ``iterable`` at its first item), then gives the bar the loader back: iterating it gives
    ``items`` (a resume's) or the loader's iterator, shown to ``seen``."""

    def __init__(self, bar: Any, loader: Any, *, items: Iterator[Any] | None = None,
                 seen: Callable[[Any], None] | None = None) -> None:
        self.bar = bar
        self.loader = loader
        self.items = items
        self.seen = seen
        bar.iterable = self

    def __iter__(self) -> Iterator[Any]:
        self.bar.iterable = self.loader
        if self.items is not None:
            return self.items
        iterator = iter(self.loader)
        if self.seen is not None:
            self.seen(iterator)
        return iterator

    def __len__(self) -> int:
        return len(self.loader)


def loop_origin(iterator: Any) -> LoopOrigin | None:
    """What re-creates a tracked loop iterator (:func:`loop_iterator`) at a save."""
    origin: _Origin = iterator._ecrl_origin
    return origin.created, origin.first_draw, origin.last_draw


def resumed_loop(iterable: Any, saved: LoopOrigin, position: int
                 ) -> tuple[Any, Any, Callable[[], None]] | None:
    """A ``for`` loop's iterable for its resume at ``position``, the DataLoader iterator inside
    it (tracked again), and what to call once the resume reaches its checkpoint (the loader's
    generators put back to their states of the save: a worker iterator's prefetching draws
    from them while the walk runs); None when ``iterable`` is not a loader (or ``enumerate``
    of one) whose iterator it re-creates.

    The loop resumes by walking through the saved iteration again. Iterating the restored
    loader for that would be wrong twice over: its own generators are at their states of the
    save, after the epoch's draws, so it would shuffle anew; and loading the batches passed
    over would advance what the restored dataset draws from (its own random generator, say).
    Instead the iterator is re-created from the saved random states. Without workers its sampler
    alone is advanced (as for a saved iterator), and the saved iteration's batch loaded again
    under the global random state it was loaded under, from a copy of the dataset: the dataset
    goes on from its state at the save. With workers the batches passed over are loaded and
    dropped: the dataset they come from is the workers' copy, whose random streams must
    advance. (A dataset that draws from random state of its own gives that
    batch as it would be loaded after the save; the walk reads it only where an inner loop or a
    ``with`` on the way to the checkpoint is made from it.) An ``enumerate`` made before the
    loop began drew its loader's iterator already: that one is dropped, the states before it
    are put back, and the ``enumerate`` is made again, counting from the saved position."""
    base = sys.modules[_LOADER_MODULE].DataLoader
    count = 0
    if type(iterable) is enumerate:
        premature, count = enumerated(iterable)
        origin: _Origin | None = getattr(premature, "_ecrl_origin", None)
        if origin is None or origin.loader is None:
            return None
        loader, before = origin.loader, origin.created
        shutdown = getattr(premature, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
    else:
        loader, before = iterable, None
    if not isinstance(loader, base) or _keeps_its_iterator(loader):
        return None
    if before is None:
        before = _random_states(loader)
    created, first_draw, last_draw = saved
    walked: list[Any] = []
    iterator = _recreated(loader, created, first_draw, position, walked=walked,
                          walk_draws=last_draw, before=before)
    iterator._ecrl_origin.tracked = _skips_without_loading(iterator)
    iterator._ecrl_origin.last_draw = last_draw
    items = itertools.chain(walked, iterator)
    settled = before

    def settle() -> None:
        _set_random_states(loader, settled)

    if type(iterable) is enumerate:
        return enumerate(items, count + position), iterator, settle
    return items, iterator, settle


def _skips_without_loading(iterator: Any) -> bool:
    """Whether ``iterator`` passes over batches by drawing their indices only (no workers, a
    map-style dataset)."""
    dataset_kind = sys.modules[_LOADER_MODULE]._DatasetKind
    return bool(iterator._num_workers == 0 and iterator._dataset_kind == dataset_kind.Map)


def _loaded_aside(iterator: Any, draws: dict[str, Any] | None) -> Any:
    """The iterator's next batch, loaded from a copy of its dataset (the dataset itself when it
    cannot be copied) under the global random state ``draws``: what loading it does to the
    dataset's own state is not kept."""
    index = iterator._next_index()
    if draws is not None:
        set_rng_state(draws)
    fetcher = iterator._dataset_fetcher
    dataset = fetcher.dataset
    # not copyable (an open file, a lock): loaded from itself, as a plain fast-forward would
    with contextlib.suppress(Exception):
        fetcher.dataset = _copy_sharing_arrays(dataset)
    try:
        data = fetcher.fetch(index)
    finally:
        fetcher.dataset = dataset
    iterator._num_yielded += 1
    if iterator._pin_memory:
        pin = sys.modules["torch.utils.data._utils.pin_memory"]
        data = pin.pin_memory(data, iterator._pin_memory_device)
    return data


def _copy_sharing_arrays(obj: Any) -> Any:
    """A copy of ``obj`` whose NumPy arrays and torch tensors are the original's: a data set
    held in memory is not copied (loading a batch reads its arrays; what it changes is the
    state of its Python objects, such as a random generator)."""
    kinds = tuple(kind for kind in (getattr(sys.modules.get("numpy"), "ndarray", None),
                                    getattr(sys.modules.get("torch"), "Tensor", None))
                  if kind is not None)
    shared: list[Any] = []

    class Sharing(cloudpickle.Pickler):
        def persistent_id(self, value: Any) -> int | None:
            if isinstance(value, kinds):
                shared.append(value)
                return len(shared) - 1
            return None

    class Sharer(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return shared[pid]

    buffer = io.BytesIO()
    Sharing(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    buffer.seek(0)
    return Sharer(buffer).load()


def _reduce_loader_iterator(iterator: Any) -> Any:
    loader, created, first_draw, yielded = _recipe(iterator)
    if _is_stateful(loader) and getattr(loader, "_iterator", None) is iterator:
        return _kept_iterator, (loader,)  # re-created with its loader
    return _loader_iterator, (loader, created, first_draw, yielded)


def _is_stateful(loader: Any) -> bool:
    """Whether ``loader`` is a StatefulDataLoader, a subclass of the program's own included."""
    stateful = sys.modules.get(_STATEFUL_LOADER_MODULE)
    return stateful is not None and isinstance(loader, stateful.StatefulDataLoader)


def _kept_iterator(loader: Any) -> Any:
    return loader._iterator


def _reduce_stateful_loader(loader: Any) -> Any:
    """A StatefulDataLoader as pickle would save it, with the iterator it keeps saved as its
    re-creation, made once the rest of the loader is back: its own ``state_dict`` after a resume
    is then what it was at the save, whether or not the program holds that iterator."""
    func, args, state, *rest = loader.__reduce_ex__(2)
    kept = state.get("_iterator") if isinstance(state, dict) else None
    if kept is None:
        return (func, args, state, *rest)
    _, *recipe = _recipe(kept)
    listitems, dictitems = (*rest, None, None)[:2]
    return (func, args, ({**state, "_iterator": None}, tuple(recipe), bool(kept._finished)),
            listitems, dictitems, _set_stateful_loader_state)


def _set_stateful_loader_state(loader: Any, state: tuple[dict[str, Any], tuple[Any, ...], bool]
                               ) -> None:
    attributes, recipe, finished = state
    loader.__dict__.update(attributes)
    initial = attributes.get("_initial_iter_for_state_dict", False)
    loader._initial_iter_for_state_dict = False  # its __iter__ would expect the kept iterator
    kept = _recreated(loader, *recipe)
    kept._finished = finished
    loader._iterator = kept
    loader._initial_iter_for_state_dict = initial


def _loader_iterator(loader: Any, created: tuple[Any, Any], first_draw: tuple[Any, Any] | None,
                     yielded: int) -> Any:
    """The loader's iterator re-created as the saved one was, advanced by ``yielded`` batches;
    a loader that keeps its iterator keeps the one it had."""
    kept = getattr(loader, "_iterator", None)
    iterator = _recreated(loader, created, first_draw, yielded)
    if hasattr(loader, "_iterator"):
        loader._iterator = kept
    return iterator


def _recreated(loader: Any, created: tuple[Any, Any], first_draw: tuple[Any, Any] | None,
               yielded: int, *, walked: list[Any] | None = None,
               walk_draws: dict[str, Any] | None = None,
               before: tuple[Any, Any] | None = None) -> Any:
    """``iter(loader)`` as the saved iterator was made, advanced by ``yielded`` batches; the
    random states left as they were before (or as ``before`` says: the resume sets its own).
    With ``walked`` (a loop's resume, :func:`resumed_loop`) and no workers, the next batch is
    also taken, loaded aside under the global random state ``walk_draws``, and appended to it."""
    install()
    if before is None:
        before = _random_states(loader)
    try:
        _set_random_states(loader, created)
        iterator = iter(loader)
        origin: _Origin = iterator._ecrl_origin
        if origin.first_draw is None and first_draw is not None:
            _set_random_states(loader, first_draw)
        if _skips_without_loading(iterator):
            for _ in range(yielded):
                iterator._next_index()
            iterator._num_yielded = yielded
            if walked is not None:
                walked.append(_loaded_aside(iterator, walk_draws))
        else:
            for _ in range(yielded):
                next(iterator)
    except StopIteration:
        raise CheckpointError(f"cannot resume: a DataLoader iterator saved after {yielded} "
                              "batches ends sooner when re-created; its dataset or sampler "
                              "must give the same batches on every run") from None
    finally:
        _set_random_states(loader, before)
    return iterator


# --------------------------------------------------------------------------- summary writers


def _event_files(log_dir: Path) -> dict[str, int]:
    if not log_dir.is_dir():
        return {}
    return {str(p.relative_to(log_dir)): p.stat().st_size
            for p in log_dir.rglob(f"{_EVENTS_PREFIX}*") if p.is_file()}


def _reduce_summary_writer(writer: Any) -> Any:
    writer.flush()
    log_dir = Path(writer.log_dir).resolve()
    files = _event_files(log_dir)  # flushed: these sizes are final
    for name in files:
        _fsync(log_dir / name)
    return _summary_writer, (type(writer), str(log_dir), files,
                             writer.max_queue, writer.flush_secs, writer.filename_suffix)


def _summary_writer(cls: Any, log_dir: str, files: dict[str, int], max_queue: int,
                    flush_secs: int, filename_suffix: str) -> Any:
    """The writer re-opened on its directory once the events logged after the save are gone."""
    directory = Path(log_dir)
    present = _event_files(directory)
    for name, size in present.items():
        path = directory / name
        if name not in files:
            path.unlink()  # written after the checkpoint, by the attempt that was killed
        elif size < files[name]:
            raise CheckpointError(f"cannot resume: the event file {path} is shorter than at "
                                  "the checkpoint; the events logged before it are lost")
        elif size > files[name]:
            os.truncate(path, files[name])
    missing = sorted(set(files) - set(present))  # what was unlinked was never in files
    if missing:
        raise CheckpointError(f"cannot resume: the event file {directory / missing[0]} of a "
                              "SummaryWriter saved at the checkpoint is gone")
    return cls(log_dir=log_dir, max_queue=max_queue, flush_secs=flush_secs,
               filename_suffix=filename_suffix)


# --------------------------------------------------------------------------- open files


_STREAMS = ("stdin", "stdout", "stderr")


def _reduce_file(f: Any) -> Any:
    for stream in _STREAMS:
        if f is getattr(sys, stream) or f is getattr(sys, f"__{stream}__"):
            return _standard_stream, (stream,)
    if not isinstance(f, io.TextIOWrapper | io.BufferedReader | io.BufferedWriter
                      | io.BufferedRandom | io.FileIO):
        return NotImplemented  # an in-memory stream (BytesIO, StringIO) pickles as a value
    name = getattr(f, "name", None)
    if not isinstance(name, str):
        raise pickle.PicklingError("it is a file opened from a descriptor, not a path, which "
                                   "a resumed program cannot re-open")
    if f.closed:
        return _closed_file, (isinstance(f, io.TextIOWrapper),)
    mode = f.mode
    writes = any(c in mode for c in "wax+")
    if writes:
        f.flush()
        os.fsync(f.fileno())
    # A text file comes back with its encoding and errors; its newline argument is not
    # readable from the object, so it comes back with the default (docs/transform.md).
    options: dict[str, Any] = {"encoding": f.encoding, "errors": f.errors} \
        if isinstance(f, io.TextIOWrapper) else {"buffering": 0} if isinstance(f, io.FileIO) \
        else {}
    return _open_file, (os.path.abspath(name), mode, f.tell(), os.fstat(f.fileno()).st_size,
                        writes, options)


def _open_file(path: str, mode: str, position: int, size: int, writes: bool,
               options: dict[str, Any]) -> Any:
    """The file re-opened at the saved position; a file being written cut back to its size at
    the save first."""
    if writes:
        if not os.path.isfile(path):
            raise CheckpointError(f"cannot resume: the file {path}, open for writing at the "
                                  "checkpoint, is gone")
        if os.path.getsize(path) < size:
            raise CheckpointError(f"cannot resume: the file {path} is shorter than at the "
                                  "checkpoint; what was written before it is lost")
        os.truncate(path, size)
    binary = "b" in mode
    if "a" in mode:
        reopen = mode
    elif writes:  # w, x, r+: keep the content, write from the saved position
        reopen = "r+b" if binary else "r+"
    else:
        reopen = mode
    try:
        f = open(path, reopen, **options)  # noqa: SIM115 - the program owns the file from here
    except OSError as exc:
        raise CheckpointError(f"cannot resume: the file {path}, open at the checkpoint, "
                              f"cannot be re-opened ({exc.strerror})") from None
    if "a" not in mode:
        f.seek(position)
    return f


def _closed_file(text: bool) -> Any:
    """A closed file stays closed (its name is not kept: nothing can be done with it)."""
    f = open(os.devnull, "r" if text else "rb")  # noqa: SIM115
    f.close()
    return f


def _standard_stream(name: str) -> Any:
    return getattr(sys, name)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
