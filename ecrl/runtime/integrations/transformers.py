"""transformers ``Trainer``: the step log and the Trainer's own checkpoints, from a callback.

``ECRLCallback(run_dir).attach(trainer)`` makes a ``Trainer`` script write a verifiable run
directory, whatever launched it (``torchrun``, ``accelerate launch``, a scheduler's requeue),
without subclassing ``Trainer``. A ``TrainerCallback`` never sees the batch, and the Trainer's
collation drops the keys its model does not take, so the sample IDs travel another way:

- ``attach`` wraps the training data set in :class:`ecrl.WithSampleIds` (items become
  ``(id, item)``) and the Trainer's collator in :class:`SampleIdCollator`, which hands the items
  to that collator and puts their IDs in the batch under ``"ecrl_sample_ids"``. The Trainer's
  column removal (``remove_unused_columns``) leaves ``(id, item)`` pairs alone (it only edits
  dicts), and collation runs in the loader's workers: the IDs travel inside the batch, also
  with ``dataloader_num_workers > 0``;
- a forward pre-hook on the model (installed at ``on_train_begin``) takes the IDs out of the
  forward's keyword arguments before the model sees them, and a forward hook takes the loss and,
  without gradient accumulation, writes the step's record (global step ``state.global_step``)
  before the backward pass, so before the rank's gradients can enter the all-reduce;
- ``on_step_end`` (after the optimizer step, before the Trainer's save of that step): with
  gradient accumulation, the record of the step's micro-batches (global step
  ``state.global_step - 1``; after the all-reduce: the last micro-batch is not known at its
  forward);
- ``on_save`` (after the Trainer wrote ``checkpoint-N``): a checkpoint event at step ``N - 1``;
- ``on_train_begin`` of a resumed attempt (``state.global_step`` restored from the checkpoint's
  ``trainer_state.json``): ``attempt.json`` names the step resumed from and the SHA-256 of that
  ``trainer_state.json`` when it is the output folder's ``checkpoint-N``;
- under ``ecrl launch --fail-at``: the injected failure, at ``on_step_begin`` of the step after
  (the Trainer saves a step's checkpoint after ``on_step_end``).

Two modes:

- **Audit** (``ECRLCallback(run_dir)``): the Trainer keeps its sampler (Accelerate's seedable
  sampler, sharded over the ranks), its checkpoints and its resume (``train(
  resume_from_checkpoint=True)``, which skips the resumed epoch's first batches); ``ecrl-verify``
  audits them (exactly-once per epoch, contiguous committed steps; no window check).
- **Exact** (``ECRLCallback(run_dir, sampler=sampler)``, ``sampler`` an
  :class:`ecrl.GlobalBatchSampler`): ECRL's order. ``attach`` makes the Trainer's train sampler
  the stream of ECRL's global windows in order (the one place the Trainer chooses it is its
  ``_get_train_sampler`` method, replaced on this one instance); Accelerate's usual sharding then
  gives rank ``r`` the ``r``-th local batch of each window, which is ECRL's shard. An epoch of
  the Trainer is an epoch of ECRL, so its ``global_step`` is ECRL's step and its own resume
  (skipping the resumed epoch's first batches, at the sampler level; the callback sets the
  epoch at ``on_epoch_begin``) continues at the next step's window, also at another world
  size; every batch is checked against the
  window ECRL scheduled for its step as it is logged (a mismatch stops the run in one line).

Not covered: a ``datasets.Dataset`` with columns the model does not take (``attach`` wraps it
before the Trainer removes them: drop them yourself), iterable data sets, several training
data sets, and in exact mode gradient accumulation (refused in one line: each rank's shard of a
step would be split over micro-batches in another order).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any

import torch
import transformers
from torch.utils.data import Sampler
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
from transformers.data.data_collator import default_data_collator

from ecrl.contract import semantics
from ecrl.contract.errors import ConfigError
from ecrl.runtime.integrations._hooks import FrameworkCheckpoints, InjectedFailures
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.sample_ids import SampleIdPair, WithSampleIds
from ecrl.runtime.sampling.steplog import StepLog

# GlobalBatchSampler here too: a script adopts exact mode with one import line.
__all__ = ["IDS_KEY", "ECRLCallback", "GlobalBatchSampler", "SampleIdCollator"]

IDS_KEY = "ecrl_sample_ids"
"""The batch key that carries the sample IDs from the collator to the model's forward."""


def _is_pair(item: Any) -> bool:
    return isinstance(item, (tuple, list)) and len(item) == 2 and isinstance(item[0], int)


class SampleIdCollator:
    """Collates ``(id, item)`` pairs (:class:`ecrl.WithSampleIds`): ``collator`` gets the items,
    and the batch it returns (a mapping) gets their IDs under ``"ecrl_sample_ids"``. A batch of
    anything else (an evaluation set without IDs) goes to ``collator`` unchanged."""

    def __init__(self, collator: Callable[[list[Any]], Any] | None = None) -> None:
        self.collator = default_data_collator if collator is None else collator

    def __call__(self, features: list[Any]) -> Any:
        if not features or not (all(type(f) is SampleIdPair for f in features)
                                or all(_is_pair(f) for f in features)):
            return self.collator(features)
        ids, items = zip(*features, strict=True)
        batch = self.collator(list(items))
        if not isinstance(batch, MutableMapping):
            raise ConfigError(f"SampleIdCollator: the collator returned a {type(batch).__name__}; "
                              "the Trainer's batches are mappings of the model's keyword "
                              "arguments")
        batch[IDS_KEY] = torch.tensor(ids, dtype=torch.int64)
        return batch


class _WindowStream(Sampler[int]):
    """ECRL's global windows of one epoch, in order, one sample ID at a time: the Trainer's
    batching and Accelerate's sharding (batch ``k`` of ``W`` consecutive local batches to rank
    ``k % W``) cut them into the ranks' shards. ``set_epoch`` (called by the Trainer before each
    epoch) picks the epoch."""

    def __init__(self, sampler: GlobalBatchSampler) -> None:
        self.sampler = sampler
        self.geometry = sampler.geometry
        self.seed = sampler.seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return self.geometry.steps_per_epoch * self.geometry.global_batch

    def __iter__(self) -> Iterator[int]:
        per = self.geometry.steps_per_epoch
        state = semantics.SamplerState.at_step(self.geometry, self.seed, self.epoch * per)
        end = (self.epoch + 1) * per
        rank, world = self.sampler.rank, self.sampler.world_size
        local = self.geometry.local_batch(world)
        for first, block in state.iter_shard_blocks(0, 1):  # a block never crosses an epoch
            # This rank's shard of each window (Accelerate hands rank r the r-th local batch of
            # each W): the step log compares the batch with it without computing it again.
            mine = block[:, rank * local:(rank + 1) * local]
            hashes = semantics.ids_hashes(mine).tolist()
            for i, (window, ids) in enumerate(zip(block.tolist(), mine.tolist(), strict=True)):
                self.sampler.note_issued(first + i, ids, hashes[i])
                yield from window
            if first + len(block) >= end:
                return


def _inner_sampler(loader: Any) -> Any:
    """The per-sample sampler under the Trainer's (Accelerate-prepared) training loader."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    batch_sampler = getattr(batch_sampler, "batch_sampler", batch_sampler)  # BatchSamplerShard
    return getattr(batch_sampler, "sampler", None)


def _loss_of(output: Any) -> Any:
    if isinstance(output, Mapping):
        return output.get("loss")
    return getattr(output, "loss", None)


class ECRLCallback(TrainerCallback):
    """Step logs, checkpoint events and the resume record of a ``Trainer`` run.

    ``run_dir``: the run directory (None under ``ecrl launch``). ``sampler``: an
    :class:`ecrl.GlobalBatchSampler` over the training set (exact mode); None keeps the Trainer's
    sampler (audit mode). Other keyword arguments go to :class:`ecrl.StepLog` (``log_ids``,
    ``model``, ``dataset``, ``epoch_coverage`` …). Call :meth:`attach` with the ``Trainer``.
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 sampler: GlobalBatchSampler | None = None, **steplog: Any) -> None:
        if sampler is not None and not isinstance(sampler, GlobalBatchSampler):
            raise ConfigError(f"ECRLCallback(sampler=…) takes an ecrl.GlobalBatchSampler, got "
                              f"{type(sampler).__name__}; leave it out to keep the Trainer's "
                              "sampler (audit mode)")
        self.run_dir = run_dir
        self.sampler = sampler
        self.stream = _WindowStream(sampler) if sampler is not None else None
        self._steplog_kwargs = steplog
        self.step_log: StepLog | None = None
        self.checkpoints = FrameworkCheckpoints("transformers")
        self.failures: InjectedFailures | None = None
        self._ids: list[int] = []
        self._losses: list[torch.Tensor] = []
        self._hooks: list[Any] = []
        self._steps_per_epoch = 1
        self._accumulation = 1
        self._state: TrainerState | None = None
        self._recorded_step: int | None = None
        """The step recorded at this step's forward (None: not yet)."""
        self._attached = False

    # --- before training -----------------------------------------------------------------------

    def attach(self, trainer: transformers.Trainer) -> ECRLCallback:
        """Add this callback to ``trainer``, wrap its training set for IDs and its collator to
        carry them; in exact mode, make ECRL's windows the Trainer's train sampler."""
        if self._attached:
            raise ConfigError("ECRLCallback.attach: this callback is attached already")
        if trainer.train_dataset is None:
            raise ConfigError("ECRLCallback.attach: the Trainer has no train_dataset")
        if not isinstance(trainer.train_dataset, WithSampleIds):
            trainer.train_dataset = WithSampleIds(trainer.train_dataset)
        if not isinstance(trainer.data_collator, SampleIdCollator):
            trainer.data_collator = SampleIdCollator(trainer.data_collator)
        if self.stream is not None:
            stream = self.stream
            # The Trainer's one place for its train sampler (transformers 5.x); on_train_begin
            # checks that the loader it built really draws from ECRL's windows.
            trainer._get_train_sampler = lambda *args, **kwargs: stream  # type: ignore[method-assign]
        trainer.add_callback(self)
        self._attached = True
        return self

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        model = kwargs.get("model")
        loader = kwargs.get("train_dataloader")
        if model is None or loader is None:
            raise ConfigError("ECRLCallback: the Trainer did not hand its model and training "
                              "loader to the callback (transformers 5.x does)")
        accumulation = int(args.gradient_accumulation_steps)
        per_rank = len(loader)
        self._steps_per_epoch = max(per_rank // accumulation + int(per_rank % accumulation > 0),
                                    1)
        self.step_log = self._open_log(args, state, loader, accumulation)
        self._accumulation = accumulation
        self._state = state  # the Trainer's one TrainerState, updated in place
        if state.global_step > 0:  # TrainerState came from the checkpoint being resumed
            self.checkpoints.loaded(state.global_step - 1,
                                    self._trainer_state_file(args, state.global_step))
        self.checkpoints.record(self.step_log.run)
        self.failures = InjectedFailures(self.step_log.run)
        self._hooks = [model.register_forward_pre_hook(self._take_ids, with_kwargs=True),
                       model.register_forward_hook(self._take_loss)]

    def _open_log(self, args: TrainingArguments, state: TrainerState, loader: Any,
                  accumulation: int) -> StepLog:
        world = int(args.world_size)
        if self.sampler is not None:
            assert self.stream is not None
            if _inner_sampler(loader) is not self.stream:
                raise ConfigError(
                    "ECRLCallback(sampler=…): the Trainer's training loader does not draw from "
                    "ECRL's windows: call ecrl_callback.attach(trainer) before trainer.train() "
                    "(and do not override get_train_dataloader)")
            if accumulation != 1:
                raise ConfigError(
                    f"ECRLCallback(sampler=…): gradient_accumulation_steps={accumulation} is not "
                    "supported in exact mode (a rank's shard of a step would be split over "
                    "micro-batches); leave it at 1")
            batch = self.sampler.geometry.global_batch
            if args.per_device_train_batch_size * world != batch:
                raise ConfigError(
                    f"ECRLCallback(sampler=…): per_device_train_batch_size="
                    f"{args.per_device_train_batch_size} on {world} processes is not the "
                    f"sampler's global batch {batch}: give per_device_train_batch_size="
                    f"{batch // world if batch % world == 0 else 'B / world size'}")
            steps = self.sampler.steps if self.sampler.steps is not None else state.max_steps
            if steps != state.max_steps:
                raise ConfigError(f"ECRLCallback: the sampler's steps={steps} is not the "
                                  f"Trainer's max_steps={state.max_steps}: give both the same")
            return StepLog(self.run_dir, sampler=self.sampler, steps=int(steps),
                           **self._steplog_kwargs)
        dataset = getattr(loader, "dataset", None)
        if dataset is None:
            raise ConfigError("ECRLCallback (audit mode) needs a sized training data set")
        global_batch = int(args.per_device_train_batch_size) * world * accumulation
        kwargs = dict(self._steplog_kwargs)
        if args.dataloader_drop_last and len(dataset) % global_batch:
            kwargs.setdefault("epoch_coverage", "drop_remainder")
        kind = type(_inner_sampler(loader))
        return StepLog(
            self.run_dir, sampler={"kind": "external",
                                   "name": f"{kind.__module__}.{kind.__qualname__}",
                                   "framework": f"transformers {transformers.__version__}"},
            dataset_size=len(dataset), global_batch=global_batch, steps=int(state.max_steps),
            steps_per_epoch=self._steps_per_epoch, **kwargs)

    @staticmethod
    def _trainer_state_file(args: TrainingArguments, global_step: int) -> str | None:
        """The ``trainer_state.json`` the Trainer resumed from, when it is the output folder's
        ``checkpoint-N`` of that step (a checkpoint given by another path: None)."""
        path = os.path.join(str(args.output_dir), f"checkpoint-{global_step}",
                            "trainer_state.json")
        try:
            with open(path, encoding="utf-8") as fh:
                saved = json.load(fh).get("global_step")
        except (OSError, ValueError, AttributeError):
            return None
        return path if saved == global_step else None

    # --- every step ----------------------------------------------------------------------------

    def _take_ids(self, module: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        ids = kwargs.pop(IDS_KEY, None)
        if ids is None:
            if module.training:
                raise ConfigError(
                    "ECRLCallback: a training batch reached the model without its sample IDs: "
                    "call ecrl_callback.attach(trainer) (or give the Trainer "
                    "ecrl.WithSampleIds(data) and SampleIdCollator(collator))")
            return None
        if module.training and self._recorded_step is None:
            # (A second forward of a step already recorded — a compute_loss that runs the model
            # twice on its batch — consumes no other samples: its IDs are not counted again.)
            self._ids.extend(ids.tolist())
        return args, kwargs

    def _take_loss(self, module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        loss = _loss_of(output)
        if not module.training or not isinstance(loss, torch.Tensor) \
                or self._recorded_step is not None:
            return
        if self._accumulation == 1 and self._state is not None:
            # The step record right after the forward, before the backward (so before this
            # rank's gradients can enter the step's all-reduce: the step-record contract). With
            # gradient accumulation the last micro-batch is not known here: on_step_end records.
            self._record(self._state.global_step, loss)
        else:
            # Kept as it is: the step log reads it once (each call into torch costs ~10 µs of
            # cold caches here, of a per-step budget of 100).
            self._losses.append(loss)

    def _record(self, step: int, loss: Any) -> None:
        assert self.step_log is not None
        ids, self._ids = self._ids, []
        if self.sampler is not None:
            self.step_log.step(step, sample_ids=ids, loss=loss)
        else:
            epoch, cursor = divmod(step, self._steps_per_epoch)
            self.step_log.step(step, sample_ids=ids, loss=loss, epoch=epoch, cursor_step=cursor)
        self._recorded_step = step

    def on_epoch_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, **kwargs: Any) -> None:
        if self.stream is not None:
            # Before the epoch's iterator exists. Not left to the loader's set_epoch: on a
            # resume in the middle of an epoch at several ranks, the Trainer's loader is
            # SkipBatchSampler(BatchSamplerShard(BatchSampler(sampler))), one level deeper than
            # Accelerate 1.15's DataLoaderShard.set_epoch reaches (it wires a shortcut,
            # set_sampler, for its own SeedableRandomSampler only), and the resumed epoch
            # would get epoch 0's windows.
            self.stream.set_epoch(state.global_step // self._steps_per_epoch)

    def on_step_begin(self, args: TrainingArguments, state: TrainerState,
                      control: TrainerControl, **kwargs: Any) -> None:
        if self.failures is not None:
            # ecrl launch --fail-at: after the previous step and the checkpoint the Trainer
            # saved after its on_step_end, before this step's collectives.
            self.failures.fire()
        self._recorded_step = None

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        assert self.step_log is not None
        step = state.global_step - 1
        recorded = self._recorded_step
        if recorded is None:  # gradient accumulation (or a forward without a loss)
            losses, self._losses = self._losses, []
            loss = losses[0] if len(losses) == 1 else sum(
                float(x.detach().float().mean()) for x in losses) / len(losses) if losses else None
            self._record(step, loss)
        elif recorded != step:
            raise ConfigError(
                f"ECRLCallback: the step recorded at the forward ({recorded}) is not the step "
                f"the Trainer ended ({step}): one optimizer step per batch is supported")
        self._recorded_step = None
        if self.failures is not None:
            self.failures.after(step)

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        if self.step_log is not None:
            self.checkpoints.saved(self.step_log.run, state.global_step - 1, None, 0.0)

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        self.checkpoints.close()
        if self.step_log is not None:
            self.step_log.close()
