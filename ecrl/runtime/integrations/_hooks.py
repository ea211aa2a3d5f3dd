"""What every framework integration does at the framework's own hooks.

A framework keeps its checkpoints; ECRL records what the verifier needs about them, in the run
format's own files: a checkpoint event (``checkpoint_rank0.jsonl``) when the framework saves, so
that a later attempt's resume from that step is known to rest on a real checkpoint, and the
attempt record (``attempt.json``) of an attempt that resumed from one, with the SHA-256 of the
file the framework loaded.

Under ``ecrl launch --fail-at`` the integration also injects the supervisor's failures
(:class:`InjectedFailures`): the framework's loop has no :class:`ecrl.Checkpointer` to do it, and
a failure the integration ignored would let the run end "completed" with none of the recoveries
it was asked to prove.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Mapping
from typing import Any

from ecrl.contract.errors import ConfigError
from ecrl.contract.runformat import CheckpointEvent, JsonlWriter
from ecrl.runtime._attempt import Attempt, record_attempt
from ecrl.runtime.failure import inject
from ecrl.runtime.sampling.sample_ids import SampleIdPair

__all__ = ["FrameworkCheckpoints", "InjectedFailures", "batch_ids", "file_checksum"]


def file_checksum(path: str | os.PathLike[str] | None) -> str | None:
    """``sha256:<hex>`` of a checkpoint file the framework loaded (None: not one readable
    file, e.g. a directory of shards)."""
    if path is None or not os.path.isfile(path):
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return "sha256:" + digest.hexdigest()


def batch_ids(batch: Any) -> Any:
    """The sample IDs of a batch built from :class:`ecrl.WithSampleIds` (a
    :class:`~ecrl.runtime.sampling.sample_ids.SampleIdPair`) or a mapping holding
    ``sample_ids``. Any other batch is refused: a plain ``[x, y]`` is not ``(ids, batch)``, and
    taking its ``x`` (token IDs, say) for sample IDs would log what no sampler chose."""
    if isinstance(batch, SampleIdPair):
        return batch.sample_id
    if isinstance(batch, Mapping) and "sample_ids" in batch:
        return batch["sample_ids"]
    raise ConfigError(
        f"cannot find the sample IDs in a batch of type {type(batch).__name__}: wrap the "
        "training data set in ecrl.WithSampleIds (its batches carry their IDs), or pass "
        "ids=<function of the batch> to the integration")


class FrameworkCheckpoints:
    """The checkpoint events and the resume record of one attempt whose checkpoints the
    framework writes and loads (rank 0 writes; the other ranks do nothing)."""

    def __init__(self, framework: str) -> None:
        self.framework = framework
        self._events: JsonlWriter | None = None
        self._last: int | None = None
        self.resumed: tuple[int, str | None] | None = None

    def loaded(self, step: int, path: str | os.PathLike[str] | None) -> None:
        """The framework loaded its checkpoint of the state after global step ``step``."""
        self.resumed = (int(step), file_checksum(path))

    def record(self, attempt: Attempt) -> None:
        """``attempt.json``: before the attempt's first step record."""
        record_attempt(attempt, resumed=self.resumed)

    def saved(self, attempt: Attempt, step: int, path: str | None, seconds: float) -> None:
        """The framework is saving its checkpoint of the state after global step ``step``."""
        if attempt.rank != 0 or step < 0 or step == self._last:
            return  # a second file of the same state (Lightning's last.ckpt) is one checkpoint
        self._last = step
        if self._events is None:
            self._events = JsonlWriter(attempt.paths.checkpoint_log(attempt.attempt))
        self._events.write(CheckpointEvent(
            global_step=int(step), strategy=self.framework, snapshot_s=0.0, write_s=seconds,
            enqueue_s=0.0, backpressure_s=0.0, stall_s=seconds, bytes=0,
            path=path or "", extra={"attempt": attempt.attempt, "written_by": self.framework,
                                    "time": time.time()}))

    def close(self) -> None:
        if self._events is not None:
            self._events.close()
            self._events = None


class InjectedFailures:
    """The failures ``ecrl launch --fail-at`` asked of this attempt (none when standalone).

    A failure "after step s" fires once the step and any checkpoint the framework writes after
    it are done (:mod:`ecrl.runtime.failure`): the framework's checkpoint hooks run after the
    step's own hook (Lightning orders its ``ModelCheckpoint`` last; an Accelerate loop calls
    ``save_state`` after the step's ``backward``), so :meth:`after` only marks it, and
    :meth:`fire` — as the next step starts (Lightning: its batch hook; Accelerate: the loop
    asking for the next batch; the Trainer: ``on_step_begin``) — exits the process like a kill
    (``os._exit(137)``, with the marker the supervisor reads so that a relaunch does not fire it
    again)."""

    def __init__(self, attempt: Attempt) -> None:
        env = attempt.env
        self.attempt = attempt
        self.steps = frozenset(env.fail_at) if env is not None else frozenset()
        self.rank = env.fail_rank if env is not None else 0
        self._pending: int | None = None

    def after(self, step: int) -> None:
        if step in self.steps and self.attempt.rank == self.rank:
            self._pending = int(step)

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def fire(self) -> None:
        if self._pending is not None:
            inject(self.attempt.paths, attempt=self.attempt.attempt, step=self._pending,
                   rank=self.rank)
