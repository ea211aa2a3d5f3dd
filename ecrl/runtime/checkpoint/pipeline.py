"""Pipelined snapshots: the bulk of a checkpoint image is copied under the next step's compute.

At a step boundary the only state the next forward and backward pass may change in place is the
model's buffers (BatchNorm's running statistics and counters), the RNG streams and small Python
objects (scheduler, sampler). Parameters and optimizer state change only in the next
``optimizer.step()``. So (CheckFreq's idea, seed ``002_…``'s survey) the boundary copies the
header and every other tensor into the image synchronously and hands the optimizer-driven tensors
to a background thread, which copies them while the next step's forward and backward run
(``Tensor.copy_`` releases the GIL). An optimizer step pre-hook on every optimizer of the
checkpointed state blocks the next update until the copy is complete.

Exactness guard: each deferred tensor's version counter (``Tensor._version``, bumped by every
in-place operation on the tensor or a view of it) is recorded at the boundary and compared once
the copy is complete, before the update. An unchanged counter means nothing wrote to the tensor
since the boundary, so the bytes copied are the boundary's. A changed counter (a user's clamp, an
EMA or a second optimizer wrote to it before the copy finished) means the copy may hold a mix of
two states: that checkpoint is dropped (never handed to the writer) with a one-line warning, and
the owner takes a synchronous checkpoint at the next boundary instead. Writes through ``.data``
or ``set_`` bypass version counters (torch gives ``.data`` a counter of its own): such writes
between a boundary and the next ``optimizer.step()`` are not detected, which ``docs/strategies.md``
says.

Tensors on a CUDA device are copied on a side stream that first waits for the work queued on the
training stream at the boundary (an event), so the copy sees the completed update.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import torch

from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint import statepack
from ecrl.runtime.checkpoint.dtensor import is_dtensor

__all__ = ["Deferred", "SnapshotPipeline", "optimizer_storages", "split_deferred",
           "stepping_optimizer", "storage_key", "tensor_path", "warn"]


def storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    """Identifies a tensor's storage (views and ``detach()``-ed copies share it); a DTensor's is
    its local shard's (FSDP2's parameters and their optimizer state)."""
    if is_dtensor(tensor):
        # The local shard itself (``to_local()`` is an autograd call, 20 times slower: this runs
        # for every tensor of the state at every checkpoint).
        tensor = tensor._local_tensor  # type: ignore[attr-defined]
    return (tensor.device.type, tensor.untyped_storage().data_ptr())


def stepping_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The optimizer whose ``step()`` runs step hooks: ``optimizer`` itself, or, for a wrapper
    that subclasses torch's ``Optimizer`` without running its constructor and forwards
    ``step()`` to the optimizer it holds as ``.optimizer`` (Accelerate's
    ``AcceleratedOptimizer``, which the transformers ``Trainer`` uses too), the one it wraps —
    such a wrapper has no hook registry of its own."""
    current = optimizer
    for _ in range(8):  # wrappers of wrappers, never a cycle
        if hasattr(current, "_optimizer_step_pre_hooks"):
            return current
        inner = getattr(current, "optimizer", None)
        if not isinstance(inner, torch.optim.Optimizer) or inner is current:
            break
        current = inner
    raise ConfigError(
        f"the optimizer {type(optimizer).__qualname__} subclasses torch.optim.Optimizer without "
        "running its constructor and wraps no optimizer (as .optimizer) that did, so its updates "
        "cannot be watched; pass the optimizer it wraps to the Checkpointer, or use "
        "--strategy blocking")


def optimizer_storages(optimizers: Iterable[torch.optim.Optimizer]) -> set[tuple[str, int]]:
    """The storages only an optimizer step writes to: its parameters and its per-parameter
    state (momentum, Adam's moments and step counts)."""
    keys: set[tuple[str, int]] = set()
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            for param in group["params"]:
                keys.add(storage_key(param))
        for state in optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    keys.add(storage_key(value))
    return keys


def split_deferred(state: statepack.EncodedState,
                   storages: set[tuple[str, int]]) -> tuple[list[int], list[int]]:
    """Indices of ``state``'s tensors to copy now and those whose copy may be deferred."""
    now: list[int] = []
    later: list[int] = []
    for index, tensor in enumerate(state.tensors):
        deferrable = isinstance(tensor, torch.Tensor) and tensor.numel() > 0 and \
            storage_key(tensor) in storages
        (later if deferrable else now).append(index)
    return now, later


def _copy_deferred(copy: Callable[[], None], stream: Any, ready: Any) -> float:
    """Run the deferred copy (the background thread); returns its seconds."""
    t0 = time.perf_counter()
    if stream is None:
        copy()
    else:
        with torch.cuda.stream(stream):
            stream.wait_event(ready)
            copy()
        stream.synchronize()
    return time.perf_counter() - t0


@dataclass(slots=True)
class Deferred:
    """A checkpoint whose copy is being completed in the background."""

    step: int
    sources: list[torch.Tensor]
    """The deferred tensors (live: parameters, optimizer state)."""
    versions: list[int]
    """Their version counters at the boundary."""
    future: Future[float]
    boundary_s: float = 0.0
    """Training-thread seconds of the boundary (set by the owner once its boundary ended)."""
    context: dict[str, Any] = field(default_factory=dict)
    """Whatever the owner needs to hand the finished copy on (slot, timings, names)."""

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.sources)


class SnapshotPipeline:
    """Defers the copy of optimizer-driven tensors to a background thread, one checkpoint at a
    time; :meth:`settle` (also run by an optimizer step pre-hook) completes it.

    ``on_ready(deferred, wait_s)`` is called on the training thread with a checkpoint whose copy
    is complete and exact; ``on_torn(deferred, changed)`` with one that must be dropped
    (``changed``: positions in ``deferred.sources`` written to since the boundary)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], *,
                 on_ready: Callable[[Deferred, float], None],
                 on_torn: Callable[[Deferred, list[int]], None]) -> None:
        self._optimizers = [stepping_optimizer(o) for o in optimizers]
        self._on_ready = on_ready
        self._on_torn = on_torn
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ecrl-snapshot")
        self._pending: Deferred | None = None
        self._lock = threading.Lock()
        self._stream: Any = None
        self._handles = [o.register_step_pre_hook(self._before_update) for o in self._optimizers]
        self._storages: tuple[list[int], set[tuple[str, int]]] | None = None
        """The ids the optimizers' tensors had and their storages (:meth:`storages`)."""

    @property
    def usable(self) -> bool:
        """Only a state with an optimizer in it has tensors whose copy can wait."""
        return bool(self._optimizers)

    @property
    def pending(self) -> Deferred | None:
        return self._pending

    def storages(self) -> set[tuple[str, int]]:
        """:func:`optimizer_storages`, kept while the optimizers hold the same tensor objects
        (their ids, about 20 times cheaper to read than their storages). A tensor given other
        memory in place (``.data =``) can leave the set stale: a copy is then deferred that
        need not be (the version guard drops the checkpoint if it was written to) or made now
        that could have waited — never a wrong copy."""
        held = [id(t) for o in self._optimizers for g in o.param_groups for t in g["params"]]
        held += [id(v) for o in self._optimizers for state in o.state.values()
                 for v in state.values()]
        if self._storages is None or self._storages[0] != held:
            self._storages = (held, optimizer_storages(self._optimizers))
        return self._storages[1]

    def start(self, step: int, sources: Sequence[torch.Tensor], copy: Callable[[], None],
              context: dict[str, Any]) -> Deferred:
        """Run ``copy`` (which copies ``sources`` somewhere) on the background thread; the
        owner has copied everything else already."""
        assert self._pending is None, "settle() the previous checkpoint first"
        versions = [int(t._version) for t in sources]
        stream = ready = None
        if any(t.is_cuda for t in sources):
            if self._stream is None:
                self._stream = torch.cuda.Stream()
            stream = self._stream
            ready = torch.cuda.Event()
            ready.record()  # the training stream's work up to the boundary (the update)
        future = self._pool.submit(_copy_deferred, copy, stream, ready)
        deferred = Deferred(step=step, sources=list(sources), versions=versions, future=future,
                            context=context)
        self._pending = deferred
        return deferred

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.settle()

    def settle(self) -> None:
        """Wait for the pending copy, check it, and hand it on (or drop it). Training thread."""
        with self._lock:
            deferred, self._pending = self._pending, None
        if deferred is None:
            return
        t0 = time.perf_counter()
        deferred.future.result()  # a failed copy is raised here, on the training thread
        wait_s = time.perf_counter() - t0
        changed = [i for i, (t, v) in enumerate(zip(deferred.sources, deferred.versions,
                                                    strict=True)) if int(t._version) != v]
        if changed:
            self._on_torn(deferred, changed)
        else:
            self._on_ready(deferred, wait_s)

    def close(self) -> None:
        try:
            self.settle()
        finally:
            for handle in self._handles:
                handle.remove()
            self._handles = []
            self._pool.shutdown(wait=True)


def warn(line: str) -> None:
    print(f"ecrl: warning: {line}", file=sys.stderr, flush=True)


def tensor_path(tree: Any, index: int) -> str:
    """Where tensor ``index`` sits in an encoded tree (``model.layer1.weight``), for messages."""
    found: list[str] = []

    def walk(value: Any, where: str) -> bool:
        if isinstance(value, dict):
            if len(value) == 1:
                (tag, inner), = value.items()
                if tag in ("$tensor", "$ndarray"):
                    if inner == index:
                        found.append(where)
                        return True
                    return False
                if tag in ("$tuple",):
                    return any(walk(v, f"{where}[{i}]") for i, v in enumerate(inner))
                if tag == "$dict":
                    return any(walk(v, f"{where}[{k!r}]") for k, v in inner)
            return any(walk(v, f"{where}.{k}" if where else str(k)) for k, v in value.items())
        if isinstance(value, list):
            return any(walk(v, f"{where}[{i}]") for i, v in enumerate(value))
        return False

    walk(tree, "")
    return found[0] if found else f"tensor {index}"

