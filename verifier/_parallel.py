"""Scanning rank logs in worker processes (``ecrl-verify --jobs N``, ``--ray``).

Parsing and proving the records of a rank log (:class:`verifier._scan.RankLog`) is almost all of
a verification's time, and each file is scanned on its own. So a worker scans one whole file and
sends back what the scan yields — the column batches, the file's torn last line, its fast-path
count, and the error that ended it — and the parent's :class:`verifier.ingest.Ingest` replays
those through the very loop that reads files in process (:class:`ScannedLog` stands in for the
:class:`RankLog`). The parent therefore takes the same batches in the same order whatever the
number of workers: the verdict, the witnesses and every report are identical to ``--jobs 1`` by
construction, not by a second implementation of the judgement.

What crosses the process boundary is small next to the records: a batch the fast path proved
carries its first step (its steps are consecutive), each record's time, its loss only when the
judgement wants losses, and its sample IDs only in a run that logs them. The parent holds the
columns of at most two attempts at a time (the one it judges, the next one being scanned).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ecrl.contract.errors import RunFormatError
from verifier._scan import Batch, RankLog

__all__ = ["ScanTask", "ScannedFile", "ScannedLog", "scan_file", "default_jobs", "process_pool",
           "Submit"]

Submit = Callable[["ScanTask"], "Future[ScannedFile]"]
"""Starts the scan of one file somewhere (a process pool, a Ray cluster)."""


def default_jobs() -> int:
    """The cores this process may run on (the default of ``--jobs``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True, slots=True)
class ScanTask:
    """Everything a worker needs to scan one rank log: the file and RankLog's arguments."""

    path: Path
    options: dict[str, Any]


@dataclass(slots=True)
class ScannedFile:
    """What scanning one rank log yielded, in order."""

    batches: list[tuple[Any, ...]]
    torn: tuple[int, str] | None
    fast_records: int
    error: tuple[str, int | None, str] | None
    """A :class:`RunFormatError` as ``(path, line, message)`` (it does not pickle as itself)."""


def _pack(batch: Batch) -> tuple[Any, ...]:
    steps: Any = batch.steps
    if batch.fast and len(batch):
        steps = int(batch.steps[0])  # the fast path proved them consecutive
    return (batch.first_line, steps, len(batch), batch.time, batch.fast, batch.loss, batch.ids,
            batch.id_block, batch.ints, batch.hashes, batch.mesh)


def _unpack(packed: tuple[Any, ...]) -> Batch:
    first_line, steps, n, time, fast, loss, ids, id_block, ints, hashes, mesh = packed
    if isinstance(steps, int):
        steps = np.arange(steps, steps + n, dtype=np.int64)
    return Batch(first_line=first_line, steps=steps, time=time, fast=fast, loss=loss, ids=ids,
                 id_block=id_block, ints=ints, hashes=hashes, mesh=mesh)


def scan_file(task: ScanTask) -> ScannedFile:
    """Scan one rank log to its end or its first error (runs in a worker)."""
    log = RankLog(task.path, **task.options)
    batches: list[tuple[Any, ...]] = []
    error = None
    try:
        for batch in log.batches():
            batches.append(_pack(batch))
    except RunFormatError as exc:
        error = (exc.path, exc.line, exc.message)
    return ScannedFile(batches=batches, torn=log.torn, fast_records=log.fast_records,
                       error=error)


class ScannedLog:
    """A rank log scanned elsewhere, read back like a :class:`RankLog`: the same attributes,
    and :meth:`batches` yields the same batches and raises the same error at the same point."""

    def __init__(self, path: Path, future: Future[ScannedFile], *, rank: int,
                 local_batch: int | None, start_step: int, world_size: int,
                 shard_rank: int | None = None, shard_world: int | None = None,
                 mesh_fields: tuple[int, int, int, int] | None = None) -> None:
        self.path = path
        self.rank = rank
        self.local_batch = local_batch
        self.shard_rank = rank if shard_rank is None else shard_rank
        self.shard_world = world_size if shard_world is None else shard_world
        self.mesh_fields = mesh_fields
        self.next_step = start_step
        self.torn: tuple[int, str] | None = None
        self.fast_records = 0
        self._future = future

    def batches(self) -> Iterator[Batch]:
        scanned = self._future.result()
        self.fast_records = scanned.fast_records
        for packed in scanned.batches:
            batch = _unpack(packed)
            if len(batch):
                self.next_step = int(batch.steps[-1]) + 1
            yield batch
        scanned.batches.clear()  # taken: let the columns go
        self.torn = scanned.torn
        if scanned.error is not None:
            raise RunFormatError(*scanned.error)


def process_pool(jobs: int) -> Executor:
    """A pool of ``jobs`` worker processes. Forked where the platform allows (a worker then
    starts in milliseconds with the verifier already imported), else the platform's default."""
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return ProcessPoolExecutor(max_workers=jobs, mp_context=context)
