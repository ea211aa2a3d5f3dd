"""HF Accelerate: the step log, and Accelerate's own checkpoints (``save_state``/``load_state``).

Accelerate has no step hooks (the loop is the user's), but it has a checkpoint hook:
``accelerator.register_for_checkpointing(obj)`` saves ``obj.state_dict()`` in every
``save_state`` and hands it back to ``obj.load_state_dict`` in ``load_state``. ``ECRLTracker``
registers itself there, so each ``save_state`` leaves a checkpoint event at the last step the
loop logged, and each ``load_state`` records (``attempt.json``) which step the attempt resumed
from, before its first step record. The loop calls ``tracker.step(step, batch, loss=loss)``
once per optimizer step (the IDs come from the batch, ``ecrl.WithSampleIds``).

- **Audit** (``ECRLTracker(accelerator, run_dir, loader, steps=T)``, ``loader`` prepared by
  ``accelerator.prepare``): Accelerate keeps its sampler and the script its resume
  (``load_state`` + ``skip_first_batches``); the loop passes its own ``epoch=`` and
  ``cursor_step=``, and ``ecrl-verify`` audits what they did.
- **Exact** (``sampler=`` an :class:`ecrl.GlobalBatchSampler`, the loader built on it and passed
  through ``tracker.prepare(loader)``, not ``accelerator.prepare``): the sampler shards each
  window itself, so Accelerate must not shard it again (its ``BatchSamplerShard`` would give each
  rank every other shard: a loader prepared that way is refused in one line); its position rides
  in Accelerate's checkpoint (the tracker's state), so after ``load_state`` the loop runs from
  ``tracker.next_step`` (no ``skip_first_batches``), also at another world size. Accelerate
  steps a prepared LR scheduler once per process at every optimizer step (its global batch
  grows with the process count); ECRL's global batch does not, so the tracker makes each
  scheduler prepared before it step once per optimizer step (``split_batches``' rule), and the
  schedule continues unchanged after a resume at another world size.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import accelerate
from accelerate.data_loader import BatchSamplerShard, prepare_data_loader
from accelerate.scheduler import AcceleratedScheduler
from torch.utils.data import DataLoader

from ecrl.contract.errors import ConfigError
from ecrl.runtime.integrations._hooks import FrameworkCheckpoints, InjectedFailures, batch_ids
from ecrl.runtime.sampling.batch_sampler import GlobalBatchSampler
from ecrl.runtime.sampling.steplog import StepLog

__all__ = ["ECRLTracker"]


def _inner_batch_sampler(loader: Any) -> Any:
    batch_sampler = getattr(loader, "batch_sampler", None)
    if isinstance(batch_sampler, BatchSamplerShard):
        return batch_sampler, batch_sampler.batch_sampler
    return None, batch_sampler


class ECRLTracker:
    """Step records of an Accelerate loop, and the resume record of its ``load_state``.

    ``loader``: the training loader (audit: as ``accelerator.prepare`` returned it, for the data
    set size and the batch; exact: optional, checked not to shard ECRL's sampler twice).
    ``steps``: the run's target step count. Other keyword arguments go to :class:`ecrl.StepLog`.
    """

    def __init__(self, accelerator: accelerate.Accelerator,
                 run_dir: str | os.PathLike[str] | None = None, loader: Any = None, *,
                 steps: int, sampler: GlobalBatchSampler | None = None,
                 ids: Callable[[Any], Any] = batch_ids, **steplog: Any) -> None:
        self.accelerator = accelerator
        self.sampler = sampler
        self.ids = ids
        self.checkpoints = FrameworkCheckpoints("accelerate")
        self._last: int | None = None
        self._checked = False
        if sampler is not None:
            if loader is not None:
                self._check_not_sharded_twice(loader)
            self.log = StepLog(run_dir, sampler=sampler, steps=steps, **steplog)
        else:
            dataset = getattr(loader, "dataset", None)
            # Accelerate's prepared loader knows the batch of all processes together.
            batch = getattr(loader, "total_batch_size", None)
            if dataset is None or batch is None:
                raise ConfigError("ECRLTracker (audit mode) needs the training loader (as "
                                  "accelerator.prepare returned it): ECRLTracker(accelerator, "
                                  "run_dir, loader, steps=…)")
            kwargs = dict(steplog)
            kwargs.setdefault("steps_per_epoch", len(loader))
            self.log = StepLog(
                run_dir, sampler={"kind": "external", "name": "accelerate.prepare",
                                  "framework": f"accelerate {accelerate.__version__}"},
                dataset_size=len(dataset), global_batch=int(batch), steps=steps,
                **kwargs)
        self.failures = InjectedFailures(self.log.run)
        self._one_scheduler_step_per_step()
        accelerator.register_for_checkpointing(self)

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

    def _check_not_sharded_twice(self, loader: Any) -> None:
        shard, inner = _inner_batch_sampler(loader)
        if shard is not None and inner is self.sampler:
            raise ConfigError(
                "accelerator.prepare(loader) shards ECRL's GlobalBatchSampler a second time (each "
                "rank would get every other one of its own shards): pass the loader through "
                "tracker.prepare(loader) instead")
        if inner is not self.sampler:
            raise ConfigError("ECRLTracker(sampler=…): the loader's batch_sampler is not that "
                              "sampler: build it as DataLoader(ecrl.WithSampleIds(data), "
                              "batch_sampler=sampler)")

    def prepare(self, loader: DataLoader) -> Any:
        """``loader`` prepared by Accelerate (batches on the accelerator's device, known to
        ``save_state``) without Accelerate's sharding: ECRL's sampler shards the windows."""
        if self.sampler is None or loader.batch_sampler is not self.sampler:
            raise ConfigError("tracker.prepare(loader) is for a loader over the tracker's "
                              "GlobalBatchSampler; prepare others with accelerator.prepare")
        prepared = prepare_data_loader(
            loader, self.accelerator.device, num_processes=1, process_index=0,
            put_on_device=self.accelerator.device_placement, rng_types=None)
        prepared._is_accelerate_prepared = True
        return self.accelerator.prepare_data_loader(prepared)

    @property
    def next_step(self) -> int:
        """The step the loop runs next: 0, or the step after the one ``load_state`` restored."""
        return 0 if self._last is None else self._last + 1

    def step(self, step: int, batch: Any, *, loss: Any = None, epoch: int | None = None,
             cursor_step: int | None = None) -> None:
        """Record optimizer step ``step``: the IDs ``batch`` carried and its loss (audit mode:
        with the loop's own ``epoch`` and ``cursor_step``)."""
        if not self._checked and self.sampler is not None:
            # The first step of the attempt (a resumed one too: load_state set _last).
            self._checked = True
            # accelerator.prepare(loader) is not told about the tracker: look at what it made.
            for loader in getattr(self.accelerator, "_dataloaders", ()):
                shard, inner = _inner_batch_sampler(loader)
                if shard is not None and inner is self.sampler:
                    self._check_not_sharded_twice(loader)
            self._one_scheduler_step_per_step(late=True)
        self.failures.fire()  # a model without a forward hook: at the latest, here
        self.log.step(step, sample_ids=self.ids(batch), loss=loss, epoch=epoch,
                      cursor_step=cursor_step)
        self._last = int(step)
        self.failures.after(self._last)
        if self.failures.pending:
            # ecrl launch --fail-at: after this step and the save_state the loop does after it,
            # before the next step's collectives: at the next forward of a prepared model (were
            # it at the next tracker.step, the other ranks would finish that step, and might
            # save_state without the main process: a checkpoint folder without the model).
            for model in getattr(self.accelerator, "_models", ()):
                model.register_forward_pre_hook(lambda *_: self.failures.fire())

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
        """After the loop: the attempt is recorded as completed once it logged the last step."""
        self.checkpoints.close()
        self.log.close()
