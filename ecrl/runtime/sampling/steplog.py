"""``ecrl.StepLog``: the run directory's step records, written from any training loop.

One call per step, after the forward pass and before ``loss.backward()``
(``log.step(step, sample_ids=ids, loss=loss)``), appends this rank's record to
``logs/attempt-NNN/rank-NNN.jsonl`` (the contract's field names,
:class:`ecrl.contract.runformat.StepRecord`) and flushes it. A record says "this rank consumed
these samples in this step"; whether the step was committed comes from checkpoints. Written
before the rank's gradients can enter the step's all-reduce, it is on disk at every rank once any
rank completed that all-reduce: ``jit`` relies on it (and checks the order: docs/library.md).

The first call (or :meth:`ecrl.Checkpointer.restore`) settles ``run.json``: rank 0 writes it when
it is absent; when it exists (a later attempt, or ``ecrl run``'s supervisor wrote it) every rank
checks that it describes this run and stops with one line if not.

Two kinds of sampler:

- ``sampler=ecrl.GlobalBatchSampler(...)``: ECRL's order; ``run.json`` says ``{"kind": "ecrl"}``
  and the verifier checks every step's window. Each logged step's IDs are compared with the shard
  the sampler scheduled for that step (a mismatch is a loop bug: the batch and the step number
  disagree), and the sampler learns that the step is done (its checkpointed position; a ``jit``
  rescue of an earlier step recomputes the position of the step it saves).
- ``sampler={"kind": "external", "name": "torch.utils.data.DistributedSampler", ...}``: an order
  ECRL does not know (the user's ``DistributedSampler``, ``StatefulDataLoader``, Mosaic
  Streaming…); give ``dataset_size``, ``global_batch`` and, per step, ``epoch`` and
  ``cursor_step`` from the loop. The verifier audits such runs without windows.

The IDs logged must be the ones that reached the step: take them from the batch
(:class:`ecrl.WithSampleIds`), never recompute them from the step number.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn

import numpy as np

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError, SemanticsError
from ecrl.contract.runformat import (
    EPOCH_COVERAGES,
    SAMPLER_KINDS,
    JsonlWriter,
    RunManifest,
    StepRecord,
    read_json_record,
    write_json_record,
)
from ecrl.runtime._attempt import (
    Attempt,
    record_completed,
    record_fresh_if_unrecorded,
    resolve_attempt,
)
from ecrl.runtime.manifest import STREAM_FIELDS, build_manifest, check_same_run
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler

__all__ = ["StepLog"]


def _as_id_list(sample_ids: Any) -> list[int]:
    """The IDs a batch carried (a tensor, possibly on a GPU, an array or a list) as Python ints."""
    if type(sample_ids) is list and set(map(type, sample_ids)) <= _INT_ONLY:
        return sample_ids  # the integrations' own lists (numpy's conversion costs ~30 µs cold)
    if hasattr(sample_ids, "detach"):
        if sample_ids.dtype not in _torch_int_dtypes():
            _not_integers(sample_ids.dtype)
        # One call where the batch's 1-D tensor allows it: each call into torch right after the
        # model's step costs about 10 µs of cold caches (the ≤ 1% per-step budget is 100 µs).
        ids = sample_ids.tolist()
        if type(ids) is not list or (ids and type(ids[0]) is list):  # 0-d, or 2-d and more
            ids = sample_ids.reshape(-1).tolist()
        return ids
    ids = np.asarray(sample_ids)
    if ids.dtype.kind not in "iu":
        _not_integers(ids.dtype)
    return ids.reshape(-1).astype(np.int64, copy=False).tolist()


_INT_ONLY = frozenset({int})
"""The one item type of a list of IDs passed through as it is (``bool`` is not an ID)."""

_TORCH_INT_DTYPES: frozenset[Any] = frozenset()


def _torch_int_dtypes() -> frozenset[Any]:
    global _TORCH_INT_DTYPES
    if not _TORCH_INT_DTYPES:
        import torch  # loaded already: a tensor was passed

        _TORCH_INT_DTYPES = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32,
                                       torch.int64, torch.uint16, torch.uint32, torch.uint64})
    return _TORCH_INT_DTYPES


def _not_integers(dtype: Any) -> NoReturn:
    raise SemanticsError(f"sample_ids must be integers, got dtype {dtype}: pass the IDs "
                         "the batch carried (ecrl.WithSampleIds)")


def _as_loss(loss: Any) -> float | None:
    if loss is None:
        return None
    if hasattr(loss, "item"):
        try:
            value = float(loss.item())  # one call for a scalar: the common case, kept cheap
        except (RuntimeError, ValueError):  # several elements (a per-sample loss): their mean
            value = float(loss.detach().float().mean()) if hasattr(loss, "detach") \
                else float(np.mean(loss))
    else:
        value = float(loss)
    return value if math.isfinite(value) else None


def _planned_meshes(world_sizes: Sequence[int], tp_size: int) -> list[dict[str, int]]:
    """run.json's ``meshes``: the script's tensor-parallel degree at each planned world size
    (DP = W / TP), up to the first world size it does not divide (unknown from there on)."""
    out = []
    for w in world_sizes:
        if w % tp_size:
            break
        out.append({"dp_size": w // tp_size, "tp_size": tp_size})
    return out or [{"dp_size": max(1, world_sizes[0] // tp_size), "tp_size": tp_size}]


class StepLog:
    """Per-rank step records and ``run.json`` for one run directory.

    ``run_dir``: the run directory (None under ``ecrl launch``, which sets it). ``steps``: the
    committed steps the run must reach (``run.json`` ``target_steps``). ``log_ids``: log every
    sample ID (else count and hash only). ``model``/``dataset``: names recorded in ``run.json``.
    ``steps_per_epoch``: with an external sampler, the loop's steps per epoch S when it is not
    ``dataset_size // global_batch`` (the records' epoch and cursor step must be
    ``divmod(step, S)``). ``epoch_coverage``: with an external sampler, ``"drop_remainder"``
    when its epochs may leave some IDs out (``DistributedSampler(drop_last=True)``, a loader's
    ``drop_last`` with ``D % B != 0``; default ``"all"``, docs/run-format.md).
    ``deterministic=False`` declares kernels that are not bit-reproducible
    (the verifier then compares replayed losses with a tolerance).
    ``mesh`` (or ``dp_rank``/``dp_size``/``tp_rank``/``tp_size``): on FSDP2, HSDP or tensor
    parallelism, this rank's place on the mesh (:mod:`ecrl.runtime.sampling.mesh`); taken from
    the sampler when it was given one. Each record then names its mesh coordinates and
    ``run.json`` the mesh (docs/run-format.md).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 sampler: GlobalBatchSampler | Mapping[str, Any], steps: int,
                 dataset_size: int | None = None, global_batch: int | None = None,
                 seed: int | None = None, log_ids: bool = True, model: str = "user-model",
                 dataset: str = "user-dataset", check_ids: bool = True,
                 steps_per_epoch: int | None = None, deterministic: bool | None = None,
                 epoch_coverage: str | None = None, mesh: Any = None,
                 dp_rank: int | None = None, dp_size: int | None = None,
                 tp_rank: int | None = None, tp_size: int | None = None) -> None:
        if isinstance(sampler, GlobalBatchSampler):
            given = {"dataset_size": dataset_size, "global_batch": global_batch, "seed": seed}
            mine = {"dataset_size": sampler.geometry.dataset_size,
                    "global_batch": sampler.geometry.global_batch, "seed": sampler.seed}
            for key, value in given.items():
                if value is not None and value != mine[key]:
                    raise ConfigError(f"StepLog({key}={value}) disagrees with the sampler's "
                                      f"{key}={mine[key]}: leave it out, the sampler's is used")
            self.sampler: GlobalBatchSampler | None = sampler
            self.geometry = sampler.geometry
            self.seed = sampler.seed
            self.description: dict[str, Any] = sampler.describe()
        elif isinstance(sampler, Mapping):
            if sampler.get("kind") != "external" or not isinstance(sampler.get("name"), str):
                raise ConfigError(
                    f"StepLog(sampler={dict(sampler)!r}): pass an ecrl.GlobalBatchSampler, or "
                    '{"kind": "external", "name": "<the sampler you use>"} for another one')
            if dataset_size is None or global_batch is None:
                raise ConfigError("StepLog with an external sampler needs dataset_size= and "
                                  "global_batch= (the verifier audits against them)")
            self.sampler = None
            self.geometry = semantics.Geometry(dataset_size=dataset_size,
                                               global_batch=global_batch)
            self.seed = 0 if seed is None else int(seed)
            self.description = dict(sampler)
            if epoch_coverage is not None:
                if epoch_coverage not in EPOCH_COVERAGES:
                    raise ConfigError(f"StepLog(epoch_coverage={epoch_coverage!r}) must be one of "
                                      f"{', '.join(map(repr, EPOCH_COVERAGES))}")
                self.description["epoch_coverage"] = epoch_coverage
            if steps_per_epoch is not None and (isinstance(steps_per_epoch, bool) or not
                                                isinstance(steps_per_epoch, int)
                                                or steps_per_epoch < 1):
                raise ConfigError(f"StepLog(steps_per_epoch={steps_per_epoch!r}) must be a "
                                  "positive integer")
        else:
            raise ConfigError(f"StepLog(sampler=…) must be an ecrl.GlobalBatchSampler or a dict, "
                              f"got {type(sampler).__name__}")
        if self.sampler is not None and epoch_coverage is not None:
            raise ConfigError("StepLog(epoch_coverage=…) is for an external sampler: ECRL's "
                              "sampler uses every step's window, leave it out")
        assert self.description["kind"] in SAMPLER_KINDS
        if self.sampler is not None and steps_per_epoch not in (
                None, self.geometry.steps_per_epoch):
            raise ConfigError(f"StepLog(steps_per_epoch={steps_per_epoch}): ECRL's sampler has "
                              f"{self.geometry.steps_per_epoch} steps per epoch; leave it out")
        self.steps_per_epoch = steps_per_epoch or self.geometry.steps_per_epoch
        self.deterministic = deterministic
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ConfigError(f"StepLog(steps={steps!r}): give the number of steps the run must "
                              "reach, a positive integer")
        self.steps = steps
        self.log_ids = bool(log_ids)
        self.model = model
        self.dataset = dataset
        self.check_ids = check_ids
        self.run: Attempt = resolve_attempt(run_dir)
        self.paths = self.run.paths
        self.attempt = self.run.attempt
        self.rank = self.run.rank
        self.world_size = self.run.world_size
        # ECRL's order needs W | B; an external sampler may hand ranks uneven shares (its
        # records then carry what each rank really got, and the verifier judges it).
        self.mesh_coords = self._mesh(mesh, dp_rank, dp_size, tp_rank, tp_size)
        """This rank's place on the mesh (None: plain DDP)."""
        self.local_batch = (self.geometry.local_batch(self.world_size) if self.sampler is not None
                            and self.mesh_coords is None else None)
        if self.mesh_coords is not None:
            self.local_batch = semantics.mesh_local_batch(self.geometry.global_batch,
                                                          self.mesh_coords.dp_size)
        self.manifest: RunManifest | None = None
        self._checkpointing: dict[str, Any] = {"strategy": "none", "ckpt_every": 0,
                                               "fail_at": []}
        self._writer: JsonlWriter | None = None
        self._fixed: dict[str, Any] | None = None
        """A step record's fields in StepRecord's order, those constant in this log filled."""
        self._last: int | None = None

    def _mesh(self, mesh: Any, dp_rank: int | None, dp_size: int | None, tp_rank: int | None,
              tp_size: int | None) -> semantics.MeshCoords | None:
        from ecrl.runtime.sampling.mesh import resolve_coords

        given = resolve_coords(mesh=mesh, dp_rank=dp_rank, dp_size=dp_size, tp_rank=tp_rank,
                               tp_size=tp_size, world_size=self.world_size, owner="StepLog")
        own = self.sampler.mesh_coords if self.sampler is not None else None
        if given is not None and self.sampler is None:
            raise ConfigError("StepLog(mesh=…) with an external sampler: auditing a mesh run "
                              "is not supported yet; use ecrl.GlobalBatchSampler(mesh=…)")
        if given is not None and own is None:
            raise ConfigError("StepLog(mesh=…) but the GlobalBatchSampler has no mesh: give it "
                              "the same mesh (it decides each rank's shard)")
        if given is not None and given != own:
            raise ConfigError(f"StepLog's mesh coordinates {given.as_fields()} disagree with "
                              f"the sampler's {own.as_fields() if own else None}: give both the "
                              "same mesh")
        if own is not None and own.world_size != self.world_size:
            raise ConfigError(f"the sampler's mesh has DP {own.dp_size} x TP {own.tp_size} = "
                              f"{own.world_size} ranks, but this job has {self.world_size}: "
                              "give the mesh this job trains on")
        return own

    def declare_checkpointing(self, *, strategy: str, every: int, fail_at: Sequence[int]
                              ) -> None:
        """What ``run.json`` says about checkpoints and failures when no supervisor set them
        (:class:`ecrl.Checkpointer` calls this)."""
        self._checkpointing = {"strategy": strategy, "ckpt_every": every,
                               "fail_at": sorted(set(fail_at))}

    # --- run.json --------------------------------------------------------------------------------

    def _planned(self) -> RunManifest:
        env = self.run.env
        if env is not None:
            # The strategy and interval the Checkpointer resolved (flag > script > default).
            settings: dict[str, Any] = {
                "strategy": self._checkpointing["strategy"],
                "ckpt_every": self._checkpointing["ckpt_every"],
                "fail_at": sorted(set(env.fail_at) | set(self._checkpointing["fail_at"])),
                "world_sizes": list(env.world_sizes) or [self.world_size]}
        else:
            settings = {**self._checkpointing, "world_sizes": [self.world_size]}
        return build_manifest(
            seed=self.seed, dataset=self.dataset, dataset_size=self.geometry.dataset_size,
            global_batch=self.geometry.global_batch, steps_per_epoch=self.steps_per_epoch,
            target_steps=self.steps, log_ids=self.log_ids, model=self.model,
            sampler=self.description,
            extra={} if self.deterministic is None else {"deterministic": self.deterministic},
            meshes=None if self.mesh_coords is None else _planned_meshes(
                settings["world_sizes"], self.mesh_coords.tp_size),
            **settings)

    def ensure_manifest(self) -> RunManifest:
        """``run.json``: written by rank 0 when absent, else checked against this run."""
        if self.manifest is not None:
            return self.manifest
        planned = self._planned()
        path = self.paths.manifest
        if path.exists():
            existing = read_json_record(path, RunManifest)
            check_same_run(existing, planned, where=path, fields=STREAM_FIELDS,
                           planned_by="this script has", fresh="a new run directory",
                           flags=False)
            self.manifest = existing
        else:
            if self.rank == 0:
                self.paths.root.mkdir(parents=True, exist_ok=True)
                write_json_record(path, planned)
            self.manifest = planned
        return self.manifest

    # --- step records ----------------------------------------------------------------------------

    def step(self, step: int, *, sample_ids: Any, loss: Any = None, epoch: int | None = None,
             cursor_step: int | None = None, **extra: Any) -> None:
        """Record global step ``step`` of this rank: the IDs its batch carried and its loss.

        Call it once per step, after the forward pass and before ``loss.backward()`` (before
        the step's gradients can enter the all-reduce). ``epoch``/``cursor_step``: required with an
        external sampler (from your loop), computed for ECRL's. Extra keyword arguments are
        recorded as additional fields.
        """
        step = int(step)
        if self._last is not None and step <= self._last:
            how = "twice" if step == self._last else f"after step {self._last}"
            raise SemanticsError(
                f"step {step} logged {how} (rank {self.rank}, attempt {self.attempt}): call "
                "log.step once per step, with increasing global steps")
        ids = _as_id_list(sample_ids)
        issued = self.sampler.take_issued(step) if self.sampler is not None else None
        if issued is not None and issued[0] == ids:
            # The batch holds what the sampler handed out for this step, whose hash it computed
            # with its block (hashing 30-odd IDs here would cost more than the rest of the call).
            digest = issued[1]
        else:
            digest = semantics.batch_ids_hash(ids)
        if step < 0:
            raise SemanticsError(f"log.step({step}): global steps start at 0")
        if self.sampler is not None:
            e, c = divmod(step, self.steps_per_epoch)
            if (epoch is not None and epoch != e) or (cursor_step is not None and cursor_step != c):
                raise SemanticsError(
                    f"step {step} is epoch {e}, cursor step {c} in ECRL's order, not "
                    f"({epoch}, {cursor_step}): leave epoch/cursor_step out with "
                    "GlobalBatchSampler")
            epoch, cursor_step = e, c
            if issued is not None:
                expected = (len(issued[0]), issued[1])
            elif self.check_ids:
                expected = self.sampler.expected(step)
            if self.check_ids and expected != (len(ids), digest):  # as multisets: order aside
                raise SemanticsError(
                    f"the batch logged as step {step} (rank {self.rank}) does not hold the IDs "
                    "the sampler scheduled for that step: the loop's step counter and the data "
                    "loader are out of step (start the loop at Checkpointer.restore()'s step, "
                    "one batch per step)")
        elif epoch is None or cursor_step is None:
            raise ConfigError("with an external sampler, log.step needs epoch= and cursor_step= "
                              "from your loop")
        elif int(epoch) < 0 or int(cursor_step) < 0:
            # Refused here, in the loop, rather than as a schema error the verifier meets later.
            raise ConfigError(f"log.step({step}): epoch={epoch} and cursor_step={cursor_step} "
                              "must be non-negative (the loop's epoch and its step within it)")
        elif ids and (min(ids) < 0 or max(ids) >= self.geometry.dataset_size):
            # Also at the first step rather than as the verifier's FAIL after the run: the IDs are
            # not the data set's the log was told of (a data set wrapped before random_split).
            size = self.geometry.dataset_size
            bad = next(i for i in ids if not 0 <= i < size)
            raise ConfigError(
                f"log.step({step}): sample ID {bad} is outside the data set's IDs 0..{size - 1}: "
                "wrap the training set itself in ecrl.WithSampleIds (after any random_split), "
                "or give dataset_size= the size its IDs count")
        if self._writer is None:
            self._open_writer()
        assert self._writer is not None and self._fixed is not None
        # The record as StepRecord.to_dict() writes it, its constant fields filled once (building
        # the frozen dataclass each step cost more than the rest of the record).
        record = self._fixed.copy()
        record.update(global_step=step, epoch=int(epoch), cursor_step=int(cursor_step),
                      local_batch=self.local_batch or max(1, len(ids)),
                      sample_ids_count=len(ids), sample_ids_hash=f"{digest:016x}",
                      loss=_as_loss(loss), time=time.time())
        if self.log_ids:
            record["sample_ids"] = ids
        if extra:
            record.update(extra)
        self._writer.write_dict(record)
        self._last = step
        if self.sampler is not None:
            self.sampler.step_done(step)

    def _open_writer(self) -> None:
        self.ensure_manifest()
        record_fresh_if_unrecorded(self.run)  # before any step record: attempt.json
        self._writer = JsonlWriter(self.paths.rank_log(self.attempt, self.rank))
        mesh: dict[str, Any] = self.mesh_coords.as_fields() if self.mesh_coords is not None \
            else {}
        self._fixed = StepRecord(
            attempt=self.attempt, global_step=0, epoch=0, cursor_step=0, rank=self.rank,
            world_size=self.world_size, local_batch=1, sample_ids_count=0,
            sample_ids_hash=semantics.format_hash(0), loss=None, time=0.0,
            sample_ids=[] if self.log_ids else None, **mesh).to_dict()

    @property
    def last_step(self) -> int | None:
        """The last step this rank logged in this attempt (None: none yet)."""
        return self._last

    def close(self) -> None:
        """Close the log. Once it logged the run's last step, the attempt is recorded as
        completed (``attempt.json``): call it after the loop, not on an error's way out (the
        ``with`` form leaves that record alone when an exception ends the block)."""
        self._close(completed=True)

    def _close(self, *, completed: bool) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            if completed and self._last == self.steps - 1:
                record_completed(self.run, self._last)

    def __enter__(self) -> StepLog:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        self._close(completed=kind is None)
