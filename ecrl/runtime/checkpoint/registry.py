"""The checkpoint strategies ECRL knows, in one table (torch-free).

Every other list of strategy names is derived from :data:`REGISTRY`: the names ``--strategy``
accepts, the ones that are built, the class :func:`ecrl.runtime.checkpoint.strategies.make_strategy`
instantiates and that class's ``name``. A strategy is registered by its import path
(``"module:Class"``), not by its class, so that the command line can list and validate names
without importing torch; the class is imported when a run needs it.

A new strategy (sharded through ``torch.distributed.checkpoint``, just-in-time) plugs in with one
entry here, or at run time with :func:`register_strategy` before the checkpointer is built; its
class subclasses :class:`ecrl.runtime.checkpoint.strategies.Strategy`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from ecrl.contract.errors import ConfigError

__all__ = ["StrategyEntry", "REGISTRY", "register_strategy", "strategy_names", "built_strategies",
           "strategy_class"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyEntry:
    """One checkpoint strategy."""

    name: str
    """What ``--strategy`` and ``run.json`` call it."""
    target: str | None
    """``"module:Class"`` of its implementation; None while it is not built yet."""
    summary: str
    """One line for help texts."""


REGISTRY: dict[str, StrategyEntry] = {}


def register_strategy(name: str, target: str | None, *, summary: str) -> StrategyEntry:
    """Add (or replace) a strategy; returns its entry."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"strategy name {name!r} must be a plain word")
    entry = StrategyEntry(name=name, target=target, summary=summary)
    REGISTRY[name] = entry
    return entry


register_strategy("none", "ecrl.runtime.checkpoint.strategies:NoCheckpoints",
                  summary="no checkpoints (a failure restarts from step 0)")
register_strategy("blocking", "ecrl.runtime.checkpoint.strategies:BlockingCheckpoints",
                  summary="training waits while rank 0 writes the checkpoint")
register_strategy("overlapped", "ecrl.runtime.checkpoint.strategies:OverlappedCheckpoints",
                  summary="rank 0 copies the state; a background process writes it")
register_strategy("sharded", "ecrl.runtime.checkpoint.sharded:ShardedCheckpoints",
                  summary="every rank writes its part (torch.distributed.checkpoint); training "
                          "waits for the commit")
register_strategy("sharded-async", "ecrl.runtime.checkpoint.sharded:AsyncShardedCheckpoints",
                  summary="every rank copies the state to CPU; a background thread writes its "
                          "part and commits")
register_strategy("jit", "ecrl.runtime.checkpoint.jit:JitCheckpoints",
                  summary="a healthy rank saves when a peer dies or hangs (at most one step "
                  "replayed); --ckpt-every K adds a fallback every K steps")


def strategy_names() -> tuple[str, ...]:
    """Every strategy a run may name, built or not."""
    return tuple(REGISTRY)


def built_strategies() -> tuple[str, ...]:
    """The strategies a run can use today."""
    return tuple(name for name, entry in REGISTRY.items() if entry.target is not None)


def strategy_class(name: str) -> Any:
    """The implementation of ``name`` (imports it; a Strategy subclass)."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"checkpoint strategy {name!r} is unknown: choose one of "
                          f"{', '.join(strategy_names())}")
    if entry.target is None:
        raise ConfigError(f"checkpoint strategy {name!r} is not built yet: choose one of "
                          f"{', '.join(built_strategies())}")
    module, _, attr = entry.target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    cls.name = name  # the registry names the class: events and logs use this name
    return cls
