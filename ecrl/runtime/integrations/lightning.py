"""PyTorch Lightning: the step log and Lightning's own checkpoints, from a ``Callback``.

``ECRLCallback(run_dir)`` in ``Trainer(callbacks=[...])`` and the data set wrapped in
:class:`ecrl.WithSampleIds` make a Lightning script write a verifiable run directory, whatever
launched it (Lightning's own launcher, ``torchrun``, a scheduler's requeue). Nothing else in the
script changes (three lines: the import, the wrapper, the callback):

- ``on_train_batch_start``/``on_before_backward``: one step record per optimizer step, with the
  IDs the batch carried (its ``SampleIdPair``) and the loss, written before the backward pass
  (before the rank's gradients can enter the step's all-reduce, as the step-record contract
  asks); the global step is Lightning's ``trainer.global_step`` before the step, the epoch and
  cursor Lightning's epoch and ``batch_idx``. A batch whose backward is not followed by an
  optimizer step is refused in one line at its end;
- ``training_step`` gets the batch without its IDs, as it would without ECRL: at ``setup`` the
  callback wraps the module's ``training_step`` (on that instance, undone at ``teardown``) to
  take the IDs off a :class:`~ecrl.runtime.sampling.sample_ids.SampleIdPair` batch, and so the
  module's ``validation_step``, ``test_step`` and ``predict_step`` (a loader over a wrapped data
  set there is fed to the step as it would be without the wrapper). A callback
  cannot change the batch Lightning hands the step, and the IDs must travel inside the batch
  (collation runs in the loader's workers). ``ECRLCallback(..., keep_ids=True)`` leaves them
  on;
- ``on_save_checkpoint``: a checkpoint event at the step the checkpoint captures, so a later
  resume from it is known to rest on a real checkpoint;
- ``on_load_checkpoint``: the attempt record (``attempt.json``) names the step Lightning resumed
  from and the SHA-256 of the file it loaded (``Trainer.fit(ckpt_path=...)``);
- under ``ecrl launch --fail-at``: the injected failure, as the batch after the step starts (after
  ``ModelCheckpoint``, which Lightning runs after the other callbacks, saved that step).

Two modes:

- **Audit** (``ECRLCallback(run_dir)``): Lightning keeps its sampler (the ``DistributedSampler``
  it injects), its checkpoints and its resume; ``ecrl-verify`` audits them (exactly-once per
  epoch, no window check). The data-set size, global batch, steps and steps per epoch are read
  from the trainer when training starts.
- **Exact** (``ECRLCallback(run_dir, sampler=sampler)`` with ``DataLoader(...,
  batch_sampler=sampler)``, ``sampler`` an :class:`ecrl.GlobalBatchSampler`): ECRL's order. The
  sampler's position rides in Lightning's own checkpoint (this callback's state), so
  ``fit(ckpt_path="last")`` continues at the next step's window, also at another world size; an
  epoch of Lightning is an epoch of ECRL (the sampler is switched to ``per_epoch``), so Lightning's
  ``global_step``, ``current_epoch`` and ``batch_idx`` are ECRL's step, epoch and cursor, and
  Lightning restores them itself. The callback turns off Lightning's distributed-sampler injection
  (``use_distributed_sampler``), which would otherwise try to rebuild the batch sampler around a
  ``DistributedSampler`` (a ``TypeError``) and shard ECRL's shards a second time.

Not covered: gradient accumulation (``accumulate_grad_batches > 1`` is refused), several
training loaders, ``pytorch_lightning`` (the standalone package: this subclasses
``lightning.pytorch.Callback``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch.utils.data import DistributedSampler

from ecrl.contract.errors import ConfigError
from ecrl.runtime.integrations._hooks import FrameworkCheckpoints, InjectedFailures, batch_ids
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.sample_ids import SampleIdPair, WithSampleIds
from ecrl.runtime.sampling.steplog import StepLog

# WithSampleIds and GlobalBatchSampler here too: a script adopts ECRL with one import line.
__all__ = ["ECRLCallback", "GlobalBatchSampler", "WithSampleIds"]


_STEPS = ("training_step", "validation_step", "test_step", "predict_step")
"""The module's methods that are handed a batch."""


class _WithoutIds:
    """A step method (``training_step`` …) handed the batch without the IDs
    :class:`WithSampleIds` put on it (a class, not a closure: the module stays picklable while it
    holds it)."""

    ecrl_strips_ids = True

    def __init__(self, step: Callable[..., Any]) -> None:
        functools.update_wrapper(self, step)
        self.step = step

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args and isinstance(args[0], SampleIdPair):
            args = (args[0].item, *args[1:])
        elif isinstance(kwargs.get("batch"), SampleIdPair):
            kwargs["batch"] = kwargs["batch"].item
        return self.step(*args, **kwargs)


class ECRLCallback(pl.Callback):
    """Step logs, checkpoint events and the resume record of a Lightning run.

    ``run_dir``: the run directory (None under ``ecrl launch``). ``sampler``: the
    :class:`ecrl.GlobalBatchSampler` of the training loader (exact mode); None keeps Lightning's
    sampler (audit mode). ``ids``: how to find the sample IDs in a batch (default: the IDs a
    :class:`ecrl.WithSampleIds` batch carries). Other keyword arguments go to
    :class:`ecrl.StepLog` (``log_ids``, ``model``, ``dataset``, ``epoch_coverage`` …).
    ``keep_ids``: the module's steps get the batch with its IDs, ``(ids, batch)`` (default:
    without them).
    """

    def __init__(self, run_dir: str | os.PathLike[str] | None = None, *,
                 sampler: GlobalBatchSampler | None = None,
                 ids: Callable[[Any], Any] = batch_ids, keep_ids: bool = False,
                 **steplog: Any) -> None:
        super().__init__()
        if sampler is not None and not isinstance(sampler, GlobalBatchSampler):
            raise ConfigError(f"ECRLCallback(sampler=…) takes an ecrl.GlobalBatchSampler, got "
                              f"{type(sampler).__name__}; leave it out to keep Lightning's "
                              "sampler (audit mode)")
        if sampler is not None:
            sampler.per_epoch = True  # an epoch of Lightning is an epoch of ECRL
        self.run_dir = run_dir
        self.sampler: GlobalBatchSampler | None = sampler
        self.ids = ids
        self.keep_ids = keep_ids
        self._replaced: dict[str, Any] = {}
        """The step methods wrapped on the module, each with the instance attribute it replaced
        (None: the class's method)."""
        self._steplog_kwargs = steplog
        self.step_log: StepLog | None = None
        self.checkpoints = FrameworkCheckpoints("lightning")
        self._step: int | None = None
        self._batch: tuple[Any, int, int] | None = None
        """The running batch, its epoch and index (from its start to its end)."""
        self._recorded = False
        self.failures: InjectedFailures | None = None

    # --- before training: the loader and the resume -------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self.sampler is not None:
            # Lightning would rebuild the batch sampler around a DistributedSampler of its own:
            # ECRL's sampler shards each window itself. (Validation loaders then keep theirs.)
            trainer._accelerator_connector.use_distributed_sampler = False
        if self.keep_ids:
            return
        for name in _STEPS:
            step = getattr(pl_module, name)
            if getattr(step, "ecrl_strips_ids", False) or not is_overridden(name, pl_module):
                continue
            self._replaced[name] = vars(pl_module).get(name)
            setattr(pl_module, name, _WithoutIds(step))

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        for name, own in self._replaced.items():
            if own is None:
                delattr(pl_module, name)  # the class's method again
            else:
                setattr(pl_module, name, own)
        self._replaced.clear()

    def state_dict(self) -> dict[str, Any]:
        return {} if self.sampler is None else {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.sampler is None:
            return
        if "sampler" not in state_dict:
            raise ConfigError(
                "the Lightning checkpoint being resumed holds no ECRL sampler position (written "
                "without ECRLCallback(sampler=…)): resume from one written with it, or start a "
                "new run directory")
        self.sampler.load_state_dict(state_dict["sampler"])

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        self.checkpoints.loaded(int(checkpoint["global_step"]) - 1, trainer.ckpt_path)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.accumulate_grad_batches != 1:
            raise ConfigError(
                f"ECRLCallback: accumulate_grad_batches={trainer.accumulate_grad_batches} is not "
                "supported (a step record is one batch per rank); leave it at 1")
        self.step_log = self._open_log(trainer)
        self.checkpoints.record(self.step_log.run)
        self.failures = InjectedFailures(self.step_log.run)

    def _open_log(self, trainer: pl.Trainer) -> StepLog:
        loader = trainer.train_dataloader
        ours = self.sampler
        if ours is not None:
            if id(getattr(loader, "batch_sampler", None)) != id(ours):
                raise ConfigError(
                    "ECRLCallback(sampler=…): the training DataLoader's batch_sampler is not that "
                    "sampler: build it as DataLoader(ecrl.WithSampleIds(data), "
                    "batch_sampler=sampler)")
            steps = ours.steps
            if steps is None:
                steps = trainer.max_steps
            if steps is None or steps < 1:
                raise ConfigError("ECRLCallback: give the sampler steps= (or the Trainer "
                                  "max_steps=): the run's target step count")
            return StepLog(self.run_dir, sampler=ours, steps=int(steps), **self._steplog_kwargs)
        world = trainer.world_size
        batch = getattr(loader, "batch_size", None)
        dataset = getattr(loader, "dataset", None)
        if batch is None or dataset is None:
            raise ConfigError("ECRLCallback (audit mode) needs a training DataLoader with a "
                              "batch_size and a sized data set")
        sampler = getattr(loader, "sampler", None)
        kwargs = dict(self._steplog_kwargs)
        drops = bool(getattr(loader, "drop_last", False)) or (
            isinstance(sampler, DistributedSampler) and sampler.drop_last)
        if drops and len(dataset) % (batch * world):
            kwargs.setdefault("epoch_coverage", "drop_remainder")
        steps = trainer.max_steps if trainer.max_steps and trainer.max_steps > 0 else \
            int(trainer.estimated_stepping_batches)
        kind = type(sampler)
        return StepLog(
            self.run_dir, sampler={"kind": "external",
                                   "name": f"{kind.__module__}.{kind.__qualname__}",
                                   "framework": f"lightning {pl.__version__}"},
            dataset_size=len(dataset), global_batch=batch * world, steps=int(steps),
            steps_per_epoch=int(trainer.num_training_batches), **kwargs)

    # --- every step ----------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             batch: Any, batch_idx: int) -> None:
        if self.failures is not None:
            # ecrl launch --fail-at: after the previous step and its checkpoint (Lightning runs
            # ModelCheckpoint's on_train_batch_end after ours).
            self.failures.fire()
        self._step = trainer.global_step
        self._batch = (batch, trainer.current_epoch, batch_idx)
        self._recorded = False

    def on_before_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           loss: Any) -> None:
        # The step record before the backward pass, hence before this rank's gradients can enter
        # the step's all-reduce (the step-record contract, docs/run-format.md): a rank that dies
        # after the all-reduce has logged the step its peers may go on to checkpoint.
        if self._batch is not None and not self._recorded:
            self._record(loss)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           outputs: Any, batch: Any, batch_idx: int) -> None:
        assert self.step_log is not None and self._step is not None
        stepped = trainer.global_step != self._step
        if not self._recorded and stepped:
            # An update without Lightning's backward (a manual loss.backward()): recorded now.
            self._record(outputs.get("loss") if isinstance(outputs, dict) else outputs)
        self._batch = None
        if not self._recorded:
            return  # no backward, no optimizer step (a skipped batch): nothing was consumed
        if not stepped:
            raise ConfigError(
                f"ECRLCallback: the batch of global step {self._step} went through backward but "
                "no optimizer step followed (the global step did not advance): one optimizer "
                "step per batch is supported, or the next batch would be logged as the same step")
        if self.failures is not None:
            self.failures.after(self._step)

    def _record(self, loss: Any) -> None:
        assert self.step_log is not None and self._step is not None and self._batch is not None
        batch, epoch, batch_idx = self._batch
        if self.sampler is not None:
            self.step_log.step(self._step, sample_ids=self.ids(batch), loss=loss)
        else:
            self.step_log.step(self._step, sample_ids=self.ids(batch), loss=loss, epoch=epoch,
                               cursor_step=batch_idx)
        self._recorded = True

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any]) -> None:
        if self.step_log is not None:
            self.checkpoints.saved(self.step_log.run, int(checkpoint["global_step"]) - 1, None, 0.0)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.checkpoints.close()
        if self.step_log is not None:
            self.step_log.close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        self.checkpoints.close()
        if self.step_log is not None:
            self.step_log._close(completed=False)
