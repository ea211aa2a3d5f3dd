"""Committing a checkpoint durably (torch-free: the background writer process runs this too).

The protocol, in this order (ARCHITECTURE.md, "Checkpoints"):

1. seal the image (SHA-256 footer, :func:`ecrl.contract.ckptfile.seal`);
2. write ``checkpoints/step-GGGGGGGG.ckpt`` atomically: temporary file, flush, fsync, rename,
   directory fsync (:func:`ecrl.contract.atomicio.atomic_write_bytes`);
3. record the checkpoint: the caller's ``before_publish`` appends its event to
   ``checkpoint_rank0.jsonl`` (so every checkpoint ``latest.json`` ever names has an event, which
   is how the verifier knows a resumed attempt loaded a real checkpoint);
4. replace ``checkpoints/latest.json`` the same way, naming the file and its checksum;
5. delete checkpoints older than the newest ``keep`` (never the one ``latest.json`` names).

A crash before step 4 completes leaves ``latest.json`` naming the previous checkpoint, which is
still whole: step 4 of the previous commit never deleted it. ``ECRL_CRASH_AT`` lets tests kill the
process between any two protocol steps (:class:`CrashHook`).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ecrl.contract.atomicio import CRASH_POINTS, atomic_write_bytes
from ecrl.contract.ckptfile import (
    FOOTER_SIZE,
    CheckpointError,
    VerifiedCheckpoint,
    read_verified,
    seal,
)
from ecrl.contract.runformat import LatestPointer, RunPaths, read_json_record, write_json_record

__all__ = [
    "CRASH_ENV",
    "CRASH_EXIT_CODE",
    "CrashHook",
    "CommitResult",
    "checkpoint_name",
    "checkpoint_step",
    "commit_checkpoint",
    "read_latest",
    "load_latest_verified",
    "apply_retention",
    "clean_temporaries",
]

CRASH_ENV = "ECRL_CRASH_AT"
"""``TARGET:POINT[:N[:ATTEMPT]]``: crash at ``POINT`` of the N-th (default 1st) write of
``TARGET`` (``checkpoint`` or ``latest``) in one process, optionally only in attempt ATTEMPT."""
CRASH_EXIT_CODE = 137
CRASH_TARGETS = ("checkpoint", "latest")
_NAME = re.compile(r"^step-(\d{8,})\.ckpt$")


def checkpoint_name(global_step: int) -> str:
    """File name (inside ``checkpoints/``) of the checkpoint taken after ``global_step``."""
    return f"step-{global_step:08d}.ckpt"


def checkpoint_step(name: str) -> int | None:
    """Inverse of :func:`checkpoint_name`; None for any other file."""
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


class CrashHook:
    """Test hook: ``os._exit(137)`` at a configured point of the checkpoint protocol."""

    def __init__(self, spec: str | None, *, attempt: int | None) -> None:
        self.target: str | None = None
        self.point = ""
        self.nth = 1
        self._counts = dict.fromkeys(CRASH_TARGETS, 0)
        if not spec:
            return
        parts = spec.split(":")
        if not 2 <= len(parts) <= 4 or parts[0] not in CRASH_TARGETS \
                or parts[1] not in CRASH_POINTS or not all(p.isdigit() for p in parts[2:]):
            raise ValueError(
                f"{CRASH_ENV}={spec!r}: expected TARGET:POINT[:N[:ATTEMPT]] with TARGET in "
                f"{CRASH_TARGETS} and POINT in {CRASH_POINTS}"
            )
        if len(parts) == 4 and attempt != int(parts[3]):
            return
        self.target, self.point = parts[0], parts[1]
        self.nth = int(parts[2]) if len(parts) >= 3 else 1

    @classmethod
    def from_env(cls, *, attempt: int | None) -> CrashHook:
        return cls(os.environ.get(CRASH_ENV), attempt=attempt)

    def for_write(self, target: str) -> Callable[[str], None] | None:
        """The atomicio hook for the next write of ``target`` (None when nothing can fire)."""
        self._counts[target] += 1
        if target != self.target or self._counts[target] != self.nth:
            return None

        def hook(point: str) -> None:
            if point == self.point:
                os._exit(CRASH_EXIT_CODE)

        return hook


@dataclass(frozen=True, kw_only=True, slots=True)
class CommitResult:
    """What one commit did, for the checkpoint event record."""

    path: str
    """File name relative to ``checkpoints/``."""
    checksum: str
    bytes: int
    write_s: float
    """Sealing (hash) and writing the checkpoint file durably."""
    publish_s: float
    """Replacing ``latest.json`` and applying retention."""


def commit_checkpoint(
    paths: RunPaths,
    image: memoryview,
    size: int,
    *,
    global_step: int,
    epoch: int,
    cursor_step: int,
    world_size: int,
    keep: int,
    crash: CrashHook | None = None,
    before_publish: Callable[[CommitResult], None] | None = None,
) -> CommitResult:
    """Seal ``image[:size]``, write it durably, then point ``latest.json`` at it.

    ``before_publish`` runs once the file is durable and before ``latest.json`` names it (its
    argument has ``publish_s = 0``); if it raises, nothing is published.
    """
    t0 = time.perf_counter()
    checksum = seal(image, size)
    name = checkpoint_name(global_step)
    directory = paths.checkpoints
    atomic_write_bytes(directory / name, image[: size + FOOTER_SIZE],
                       hook=crash.for_write("checkpoint") if crash else None)
    _drop_cached(directory / name)
    t1 = time.perf_counter()
    if before_publish is not None:
        before_publish(CommitResult(path=name, checksum=checksum, bytes=size + FOOTER_SIZE,
                                    write_s=t1 - t0, publish_s=0.0))
        t1 = time.perf_counter()
    pointer = LatestPointer(path=name, global_step=global_step, epoch=epoch,
                            cursor_step=cursor_step, world_size=world_size, time=time.time(),
                            checksum=checksum)
    write_json_record(paths.latest, pointer, hook=crash.for_write("latest") if crash else None)
    apply_retention(directory, latest_step=global_step, keep=keep)
    t2 = time.perf_counter()
    return CommitResult(path=name, checksum=checksum, bytes=size + FOOTER_SIZE, write_s=t1 - t0,
                        publish_s=t2 - t1)


def _drop_cached(path: Path) -> None:
    """Let the kernel drop the file's (clean, durable) pages: checkpoints are rarely read back,
    and a training node's memory is better spent elsewhere."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_latest(paths: RunPaths) -> LatestPointer | None:
    """The pointer, or None when the run has no committed checkpoint yet."""
    if not paths.latest.exists():
        return None
    return read_json_record(paths.latest, LatestPointer)


def load_latest_verified(paths: RunPaths, pointer: LatestPointer) -> VerifiedCheckpoint:
    """Read and verify the checkpoint ``pointer`` names; a problem is a CheckpointError."""
    try:
        return read_verified(paths.checkpoints / pointer.path, expected_checksum=pointer.checksum)
    except CheckpointError as exc:
        raise CheckpointError(
            f"{exc} (named by {paths.latest}; ECRL never loads such a checkpoint: restore the "
            "file, or start a new run with another --out)"
        ) from None


def apply_retention(directory: Path, *, latest_step: int, keep: int) -> list[str]:
    """Delete checkpoints older than the newest ``keep`` at or before ``latest_step``.

    Files after ``latest_step`` (written by an attempt that crashed before publishing them) are
    left alone: the run will reach and rewrite them.
    """
    steps = sorted(
        (step, entry.name)
        for entry in directory.iterdir()
        if (step := checkpoint_step(entry.name)) is not None and step <= latest_step
    )
    removed = []
    for _, name in steps[: max(0, len(steps) - max(keep, 1))]:
        (directory / name).unlink(missing_ok=True)
        removed.append(name)
    return removed


def clean_temporaries(directory: Path) -> list[str]:
    """Remove temporary files a crashed writer left behind (``.NAME.*.tmp``)."""
    removed = []
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                entry.unlink(missing_ok=True)
                removed.append(entry.name)
    return removed
