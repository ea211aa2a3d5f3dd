"""FSDP2 and DTensor state in ECRL's checkpoints: saved whole, loaded and resharded at any mesh.

A module sharded with ``fully_shard`` (or tensor parallelism) holds DTensor parameters: its
``state_dict()`` is this rank's shards only, and its optimizer's state is sharded the same way.
Saving that from rank 0 (the ``blocking`` and ``overlapped`` writers) would keep a quarter of a
model at DP 4. So the checkpointer takes such entries through
``torch.distributed.checkpoint.state_dict``: at a checkpoint boundary every rank gathers the full
model and optimizer state (``get_model_state_dict`` / ``get_optimizer_state_dict`` with
``full_state_dict``: one collective, before the strategy's capture, which runs on rank 0 only for
the single-file strategies), the strategy saves it like any state, and a resume hands the loaded
full state to ``set_model_state_dict`` / ``set_optimizer_state_dict``, which cut it for the mesh
the resumed attempt runs on — another data-parallel degree included. The commit protocol,
checksums, fallback and digests are the strategies' own, unchanged.

That is the form for the single-file strategies (the approach most scripts use): its cost is
one full copy of the state per checkpoint, gathered over the network and written by rank 0. The
sharded strategies (``sharded``, ``sharded-async``) write the shards where they live instead:
the boundary takes each rank's own shards (``full_state_dict=False``: no collective, no copy),
:class:`ShardLayout` stands each DTensor in the state tree by a ``$sharded`` node whose pieces are
the ranks' local boxes (one small ``all_gather_object`` of their offsets and sizes at the first
checkpoint and whenever the geometries change; a box that several ranks hold, as HSDP's replica
groups do, is written once, by the lowest of them), and every rank writes its own pieces into its
part of the checkpoint. Loading tiles the pieces back into whole tensors
(:func:`ecrl.runtime.checkpoint.statepack.rebuild`, which refuses pieces that overlap, leave a gap
or run outside the tensor), handed to ``set_*_state_dict`` as above, so a resume at another mesh
reshards the same way. A DTensor whose shards are not one box of the whole (a dimension sharded
twice, FSDP over tensor parallelism: ``_StridedShard``) is gathered whole (``full_tensor``) and
saved like any tensor.

``jit`` is refused: a rescue copies the live state of a survivor, and no rank of an FSDP mesh
holds a full replica to copy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from ecrl.contract.errors import ConfigError
from ecrl.runtime.checkpoint.statepack import SHARDED, dtype_name

__all__ = ["FullStates", "LayoutCache", "ShardLayout", "is_dtensor", "is_sharded_module",
           "is_sharded_optimizer"]


@functools.cache
def _dtensor() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without distributed tensors
        return None
    return DTensor


def is_dtensor(obj: Any) -> bool:
    """Whether ``obj`` is a DTensor (without importing distributed tensors where torch has
    none)."""
    kind = _dtensor()
    return kind is not None and isinstance(obj, kind)


def is_sharded_module(obj: Any) -> bool:
    """Whether ``obj`` is a module with DTensor parameters (FSDP2, tensor parallelism)."""
    kind = _dtensor()
    return kind is not None and isinstance(obj, nn.Module) and any(
        isinstance(p, kind) for p in obj.parameters())


def is_sharded_optimizer(obj: Any) -> bool:
    """Whether ``obj`` is an optimizer over DTensor parameters."""
    kind = _dtensor()
    return kind is not None and isinstance(obj, torch.optim.Optimizer) and any(
        isinstance(p, kind) for group in obj.param_groups for p in group["params"])


class FullStates:
    """The sharded entries of a checkpointer's state, gathered whole at each boundary.

    ``state``: the checkpointer's name → object map, with DDP wrappers already removed.
    """

    def __init__(self, state: Mapping[str, Any]) -> None:
        self.modules = {k: o for k, o in state.items() if is_sharded_module(o)}
        self.optimizers: dict[str, tuple[torch.optim.Optimizer, nn.Module]] = {}
        for key, obj in state.items():
            if not is_sharded_optimizer(obj):
                continue
            params = {id(p) for group in obj.param_groups for p in group["params"]}
            owner = next((m for m in self.modules.values()
                          if any(id(p) in params for p in m.parameters())), None)
            if owner is None:
                raise ConfigError(
                    f"Checkpointer: {key!r} optimizes sharded (DTensor) parameters, but no "
                    "module in the checkpointed state holds them: checkpoint the model too")
            self.optimizers[key] = (obj, owner)
        self._stash: dict[str, Any] = {}
        self._translations: dict[str, Callable[[Any], Any]] = {}

    def __bool__(self) -> bool:
        return bool(self.modules or self.optimizers)

    def __contains__(self, key: object) -> bool:
        return key in self.modules or key in self.optimizers

    def gather(self, *, full: bool = True) -> None:
        """Gather every sharded entry's full state on every rank (a collective: all ranks call
        it at the same boundary); ``full=False``: take each rank's own shards as DTensors (for
        the sharded strategies, which write them where they are)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=full, cpu_offload=False)
        for key, module in self.modules.items():
            if full:
                self._stash[key] = get_model_state_dict(module, options=options)
            else:
                self._stash[key] = self._shards(
                    key, functools.partial(get_model_state_dict, module, options=options),
                    functools.partial(module.state_dict, keep_vars=True))
        for key, (optimizer, module) in self.optimizers.items():
            if full:
                self._stash[key] = get_optimizer_state_dict(module, optimizer, options=options)
            else:
                self._stash[key] = self._shards(
                    key, functools.partial(get_optimizer_state_dict, module, optimizer,
                                           options=options), optimizer.state_dict)

    def _shards(self, key: str, reference: Callable[[], Any], plain: Callable[[], Any]) -> Any:
        """This rank's shards of ``key``'s state, as ``reference()`` (torch's
        ``get_*_state_dict``) gives them, from ``plain()`` (the object's own ``state_dict``)
        where that is proved the same.

        torch's functions cost about 19 ms per checkpoint for ResNet-50 (name translation and
        checks, in the training's stall); the object's own ``state_dict`` about 2 ms. The first
        call runs both and learns how the plain state maps onto torch's (the same keys for a
        model; parameter indices to names for an optimizer); only when the mapped plain state
        holds exactly torch's values — the same tensors' storages, the same other values —
        do later calls map the plain state instead. Anything else keeps torch's functions."""
        translate = self._translations.get(key)
        if translate is not None:
            return translate(plain())
        wanted = reference()
        translate = _learn_translation(plain(), wanted)
        if translate is None:
            def translate(_plain: Any) -> Any:
                return reference()
        self._translations[key] = translate
        return wanted

    def state_dict(self, key: str) -> Any:
        """The full state of ``key`` as last gathered."""
        if key not in self._stash:
            raise RuntimeError(f"the sharded state of {key!r} was not gathered before its "
                               "capture (an ECRL bug: gather at the boundary)")
        return self._stash[key]

    def load(self, key: str, wanted: Mapping[str, Any]) -> None:
        """Load the full state ``wanted`` into ``key``'s object, cut for this rank's mesh (every
        rank calls it with the same state)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        options = StateDictOptions(full_state_dict=True)
        # set_*_state_dict replaces the given tensors by this rank's shards: hand it a copy.
        given = dict(wanted)
        if key in self.modules:
            set_model_state_dict(self.modules[key], given, options=options)
        else:
            optimizer, module = self.optimizers[key]
            set_optimizer_state_dict(module, optimizer, given, options=options)


def same_memory(tensor: torch.Tensor, alias: torch.Tensor) -> bool:
    """Whether ``alias`` (a detached alias of ``tensor`` made earlier) still views the memory
    ``tensor`` views (``set_``, ``resize_`` or ``.data =`` move a tensor elsewhere in place)."""
    return tensor.data_ptr() == alias.data_ptr() and tensor.dtype == alias.dtype and \
        tensor.shape == alias.shape and tensor.stride() == alias.stride()


def _same_value(a: Any, b: Any) -> bool:
    """Whether two state values are the same: tensors (DTensors) over the same storage with the
    same type, dtype and shape; nested dicts and lists of such; equal plain values."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or \
                type(a) is not type(b) or a.dtype != b.dtype or a.shape != b.shape:
            return False
        la = a.to_local() if is_dtensor(a) else a  # type: ignore[attr-defined]
        lb = b.to_local() if is_dtensor(b) else b  # type: ignore[attr-defined]
        return bool(la.data_ptr() == lb.data_ptr() and la.stride() == lb.stride()
                    and la.untyped_storage().data_ptr() == lb.untyped_storage().data_ptr())
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(
            _same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _learn_translation(plain: Any, wanted: Any) -> Callable[[Any], Any] | None:
    """How to turn an object's own ``state_dict()`` into torch's ``get_*_state_dict`` of it, when
    that is a mere renaming proved on this pair; None when it is not."""
    try:
        if _same_value(plain, wanted):  # a model: the same names and tensors
            return lambda state: state
        groups, theirs = plain["param_groups"], wanted["param_groups"]
        names = {index: name for group, other in zip(groups, theirs, strict=True)
                 for index, name in zip(group["params"], other["params"], strict=True)}

        def rename(state: Any) -> Any:
            return {"state": {names[index]: value for index, value in state["state"].items()},
                    "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                                     for group in state["param_groups"]]}

        return rename if _same_value(rename(plain), wanted) else None
    except (KeyError, TypeError, ValueError, RuntimeError):  # not a renaming (an array's ==)
        return None


_Leaf = tuple[Any, tuple[Any, int], torch.Tensor, torch.Tensor, tuple[Any, ...], list[int],
              list[int] | None]
"""A DTensor leaf as taken (:meth:`ShardLayout._leaf`): the DTensor, its spec and the spec's hash,
its local tensor, that tensor detached, its geometry, its whole shape and this rank's box's
offsets."""

def still_taken(leaf: _Leaf, dt: Any) -> bool:
    """Whether what was taken from a DTensor (``leaf``) holds for ``dt`` now: the same object,
    with the same spec and the same local tensor over the same memory."""
    spec = dt._spec
    # The spec's hash too: torch recomputes it when a field of the spec is assigned.
    return leaf[0] is dt and leaf[1][0] is spec and leaf[1][1] == hash(spec) and \
        dt._local_tensor is leaf[2] and same_memory(leaf[2], leaf[3])


Piece = tuple[int, dict[str, Any], list[int], torch.Tensor | None]
"""One piece of a DTensor (:meth:`ShardLayout._plan`): its holder, manifest entry, offsets, and
a meta tensor standing for another rank's piece (None for this rank's own)."""


@dataclass
class LayoutCache:
    """What :class:`ShardLayout` keeps from one checkpoint to the next, in the checkpointer
    (a model's geometry does not change during an attempt)."""

    boxes: dict[tuple[Any, ...], tuple[Any, list[int] | None]] = field(default_factory=dict)
    """This rank's box of each DTensor geometry (mesh, offsets; None: not one box): DCP's
    account of a box costs about 20 µs a tensor."""
    signature: tuple[Any, ...] | None = None
    """The geometries and dtypes the last gathered ``plan`` was made for."""
    plan: list[list[Piece]] = field(default_factory=list)
    """Per DTensor leaf, its pieces as every rank's boxes place them."""
    leaves: dict[int, _Leaf] = field(default_factory=dict)
    """The DTensors of the last checkpoint by ``id``, with what was taken from each
    (:meth:`ShardLayout._leaf`)."""


class ShardLayout:
    """The DTensors of one checkpoint's state, laid out as pieces that their ranks write.

    Passed as :func:`ecrl.runtime.checkpoint.statepack.encode_tree`'s ``distributed``: each
    DTensor leaf becomes a node, filled by :meth:`lay_out` once every rank's boxes are known.
    ``cache``: the boxes and the plan of pieces, kept by the caller from one checkpoint to the
    next."""

    def __init__(self, cache: LayoutCache) -> None:
        self._leaves: list[tuple[dict[str, Any], torch.Tensor, list[int], list[int]]] = []
        """Per DTensor: its node, this rank's local tensor, the whole shape, the box's offsets."""
        self._geometries: list[tuple[Any, ...]] = []
        """Per DTensor: its geometry (the key of ``cache.boxes``)."""
        self._cache = cache
        self._taken: dict[int, _Leaf] = {}
        """This checkpoint's DTensors (the cache's for the next one, :meth:`keep`)."""

    def __bool__(self) -> bool:
        return bool(self._leaves)

    def _leaf(self, dt: Any) -> _Leaf:
        """What this checkpoint takes from ``dt``: the previous checkpoint's, when ``dt`` is the
        same object with the same spec and the same local tensor over the same memory. The
        parameters and their optimizer state are the same objects from one step to the next,
        and their aliases staying the same objects lets the deferral decision be kept too
        (about 1 ms of a ResNet-50 boundary's 6 here)."""
        known = self._cache.leaves.get(id(dt))
        if known is not None and still_taken(known, dt):
            self._taken[id(dt)] = known
            return known
        spec = dt._spec
        local = dt._local_tensor
        key = (tuple(dt.shape), dt.placements, id(dt.device_mesh))
        leaf = (dt, (spec, hash(spec)), local, local.detach(), key, list(dt.shape),
                self._offsets(dt, key))
        self._taken[id(dt)] = leaf
        return leaf

    def _offsets(self, dt: Any, key: tuple[Any, ...]) -> list[int] | None:
        """The offsets of this rank's box of ``dt`` (geometry ``key``) in the whole tensor; None
        when its local shard is not one box of it."""
        known = self._cache.boxes.get(key)
        if known is not None and known[0] is dt.device_mesh:
            return known[1]
        from torch.distributed.tensor import Replicate, Shard

        offsets = None
        if all(type(p) in (Shard, Replicate) for p in dt.placements):
            boxes = dt.__create_chunk_list__()  # DCP's own account of the local shard
            if len(boxes) == 1 and tuple(boxes[0].sizes) == tuple(dt.to_local().shape):
                offsets = list(boxes[0].offsets)
        self._cache.boxes[key] = (dt.device_mesh, offsets)
        return offsets

    def keep(self) -> None:
        """Keep what this checkpoint took, for the next one (after the encoding)."""
        self._cache.leaves = self._taken

    def __call__(self, value: torch.Tensor, node: dict[str, Any]) -> Any:
        if not is_dtensor(value):
            return None
        _dt, _spec, _local, detached, geometry, shape, offsets = self._leaf(value)
        self._geometries.append(geometry)
        if offsets is None:
            # a collective, at the same leaf on every rank
            return value.full_tensor().detach()  # type: ignore[attr-defined]
        self._leaves.append((node, detached, shape, offsets))
        return node

    @staticmethod
    def _plan(index: int, local: torch.Tensor, everyone: list[Any], rank: int) -> list[Piece]:
        """The pieces of leaf ``index``: one per distinct non-empty box, held by the lowest rank
        that holds it."""
        plan: list[Piece] = []
        seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        for holder, boxes in enumerate(everyone):
            size, offsets = boxes[index]
            box = (tuple(size), tuple(offsets))
            count = math.prod(size)
            if box in seen or not count:
                continue
            seen.add(box)
            entry = {"dtype": dtype_name(local.dtype), "shape": list(size),
                     "nbytes": count * local.element_size()}
            plan.append((holder, entry, list(offsets), None if holder == rank else
                         torch.empty(size, dtype=local.dtype, device="meta")))
        return plan

    def lay_out(self, values: list[Any], entries: list[dict[str, Any]], *, rank: int,
                world_size: int) -> list[int | None]:
        """Append every rank's pieces to ``values`` and ``entries`` (other ranks' pieces as
        meta tensors: only their dtype and shape are used here) and fill the nodes; returns the
        owner of each entry (None: any rank may write it). A collective at the first checkpoint
        and whenever the geometries change."""
        import torch.distributed as dist

        # Every rank's boxes follow from the geometries (whole shapes, placements, mesh), which
        # are the same on every rank: when they (and the dtypes) are this rank's previous
        # checkpoint's, they are every rank's previous ones, and so are the boxes and the plan
        # made of them — no collective then (the state's sameness across ranks is checked with
        # each commit).
        signature = (tuple(self._geometries), tuple(local.dtype for _n, local, _s, _o
                                                    in self._leaves))
        cache = self._cache
        if cache.signature != signature:
            mine = [(list(local.shape), offsets) for _node, local, _shape, offsets
                    in self._leaves]
            everyone: list[Any] = [mine]
            if world_size > 1:
                everyone = [None] * world_size
                dist.all_gather_object(everyone, mine)
            cache.plan = [self._plan(index, local, everyone, rank)
                          for index, (_node, local, _shape, _offsets) in enumerate(self._leaves)]
            cache.signature = signature
        owners: list[int | None] = [None] * len(entries)
        for (node, local, shape, _offsets), pieces_plan in zip(self._leaves, cache.plan,
                                                                strict=True):
            pieces: list[list[Any]] = []
            for holder, entry, offsets, other in pieces_plan:
                entries.append(dict(entry))
                values.append(local if other is None else other)
                owners.append(holder)
                pieces.append([len(entries) - 1, list(offsets)])
            node[SHARDED] = {"dtype": dtype_name(local.dtype), "shape": list(shape),
                             "pieces": pieces}
        return owners
