"""HF Accelerate: the step log, and Accelerate's own checkpoints (``save_state``/``load_state``).

``ECRLTracker(accelerator, run_dir, loader, steps=T)``, after ``accelerator.prepare`` and the
data set wrapped in :class:`ecrl.WithSampleIds`, makes an Accelerate script write a verifiable
run directory, whatever launched it (``accelerate launch``, ``torchrun``, a scheduler's requeue).
Nothing else in the loop changes (three lines: the import, the wrapper, the tracker). Accelerate
has no step hooks (the loop is the script's), so the tracker hooks what every Accelerate loop
calls, on that one ``Accelerator`` and loader:

- the training loader (its class swapped for a subclass on that instance, and so is any loader
  ``accelerator.skip_first_batches`` makes of it): each batch reaches the loop without its IDs,
  as it would without ECRL (``keep_ids=True`` leaves them on), and the tracker keeps them;
- ``accelerator.backward(loss)``: one step record per optimizer step, with those IDs and the
  loss, before the backward's gradient all-reduce (the run format's rule), at the step after the
  last one recorded (or restored by ``load_state``); gradient accumulation is refused in one line
  (one backward is one step);
- ``accelerator.register_for_checkpointing(tracker)``: each ``save_state`` leaves a checkpoint
  event at the last step recorded, and each ``load_state`` records (``attempt.json``) which step
  the attempt resumed from, before its first step record;
- at the process's exit (a ``weakref.finalize``; ``tracker.close()`` does it earlier): the
  attempt is recorded as completed once it recorded the run's last step (a killed process
  records nothing);
- under ``ecrl launch --fail-at``: the injected failure, when the loop asks for the next batch
  (after the step and the ``save_state`` the loop does after it, before the next step's
  collectives).

Two modes:

- **Audit** (``ECRLTracker(accelerator, run_dir, loader, steps=T)``): Accelerate keeps its sampler
  and the script its resume (``load_state`` + ``skip_first_batches``); a step's epoch and cursor
  are ``divmod(step, len(loader))`` (how Accelerate's documented resume counts them), and
  ``ecrl-verify`` audits what they did.
- **Exact** (``sampler=`` an :class:`ecrl.GlobalBatchSampler`, the loader built on it and
  prepared by ``accelerator.prepare`` as usual): the sampler shards each window itself, so the
  tracker turns off, on that loader, the sharding Accelerate added (its ``BatchSamplerShard``
  would give each rank every other one of its own shards). The sampler's position rides in
  Accelerate's checkpoint (the tracker's state), so after ``load_state`` the loader continues at
  the next step's window, also at another world size; ``skip_first_batches`` of that loader
  skips nothing (ECRL's sampler starts there already), so the documented resume runs unchanged.
  Accelerate steps a prepared LR scheduler once per process at every optimizer step (its global
  batch grows with the process count); ECRL's global batch does not, so the tracker makes each
  scheduler prepared before it step once per optimizer step (``split_batches``' rule), and the
  schedule continues unchanged after a resume at another world size.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import accelerate
from accelerate.data_loader import BatchSamplerShard, DataLoaderDispatcher, DataLoaderShard
from accelerate.scheduler import AcceleratedScheduler

from ecrl.contract.errors import ConfigError
from ecrl.runtime.integrations._hooks import FrameworkCheckpoints, InjectedFailures, batch_ids
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.sample_ids import SampleIdPair, WithSampleIds
from ecrl.runtime.sampling.steplog import StepLog

# WithSampleIds and GlobalBatchSampler here too: a script adopts ECRL with one import line.
__all__ = ["ECRLTracker", "GlobalBatchSampler", "WithSampleIds"]


def _inner_batch_sampler(loader: Any) -> tuple[BatchSamplerShard | None, Any]:
    batch_sampler = getattr(loader, "batch_sampler", None)
    if isinstance(batch_sampler, BatchSamplerShard):
        return batch_sampler, batch_sampler.batch_sampler
    return None, batch_sampler


_TRACKED: dict[type, type] = {}
_set_class = object.__dict__["__class__"].__set__


def _tracked_class(base: type) -> type:
    """``base`` (a loader class), whose iteration hands each batch to the loader's tracker."""
    if base not in _TRACKED:
        base_iter: Callable[[Any], Iterator[Any]] = base.__iter__  # type: ignore[attr-defined]

        def __iter__(self: Any) -> Iterator[Any]:
            tracker = self.ecrl_tracker
            for batch in base_iter(self):
                yield tracker._arrived(batch)

        _TRACKED[base] = type(f"Tracked{base.__name__}", (base,), {"__iter__": __iter__})
    return _TRACKED[base]


def _close_log(checkpoints: FrameworkCheckpoints, log: StepLog) -> None:
    checkpoints.close()
    log.close()


class ECRLTracker:
    """Step records of an Accelerate loop, and the resume record of its ``load_state``.

    ``loader``: the training loader as ``accelerator.prepare`` returned it. ``steps``: the run's
    target step count. ``sampler``: the :class:`ecrl.GlobalBatchSampler` the loader was built on
    (exact mode); None keeps Accelerate's (audit mode). ``ids``: how to find the sample IDs in a
    batch (default: the IDs a :class:`ecrl.WithSampleIds` batch carries); ``keep_ids``: the
    loop gets the batch with its IDs, ``(ids, batch)``. Other keyword arguments go to
    :class:`ecrl.StepLog`.
    """

    def __init__(self, accelerator: accelerate.Accelerator,
                 run_dir: str | os.PathLike[str] | None = None, loader: Any = None, *,
                 steps: int, sampler: GlobalBatchSampler | None = None,
                 ids: Callable[[Any], Any] = batch_ids, keep_ids: bool = False,
                 **steplog: Any) -> None:
        if not isinstance(loader, (DataLoaderShard, DataLoaderDispatcher)):
            raise ConfigError(
                f"ECRLTracker needs the training loader as accelerator.prepare returned it (got "
                f"{type(loader).__name__}): model, optimizer, loader = accelerator.prepare(…), "
                "then ECRLTracker(accelerator, run_dir, loader, steps=…)")
        if isinstance(loader, DataLoaderDispatcher):
            raise ConfigError("ECRLTracker: Accelerate's dispatch_batches is not supported (rank "
                              "0 reads every rank's batch): prepare the loader without it")
        if accelerator.gradient_accumulation_steps != 1:
            raise ConfigError(
                f"ECRLTracker: gradient_accumulation_steps="
                f"{accelerator.gradient_accumulation_steps} is not supported (a step record is "
                "one backward of one batch per rank); leave it at 1")
        self.accelerator = accelerator
        self.sampler = sampler
        self.ids = ids
        self.keep_ids = keep_ids
        self.checkpoints = FrameworkCheckpoints("accelerate")
        self._last: int | None = None
        self._batch_ids: Any = None
        self._checked = False
        self._steps_per_epoch = 0  # audit mode's: len(loader)
        if sampler is not None:
            self._unshard(loader)
            self.log = StepLog(run_dir, sampler=sampler, steps=steps, **steplog)
        else:
            # Accelerate's prepared loader knows the batch of all processes together.
            batch = getattr(loader, "total_batch_size", None)
            assert batch is not None  # a prepared loader's
            self._steps_per_epoch = len(loader)
            kwargs = dict(steplog)
            kwargs.setdefault("steps_per_epoch", self._steps_per_epoch)
            self.log = StepLog(
                run_dir, sampler={"kind": "external", "name": "accelerate.prepare",
                                  "framework": f"accelerate {accelerate.__version__}"},
                dataset_size=len(loader.dataset), global_batch=int(batch), steps=steps,
                **kwargs)
        self.failures = InjectedFailures(self.log.run)
        self._one_scheduler_step_per_step()
        self._track(loader)
        self._hook_accelerator()
        accelerator.register_for_checkpointing(self)
        # At exit, or when the tracker is collected with its Accelerator: a finalizer holds the
        # log, not the tracker (an atexit hook would keep the Accelerator and its DDP model alive
        # until the interpreter's end).
        self._closer = weakref.finalize(self, _close_log, self.checkpoints, self.log)

    # --- what the tracker hooks ---------------------------------------------------------------

    def _track(self, loader: Any) -> Any:
        loader.ecrl_tracker = self
        # Accelerate's loaders answer ``__class__`` with their inner DataLoader's class (a
        # read-only property, for isinstance checks downstream), so the class is set through
        # object's own descriptor. The instance stays a DataLoaderShard to Accelerate.
        _set_class(loader, _tracked_class(type(loader)))
        return loader

    def _hook_accelerator(self) -> None:
        accelerator = self.accelerator
        backward = accelerator.backward
        skip_first_batches = accelerator.skip_first_batches

        def backward_recorded(loss: Any, **kwargs: Any) -> Any:
            self._record(loss)  # before the gradient all-reduce the backward starts
            return backward(loss, **kwargs)

        def skip_first_batches_tracked(dataloader: Any, num_batches: int = 0) -> Any:
            if getattr(dataloader, "ecrl_tracker", None) is not self:
                return skip_first_batches(dataloader, num_batches)
            if self.sampler is not None:
                return dataloader  # ECRL's sampler starts at the resumed step's window already
            return self._track(skip_first_batches(dataloader, num_batches))

        accelerator.backward = backward_recorded
        accelerator.skip_first_batches = skip_first_batches_tracked

    def _unshard(self, loader: Any) -> None:
        """Exact mode: ECRL's sampler shards each window; Accelerate must not shard it again."""
        shard, inner = _inner_batch_sampler(loader)
        if inner is not self.sampler:
            raise ConfigError("ECRLTracker(sampler=…): the loader's batch_sampler is not that "
                              "sampler: build it as DataLoader(ecrl.WithSampleIds(data), "
                              "batch_sampler=sampler), then accelerator.prepare it")
        if shard is not None:
            # Every batch of the inner sampler to this process: ECRL's shard of each window.
            shard.num_processes, shard.process_index = 1, 0

    def _one_scheduler_step_per_step(self, *, late: bool = False) -> None:
        """Exact mode: each scheduler Accelerate prepared steps once per optimizer step."""
        if self.sampler is None:
            return
        for scheduler in getattr(self.accelerator, "_schedulers", ()):
            if isinstance(scheduler, AcceleratedScheduler) and not scheduler.split_batches:
                if late and self.accelerator.num_processes > 1:
                    raise ConfigError(
                        "an LR scheduler was prepared after ECRLTracker(sampler=…) and has "
                        f"stepped {self.accelerator.num_processes} times per step (Accelerate's "
                        "rule for a batch that grows with the processes; ECRL's global batch "
                        "does not): call accelerator.prepare(scheduler) before creating the "
                        "tracker")
                scheduler.split_batches = True

    # --- every step ----------------------------------------------------------------------------

    def _arrived(self, batch: Any) -> Any:
        """A batch of the tracked loader, on its way to the loop: keep its IDs."""
        # ecrl launch --fail-at: the loop asks for the next batch after the step and its
        # save_state, before the next step's collectives.
        self.failures.fire()
        if not self._checked:
            self._checked = True  # the attempt's first batch (a resumed attempt's too)
            self._one_scheduler_step_per_step(late=True)
        self._batch_ids = self.ids(batch)
        if isinstance(batch, SampleIdPair) and not self.keep_ids:
            return batch.item
        return batch

    def _record(self, loss: Any) -> None:
        """``accelerator.backward(loss)``: the step of the batch the loop took last."""
        if self._batch_ids is None:
            raise ConfigError(
                "accelerator.backward without a new batch from the tracked loader: ECRLTracker "
                "records one step per backward of one batch (several backward calls per batch, "
                "or batches from another loader, are not supported)")
        step = self.next_step
        if self.sampler is not None:
            self.log.step(step, sample_ids=self._batch_ids, loss=loss)
        else:
            epoch, cursor = divmod(step, self._steps_per_epoch)
            self.log.step(step, sample_ids=self._batch_ids, loss=loss, epoch=epoch,
                          cursor_step=cursor)
        self._batch_ids = None
        self._last = step
        self.failures.after(step)

    @property
    def next_step(self) -> int:
        """The step the loop runs next: 0, or the step after the last one recorded or restored
        by ``load_state``."""
        return 0 if self._last is None else self._last + 1

    # --- Accelerate's checkpoint hook (register_for_checkpointing) -----------------------------
    def state_dict(self) -> dict[str, Any]:
        """Called by ``save_state``: the checkpoint holds the state after the last logged step."""
        if self._last is not None:
            self.checkpoints.saved(self.log.run, self._last, None, 0.0)
        state: dict[str, Any] = {"last_step": self._last}
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Called by ``load_state``: the attempt resumes after ``last_step``."""
        last = state.get("last_step")
        if self.sampler is not None:
            if "sampler" not in state:
                raise ConfigError("the Accelerate checkpoint being loaded holds no ECRL sampler "
                                  "position: load one saved with ECRLTracker(sampler=…)")
            self.sampler.load_state_dict(state["sampler"])
        self._last = None if last is None else int(last)
        if self._last is not None:
            self.checkpoints.loaded(self._last, None)
            self.checkpoints.record(self.log.run)

    def close(self) -> None:
        """After the loop (or at exit, by itself): the attempt is recorded as completed once
        it logged the run's last step."""
        self._closer()
