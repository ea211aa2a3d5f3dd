"""``ecrl.GlobalBatchSampler``: ECRL's data order as a ``torch.utils.data`` batch sampler.

Each iteration step yields this rank's shard of the step's global window
(:func:`ecrl.contract.semantics.shard`) as a list of sample IDs, so it drops into
``DataLoader(dataset, batch_sampler=sampler)``. Rank and world size come from
``torch.distributed`` when it is initialised (read when iteration starts), else 0 and 1.

Its state (``state_dict``/``load_state_dict``, torch's Stateful protocol) is the position of the
next step, with the geometry and seed it belongs to, so it rides in ``torch.save``, DCP and
``StatefulDataLoader`` states. The window of a step does not depend on the world size: a state
loaded into a job of another world size re-shards the same windows.

Why the position is not simply "how many batches were yielded": a ``DataLoader`` with workers
asks for batches ahead of the training loop (``prefetch_factor × num_workers``), so at a
checkpoint the sampler has run ahead of the steps that really completed. The training loop tells
the sampler which step completed (:meth:`step_done`; :class:`ecrl.StepLog` and
:class:`ecrl.Checkpointer` do it for you), and from then on the state is the step after the last
completed one. Without that call (e.g. ``num_workers=0`` and no step log) the state is the
position after the last batch yielded, which is the same thing when nothing is prefetched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch.utils.data import Sampler

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.runtime._attempt import dist_rank_world, install_error_hook

__all__ = ["GlobalBatchSampler", "check_state", "dist_rank_world"]


_BLOCK_IDS = 1 << 14
"""IDs computed per vectorised call when iterating (numpy's per-call overhead amortised)."""

_ISSUED_IDS = 1 << 20
"""IDs remembered at most from shards handed out and not yet logged (a loop without a step log
never collects them; a prefetching loader holds a few dozen shards)."""


class GlobalBatchSampler(Sampler[list[int]]):
    """This rank's shard of every step's window, from a resumable position.

    ``dataset_size`` (D) and ``global_batch`` (B, summed over ranks) fix the geometry: an epoch is
    ``D // B`` steps and the ``D % B`` IDs left over are not used in that epoch. ``steps``: stop
    after this global step count (None: iterate for ever; drive the loop by step count).
    ``rank``/``world_size``: override what ``torch.distributed`` says. ``per_epoch``: each
    iteration ends at the end of an epoch, and ``len()`` is the whole epoch's step count: what a
    framework's epoch loop expects (Lightning counts a resumed epoch's batches from the epoch's
    start, and iterates the loader once per epoch).
    ``mesh``: on FSDP2, HSDP or tensor parallelism, the ``DeviceMesh`` (or its data-parallel
    sub-mesh), or explicit ``dp_rank``/``dp_size`` (``tp_rank``/``tp_size``): the shard is then
    the data-parallel rank's, shared by its tensor-parallel peers (:mod:`.mesh`);
    :attr:`rank` and :attr:`world_size` become the data-parallel rank and degree.
    """

    def __init__(self, dataset_size: int, global_batch: int, *, seed: int = 0,
                 steps: int | None = None, rank: int | None = None,
                 world_size: int | None = None, per_epoch: bool = False, mesh: Any = None,
                 dp_rank: int | None = None, dp_size: int | None = None,
                 tp_rank: int | None = None, tp_size: int | None = None) -> None:
        install_error_hook()
        self.mesh_coords = _mesh_coords(mesh, dp_rank, dp_size, tp_rank, tp_size, global_batch,
                                        rank, world_size)
        """This rank's place on the mesh (None: plain DDP, the shard is the global rank's)."""
        if self.mesh_coords is not None:
            rank, world_size = self.mesh_coords.dp_rank, self.mesh_coords.dp_size
        self.geometry = semantics.Geometry(dataset_size=dataset_size, global_batch=global_batch)
        self.seed = semantics.SamplerState.at_step(self.geometry, seed, 0).seed
        self.steps = steps
        self.per_epoch = bool(per_epoch)
        self._rank, self._world = rank, world_size
        if world_size is not None or rank is None:
            self.geometry.local_batch(self.world_size)  # B % W, with the standard message
        self._next = 0
        self._tracked = False
        self._pending: str | None = None
        self._live_from: int | None = None
        """The step a running iteration began at (None: none is running). A ``DataLoader``
        with workers starts iterating when its iterator is created, ahead of the loop."""
        self._on_start: Callable[[], None] | None = None
        self._issued: list[tuple[int, list[int], int] | None] = []
        """(step, IDs, hash) of the shards handed out and not yet logged, in a ring indexed by
        step (see :meth:`take_issued`): a newer shard overwrites the slot of one issued
        ``len(ring)`` steps earlier, so remembering costs the same at step 10 and 10^6."""

    # --- geometry --------------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return self._rank if self._rank is not None else dist_rank_world()[0]

    @property
    def world_size(self) -> int:
        return self._world if self._world is not None else dist_rank_world()[1]

    @property
    def local_batch(self) -> int:
        """L = B / W (checks that W divides B)."""
        return self.geometry.local_batch(self.world_size)

    @property
    def next_step(self) -> int:
        """The global step the next batch belongs to."""
        return self._next

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` says about this sampler."""
        return {"kind": "ecrl", "name": "ecrl.GlobalBatchSampler"}

    # --- iteration -------------------------------------------------------------------------------

    def expect_state(self, reason: str | None) -> None:
        """Refuse to iterate until :meth:`load_state_dict` is called (a resume is pending, for
        ``reason``); None lifts the refusal (there was nothing to resume from). An iteration
        already running is refused at once."""
        if reason is not None and self._live_from is not None:
            raise self._iterating_error(reason)
        self._pending = reason

    def _iterating_error(self, why: str) -> SemanticsError:
        return SemanticsError(
            f"GlobalBatchSampler is being iterated from step {self._live_from} while its saved "
            f"state is pending ({why}): a DataLoader iterator was created before "
            "Checkpointer.restore() (a framework creating it early, or workers prefetching); "
            "call restore() (or sampler.load_state_dict) before creating the loader's iterator, "
            "or the run would restart its data order")

    def __iter__(self) -> Iterator[list[int]]:
        if self._pending is not None:
            raise SemanticsError(
                f"GlobalBatchSampler iterated before its saved state was loaded ({self._pending}):"
                " call Checkpointer.restore() (or sampler.load_state_dict) before iterating the "
                "data loader, or the run would restart its data order"
            )
        rank, world = self.rank, self.world_size
        local = self.geometry.local_batch(world)
        if self._on_start is not None:
            start, self._on_start = self._on_start, None
            start()
        self._live_from = self._next
        try:
            yield from self._shards(rank, world, local)
        finally:
            self._live_from = None

    def _end(self, start: int) -> int | None:
        """The step an iteration starting at ``start`` stops before (None: never)."""
        if not self.per_epoch:
            return self.steps
        per = self.geometry.steps_per_epoch
        end = (start // per + 1) * per
        return end if self.steps is None else min(end, self.steps)

    def _shards(self, rank: int, world: int, local: int) -> Iterator[list[int]]:
        state = semantics.SamplerState.at_step(self.geometry, self.seed, self._next)
        stop = self._end(self._next)
        ring = self._issued_ring(local)
        size = len(ring)
        # A block of steps at a time: the shards' hashes and Python lists in one call each (per
        # batch, numpy's call overhead would cost more than the arithmetic).
        for first, block in state.iter_shard_blocks(rank, world,
                                                    ahead=max(64, _BLOCK_IDS // local)):
            rows = block.tolist()
            hashes = semantics.ids_hashes(block).tolist()
            if stop is not None and first + len(rows) > stop:
                del rows[max(0, stop - first):]
            # rows may be cut at the last step; hashes keeps the block's full length.
            step = first
            for ids, digest in zip(rows, hashes, strict=False):
                if not self._tracked:
                    self._next = step + 1
                ring[step % size] = (step, ids, digest)
                step += 1
                # A copy: what StepLog compares the logged batch with must be what was issued,
                # even if the caller changes the list it got (else a hash-only record could
                # carry the issued hash for IDs that did not reach the step).
                yield list(ids)
            if stop is not None and first + len(rows) >= stop:
                return

    def __len__(self) -> int:
        """Batches of the iteration that is running, or of the next one: from where it starts
        to ``steps`` (needs ``steps``). It does not shrink while a loader prefetches (a
        framework reads it after creating the iterator to know when the epoch ends). With
        ``per_epoch``: the steps of the running (or next) epoch, counted from its first step,
        wherever in it the iteration starts (a framework resuming in the middle of an epoch
        counts its batches from the epoch's start)."""
        start = self._live_from if self._live_from is not None else self._next
        if self.per_epoch:
            if self.steps is not None and start >= self.steps:
                return 0
            per = self.geometry.steps_per_epoch
            first = start // per * per
            end = self._end(first)
            assert end is not None
            return max(0, end - first)
        if self.steps is None:
            raise TypeError("GlobalBatchSampler(steps=None) is endless: give steps= to get a "
                            "length, or drive the loop by step count")
        start = self._live_from if self._live_from is not None else self._next
        return max(0, self.steps - start)

    def call_on_start(self, action: Callable[[], None]) -> None:
        """Run ``action`` once, when iteration produces its first batch.

        :class:`ecrl.Checkpointer` restores the RNG states this way: a ``DataLoader`` draws its
        workers' base seed from the global generator when its iterator is created, after
        ``restore()``; restoring at the first batch instead puts the generator exactly where it
        was after the checkpointed step, as in a run that was never interrupted.
        """
        self._on_start = action

    def step_done(self, step: int) -> None:
        """The training loop completed global step ``step``: the state now points at step + 1."""
        self._tracked = True
        self._next = int(step) + 1

    def _issued_ring(self, local: int) -> list[tuple[int, list[int], int] | None]:
        size = max(64, _ISSUED_IDS // local)
        if len(self._issued) != size:
            self._issued = [None] * size
        return self._issued

    def note_issued(self, step: int, ids: list[int], digest: int) -> None:
        """This rank's shard of ``step`` (its IDs and :func:`~ecrl.contract.semantics.ids_hash`)
        was handed out by something that draws ECRL's windows for this sampler (the
        ``Trainer``'s per-sample stream): :class:`ecrl.StepLog` then takes the hash from here
        instead of computing the shard again."""
        ring = self._issued_ring(len(ids) or 1)
        ring[step % len(ring)] = (step, list(ids), digest)

    def take_issued(self, step: int) -> tuple[list[int], int] | None:
        """(IDs, multiset hash) of this rank's shard of ``step`` as this sampler handed it out,
        forgotten once taken; None if it was not handed out (or long ago)."""
        ring = self._issued
        if not ring:
            return None
        slot = step % len(ring)
        entry = ring[slot]
        if entry is None or entry[0] != step:
            return None
        ring[slot] = None
        return entry[1], entry[2]

    def expected(self, step: int) -> tuple[int, int]:
        """(count, multiset hash) of this rank's shard of ``step``, computed."""
        ids = self.shard_of(step)
        return int(ids.size), semantics.ids_hash(ids)

    def shard_of(self, step: int) -> Any:
        """This rank's IDs of global step ``step`` (int64 array): what the batch should hold."""
        return semantics.shard(self.geometry, self.seed, step, self.rank, self.world_size)

    # --- Stateful --------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The next step's position: ``{epoch, cursor_step, seed, geometry, permutation}``."""
        return self.state_at(self._next)

    def state_at(self, step: int) -> dict[str, Any]:
        """The state of the position ``step`` (the state after step ``step - 1``)."""
        return semantics.SamplerState.at_step(self.geometry, self.seed, step).to_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Continue from a saved position; its data set size, global batch and seed must be
        this sampler's."""
        state = check_state(state_dict, self.geometry, self.seed)
        if self._live_from is not None:
            raise self._iterating_error(f"loading the state of step {state.global_step}")
        self._next = state.global_step
        self._pending = None


def _mesh_coords(mesh: Any, dp_rank: int | None, dp_size: int | None, tp_rank: int | None,
                 tp_size: int | None, global_batch: int, rank: int | None,
                 world_size: int | None) -> semantics.MeshCoords | None:
    from ecrl.runtime.sampling.mesh import resolve_coords

    coords = resolve_coords(mesh=mesh, dp_rank=dp_rank, dp_size=dp_size, tp_rank=tp_rank,
                            tp_size=tp_size, owner="GlobalBatchSampler",
                            world_size=dist_rank_world()[1] if mesh is not None else None)
    if coords is None:
        return None
    if rank is not None or world_size is not None:
        raise ConfigError("GlobalBatchSampler: give rank=/world_size= (DDP) or a mesh (its "
                          "data-parallel coordinates), not both")
    semantics.mesh_local_batch(global_batch, coords.dp_size)  # B % DP, in one line
    return coords


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
