"""The resumable global-batch sampler as a plain iterator of ``(global_step, shard)``.

The public, ``torch.utils.data`` face of the same order is :class:`ecrl.GlobalBatchSampler`
(:mod:`ecrl.runtime.sampling.batch_sampler`); both load states through :func:`check_state`.

A thin stateful layer over :mod:`ecrl.contract.semantics`, which defines the windows and shards.
Its state is the next step's ``{epoch, cursor_step, seed}`` plus the geometry; a checkpoint taken
after step ``c`` stores the state whose next step is ``c + 1``. Because the global window of a step
does not depend on the world size, restoring the state into a job of another world size re-shards
the same window: nothing is skipped or repeated.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from ecrl.contract import semantics
from ecrl.contract.errors import SemanticsError

__all__ = ["ResumableSampler", "check_state"]


class ResumableSampler:
    """Yields ``(global_step, shard)`` for one rank, from a resumable position."""

    def __init__(self, geometry: semantics.Geometry, *, seed: int, rank: int, world_size: int,
                 start_step: int = 0) -> None:
        geometry.local_batch(world_size)  # B % W is checked here, with the standard message
        self.geometry = geometry
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self._state = semantics.SamplerState.at_step(geometry, seed, start_step)
        self._stream: Iterator[tuple[int, Any]] | None = None

    @property
    def next_step(self) -> int:
        return self._state.global_step

    @property
    def local_batch(self) -> int:
        return self.geometry.local_batch(self.world_size)

    def __iter__(self) -> Iterator[tuple[int, Any]]:
        return self

    def __next__(self) -> tuple[int, Any]:
        """The next step and this rank's shard (int64 IDs); advances the state."""
        if self._stream is None:
            self._stream = self._state.iter_shards(self.rank, self.world_size)
        step, ids = next(self._stream)
        self._state = semantics.SamplerState.at_step(self.geometry, self.seed, step + 1)
        return step, ids

    def state_dict(self) -> dict[str, Any]:
        """The position of the next step, in :meth:`ecrl.contract.semantics.SamplerState.to_dict`
        form."""
        return self._state.to_dict()

    def load_state_dict(self, data: Mapping[str, Any]) -> None:
        """Continue from a saved position; the geometry and seed must be this run's."""
        self._state = check_state(data, self.geometry, self.seed)
        self._stream = None


def check_state(data: Mapping[str, Any], geometry: semantics.Geometry, seed: int
                ) -> semantics.SamplerState:
    """A saved sampler position, refused in one line unless it belongs to ``geometry`` and
    ``seed`` (the same data-set size, global batch and seed)."""
    state = semantics.SamplerState.from_dict(data)
    if state.geometry != geometry or state.seed != seed:
        raise SemanticsError(
            f"the saved sampler state was built for D={state.geometry.dataset_size}, "
            f"B={state.geometry.global_batch}, seed={state.seed}, this sampler has "
            f"D={geometry.dataset_size}, B={geometry.global_batch}, seed={seed}: resume with "
            "the run's own data set, batch and seed, or start a new run directory"
        )
    return state
