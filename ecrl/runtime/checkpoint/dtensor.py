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

This is the simple, exact form (the approach most scripts use): its cost is one full copy of the
state per checkpoint. Writing the shards where they live (DCP with sharded entries) is the
performance work still to do (issue 31).

``jit`` is refused: a rescue copies the live state of a survivor, and no rank of an FSDP mesh
holds a full replica to copy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from ecrl.contract.errors import ConfigError

__all__ = ["FullStates", "is_sharded_module", "is_sharded_optimizer"]


def _dtensor() -> type | None:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - a torch without distributed tensors
        return None
    return DTensor


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

    def __bool__(self) -> bool:
        return bool(self.modules or self.optimizers)

    def __contains__(self, key: object) -> bool:
        return key in self.modules or key in self.optimizers

    def _options(self) -> Any:
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=True, cpu_offload=False)

    def gather(self) -> None:
        """Gather every sharded entry's full state on every rank (a collective: all ranks call
        it at the same boundary)."""
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
        )

        options = self._options()
        for key, module in self.modules.items():
            self._stash[key] = get_model_state_dict(module, options=options)
        for key, (optimizer, module) in self.optimizers.items():
            self._stash[key] = get_optimizer_state_dict(module, optimizer, options=options)

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
