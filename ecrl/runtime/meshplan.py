"""The mesh of each attempt, from the run's parallelism settings (torch-free).

``--parallel ddp|fsdp|hsdp``, ``--replicate R`` and ``--tp T`` (:class:`ecrl.runtime.settings.
SupervisorSettings`) describe a run's device mesh once; the world size of each attempt gives its
shape (docs/semantics.md, "Meshes"):

- ``TP = T``, ``DP = W / TP`` (the window of each step is split over the DP ranks);
- ``fsdp``: one data-parallel dimension ``dp`` of DP ranks, the model sharded over all of them;
- ``hsdp``: ``dp_replicate`` x ``dp_shard``. The shard group is fixed by the first world size
  (``DP0 / R`` ranks) and stays so across attempts; the replica groups follow the world size
  (``DP / shard``), as a job that loses or gains nodes keeps the ranks of a node together:
  ``--replicate 2`` at W = 4 then W = 2 is 2 x 2, then 1 x 2;
- ``ddp``: every rank a data-parallel rank, no mesh (``TP = 1``).

A mesh that does not divide a world size is refused in one line before anything is launched
(:func:`plan_meshes`); the global batch's ``B % DP`` is checked by the run's configuration. The
same layouts name the dimensions of the ``DeviceMesh`` the ranks build
(:func:`ecrl.runtime.sampling.meshbuild.init_mesh`) and fill ``run.json``'s ``meshes``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ecrl.contract.errors import ConfigError

__all__ = ["PARALLEL", "MeshLayout", "plan_meshes", "mesh_of"]

PARALLEL = ("ddp", "fsdp", "hsdp")
"""The data-parallel schemes ``--parallel`` accepts."""


@dataclass(frozen=True, kw_only=True, slots=True)
class MeshLayout:
    """The mesh of one attempt."""

    parallel: str
    """ddp, fsdp or hsdp."""
    replicate: int
    """Replica groups (hsdp; 1 otherwise)."""
    shard: int
    """Ranks each replica group shards the model over (fsdp: DP; ddp: DP, nothing sharded)."""
    tp: int
    """Tensor-parallel degree: ranks that consume the same shard of the window."""

    @property
    def dp_size(self) -> int:
        return self.replicate * self.shard

    @property
    def world_size(self) -> int:
        return self.dp_size * self.tp

    def dims(self) -> tuple[tuple[str, int], ...]:
        """``(name, size)`` of each ``DeviceMesh`` dimension, outermost first (empty: ddp)."""
        if self.parallel == "ddp":
            return ()
        dp = ((("dp_replicate", self.replicate), ("dp_shard", self.shard))
              if self.parallel == "hsdp" else (("dp", self.shard),))
        return dp + ((("tp", self.tp),) if self.tp > 1 else ())

    def record(self) -> dict[str, Any]:
        """The attempt's entry of ``run.json``'s ``meshes`` (docs/run-format.md)."""
        return {"dp_size": self.dp_size, "tp_size": self.tp, "parallel": self.parallel,
                "replicate": self.replicate, "shard": self.shard}

    def describe(self) -> str:
        """``replicate 2 x shard 2 x tp 2`` (for messages)."""
        return " x ".join(f"{n.removeprefix('dp_')} {s}" for n, s in self.dims()) or "ddp"


def mesh_of(*, parallel: str, replicate: int, tp: int, first_world: int,
            world_size: int) -> MeshLayout:
    """The layout at ``world_size`` of a run whose first attempt has ``first_world`` ranks, or a
    one-line :class:`ConfigError` naming the flags when it cannot exist."""
    if parallel not in PARALLEL:
        raise ConfigError(f"--parallel {parallel!r} is unknown: choose one of "
                          f"{', '.join(PARALLEL)}")
    for name, value in (("replicate", replicate), ("tp", tp)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"--{name} must be an integer >= 1, got {value!r}")
    if parallel == "ddp" and tp > 1:
        raise ConfigError(f"--tp {tp} needs --parallel fsdp or hsdp (ddp keeps a whole model on "
                          "every rank)")
    if parallel != "hsdp" and replicate > 1:
        raise ConfigError(f"--replicate {replicate} is for --parallel hsdp (replica groups of "
                          "shards)")
    if world_size % tp:
        raise ConfigError(f"--tp {tp} does not divide world size {world_size}: every attempt "
                          "needs DP = W / TP whole data-parallel ranks")
    dp = world_size // tp
    if parallel != "hsdp":
        return MeshLayout(parallel=parallel, replicate=1, shard=dp, tp=tp)
    dp0 = first_world // tp if first_world % tp == 0 else 0
    if dp0 == 0 or dp0 % replicate:
        raise ConfigError(f"--replicate {replicate} does not divide the data-parallel degree "
                          f"{max(dp0, first_world // tp)} of the first world size {first_world} "
                          f"(--tp {tp}): hsdp needs DP = replicate x shard")
    shard = dp0 // replicate
    if dp % shard:
        raise ConfigError(f"world size {world_size}: its data-parallel degree {dp} is not a whole "
                          f"number of shard groups of {shard} (--replicate {replicate} at world "
                          f"size {first_world}): choose world sizes that are multiples of "
                          f"{shard * tp}")
    return MeshLayout(parallel=parallel, replicate=dp // shard, shard=shard, tp=tp)


def plan_meshes(*, parallel: str, replicate: int, tp: int,
                world_sizes: Sequence[int]) -> list[MeshLayout]:
    """The layout of each planned world size (the last one repeats), checked."""
    return [mesh_of(parallel=parallel, replicate=replicate, tp=tp, first_world=world_sizes[0],
                    world_size=w) for w in world_sizes]
