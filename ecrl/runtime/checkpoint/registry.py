"""The checkpoint strategies ECRL knows, bound to their implementations (torch-free).

The names and their one-line summaries are part of the run format
(:mod:`ecrl.contract.strategies`); this table binds an implementation to each. Every other list of
strategy names is derived from :data:`REGISTRY`: the names ``--strategy`` accepts, the ones that
are built, the class :func:`ecrl.runtime.checkpoint.strategies.make_strategy` instantiates and that
class's ``name``. A strategy is registered by its import path
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
from ecrl.contract.strategies import SUMMARIES

__all__ = ["StrategyEntry", "REGISTRY", "register_strategy", "strategy_names", "built_strategies",
           "periodic_strategies", "strategy_entry", "strategy_class"]


@dataclass(frozen=True, kw_only=True, slots=True)
class StrategyEntry:
    """One checkpoint strategy."""

    name: str
    """What ``--strategy`` and ``run.json`` call it."""
    target: str | None
    """``"module:Class"`` of its implementation; None while it is not built yet."""
    summary: str
    """One line for help texts."""
    periodic: bool = False
    """It checkpoints every K steps and at no other time."""
    sharded: bool = False
    """Every rank writes its part (a checkpoint directory); otherwise rank 0 writes one file."""
    background: bool = False
    """Its writes continue in the background, up to ``--max-inflight`` at a time."""


REGISTRY: dict[str, StrategyEntry] = {}


def register_strategy(name: str, target: str | None, *, summary: str | None = None,
                      periodic: bool = False, sharded: bool = False,
                      background: bool = False) -> StrategyEntry:
    """Add (or replace) a strategy; returns its entry. ``summary`` defaults to the contract's
    line for a name it knows (a new name needs one)."""
    if not name or not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"strategy name {name!r} must be a plain word")
    summary = summary if summary is not None else SUMMARIES.get(name)
    if summary is None:
        raise ConfigError(f"strategy {name!r}: give its summary (one line for help texts)")
    entry = StrategyEntry(name=name, target=target, summary=summary, periodic=periodic,
                          sharded=sharded, background=background)
    REGISTRY[name] = entry
    return entry


_BINDINGS: dict[str, dict[str, Any]] = {
    "none": {"target": "ecrl.runtime.checkpoint.strategies:NoCheckpoints"},
    "blocking": {"target": "ecrl.runtime.checkpoint.strategies:BlockingCheckpoints",
                 "periodic": True},
    "overlapped": {"target": "ecrl.runtime.checkpoint.strategies:OverlappedCheckpoints",
                   "periodic": True, "background": True},
    "sharded": {"target": "ecrl.runtime.checkpoint.sharded:ShardedCheckpoints",
                "periodic": True, "sharded": True},
    "sharded-async": {"target": "ecrl.runtime.checkpoint.sharded:AsyncShardedCheckpoints",
                      "periodic": True, "sharded": True, "background": True},
    "jit": {"target": "ecrl.runtime.checkpoint.jit:JitCheckpoints"},
}
for _name in SUMMARIES:  # the contract's order; a name without an implementation is not built
    register_strategy(_name, **{"target": None, **_BINDINGS.get(_name, {})})


def strategy_names() -> tuple[str, ...]:
    """Every strategy a run may name, built or not."""
    return tuple(REGISTRY)


def built_strategies() -> tuple[str, ...]:
    """The strategies a run can use today."""
    return tuple(name for name, entry in REGISTRY.items() if entry.target is not None)


def periodic_strategies() -> tuple[str, ...]:
    """The built strategies that checkpoint every K steps and at no other time."""
    return tuple(name for name in built_strategies() if REGISTRY[name].periodic)


def strategy_entry(name: str) -> StrategyEntry:
    """The entry of ``name`` (a one-line error for an unknown name)."""
    entry = REGISTRY.get(name)
    if entry is None:
        raise ConfigError(f"checkpoint strategy {name!r} is unknown: choose one of "
                          f"{', '.join(strategy_names())}")
    return entry


def strategy_class(name: str) -> Any:
    """The implementation of ``name`` (imports it; a Strategy subclass)."""
    entry = strategy_entry(name)
    if entry.target is None:
        raise ConfigError(f"checkpoint strategy {name!r} is not built yet: choose one of "
                          f"{', '.join(built_strategies())}")
    module, _, attr = entry.target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    cls.name = name  # the registry names the class: events and logs use this name
    return cls
