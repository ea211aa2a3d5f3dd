"""Committing a checkpoint durably (torch-free: the background writer process runs this too).

The protocol, in this order (ARCHITECTURE.md, "Checkpoints"):

1. seal the image (SHA-256 footer, :func:`ecrl.contract.ckptfile.seal`);
2. write ``checkpoints/step-GGGGGGGG.ckpt`` atomically: temporary file, flush, fsync, rename,
   directory fsync (:func:`ecrl.contract.atomicio.atomic_write_bytes`);
3. record the checkpoint: the caller's ``before_publish`` appends its event to
   ``checkpoint_rank0.jsonl`` (so every checkpoint ``latest.json`` ever names has an event, which
   is how the verifier knows a resumed attempt loaded a real checkpoint);
4. replace ``checkpoints/latest.json`` the same way, naming the file and its checksum;
5. delete checkpoints older than the newest ``keep`` (never the one ``latest.json`` names; at
   least two are kept, so that an earlier valid checkpoint exists should the newest be damaged).

A crash before step 4 completes leaves ``latest.json`` naming the previous checkpoint, which is
still whole: step 4 of the previous commit never deleted it. ``ECRL_CRASH_AT`` lets tests kill the
process between any two protocol steps, or fail a write with ``ENOSPC`` (:class:`CrashHook`).

Choosing where to resume (:func:`choose_resume`) is one mechanism for every damaged state: the
checkpoint ``latest.json`` names is used when it verifies; when ``latest.json`` is missing or
unreadable, or the checkpoint it names is corrupt, truncated or missing, the newest earlier
checkpoint file that verifies *and* that the run's logs record as committed (a checkpoint event,
or the supervisor's own attested resume point) is used instead, and the caller says so in one
line. A run whose logs record committed checkpoints is never restarted from step 0: with no valid
checkpoint left, :func:`choose_resume` raises.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ecrl.contract import safepath
from ecrl.contract.atomicio import CRASH_POINTS, atomic_write_bytes
from ecrl.contract.ckptfile import (
    FOOTER_SIZE,
    CheckpointError,
    VerifiedCheckpoint,
    read_verified,
    seal,
)
from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import (
    CheckpointEvent,
    JsonlReader,
    LatestPointer,
    RunPaths,
    SupervisorState,
    read_json_record,
    write_json_record,
)
from ecrl.contract.shardfile import RECYCLED as SHARD_RECYCLED
from ecrl.contract.shardfile import SUFFIX as SHARD_SUFFIX
from ecrl.contract.shardfile import VerifiedShards, read_verified_shards

__all__ = [
    "CRASH_ENV",
    "CRASH_EXIT_CODE",
    "CrashHook",
    "CommitResult",
    "MIN_KEEP",
    "ResumeChoice",
    "choose_resume",
    "recorded_checkpoints",
    "checkpoint_name",
    "checkpoint_step",
    "commit_checkpoint",
    "read_latest",
    "read_checkpoint",
    "checkpoint_in",
    "SHARDED_POINTS",
    "apply_retention",
    "remove_checkpoint",
    "clean_temporaries",
]

CRASH_ENV = "ECRL_CRASH_AT"
"""``TARGET:POINT[:N[:ATTEMPT]]``: crash at ``POINT`` of the N-th (default 1st) write of
``TARGET`` (``checkpoint``, ``latest`` or ``supervisor``) in one process, optionally only in
attempt ATTEMPT. ``POINT`` ``enospc`` fails that write with ``OSError(ENOSPC)`` after part of it
reached the temporary file, as a full disk does, instead of killing the process."""
CRASH_EXIT_CODE = 137
CRASH_TARGETS = ("checkpoint", "latest", "supervisor", "sharded")
DISK_FULL_POINT = "enospc"
MIN_KEEP = 2
"""Retention never keeps fewer checkpoints: the fallback needs an earlier one."""
SHARDED_POINTS = ("before-parts", "after-parts", "during-metadata", "after-metadata",
                  "before-rename", "before-pointer", "after-pointer", "during-persist")
"""Crash points of the ``sharded`` target (:mod:`ecrl.runtime.checkpoint.sharded`), in protocol
order."""
# ``.dcp``: a sharded checkpoint directory (ecrl.contract.shardfile).
_NAME = re.compile(r"^step-(\d{8,})\.(?:ckpt|dcp)$")


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
                or parts[1] not in (*CRASH_POINTS, DISK_FULL_POINT, *SHARDED_POINTS) \
                or not all(p.isdigit() for p in parts[2:]):
            raise ValueError(
                f"{CRASH_ENV}={spec!r}: expected TARGET:POINT[:N[:ATTEMPT]] with TARGET in "
                f"{CRASH_TARGETS} and POINT in {(*CRASH_POINTS, DISK_FULL_POINT, *SHARDED_POINTS)}"
            )
        if len(parts) == 4 and attempt != int(parts[3]):
            return
        self.target, self.point = parts[0], parts[1]
        self.nth = int(parts[2]) if len(parts) >= 3 else 1

    @classmethod
    def from_env(cls, *, attempt: int | None) -> CrashHook:
        return cls(os.environ.get(CRASH_ENV), attempt=attempt)

    def for_write(self, target: str, path: str | os.PathLike[str] | None = None
                  ) -> Callable[[str], None] | None:
        """The atomicio hook for the next write of ``target`` (None when nothing can fire)."""
        self._counts[target] += 1
        if target != self.target or self._counts[target] != self.nth:
            return None

        def hook(point: str) -> None:
            if self.point == DISK_FULL_POINT:
                # After the write() call, as a real full disk reports it at write or fsync time:
                # the temporary file holds part of the data when the error surfaces.
                if point == "before-fsync":
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC),
                                  str(path) if path is not None else None)
            elif point == self.point:
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
                       hook=crash.for_write("checkpoint", directory / name) if crash else None)
    _drop_cached(directory / name)
    t1 = time.perf_counter()
    if before_publish is not None:
        before_publish(CommitResult(path=name, checksum=checksum, bytes=size + FOOTER_SIZE,
                                    write_s=t1 - t0, publish_s=0.0))
        t1 = time.perf_counter()
    pointer = LatestPointer(path=name, global_step=global_step, epoch=epoch,
                            cursor_step=cursor_step, world_size=world_size, time=time.time(),
                            checksum=checksum)
    write_json_record(paths.latest, pointer,
                      hook=crash.for_write("latest", paths.latest) if crash else None)
    apply_retention(directory, latest_step=global_step, keep=keep)
    t2 = time.perf_counter()
    return CommitResult(path=name, checksum=checksum, bytes=size + FOOTER_SIZE, write_s=t1 - t0,
                        publish_s=t2 - t1)


def _drop_cached(path: Path) -> None:
    """Let the kernel drop the file's (clean, durable) pages: checkpoints are rarely read back,
    and a training node's memory is better spent elsewhere."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_latest(paths: RunPaths) -> LatestPointer | None:
    """The pointer, or None when the run has no committed checkpoint yet. A link or a special
    file in its place is refused (:class:`RunFormatError`), never followed or opened."""
    try:
        if safepath.kind_of(paths.latest) is None:
            return None
    except safepath.UnsafePathError as exc:
        raise RunFormatError(str(paths.latest), None, str(exc).split(": ", 1)[-1]) from None
    return read_json_record(paths.latest, LatestPointer)


def read_checkpoint(path: Path, *, expected_checksum: str | None = None, check_parts: bool = True
                    ) -> VerifiedCheckpoint | VerifiedShards:
    """Verify a checkpoint of either format: a ``.ckpt`` file, or a sharded ``.dcp`` directory
    (its manifest, and every part unless ``check_parts`` is False: then its loader hashes what
    it reads). ``path`` must be a checkpoint's own name in a real ``checkpoints/`` directory:
    a link (the checkpoint, or the directory), a special file or any other name is refused."""
    safepath.require_dir(path.parent, error=CheckpointError)
    if checkpoint_step(path.name) is None:
        raise CheckpointError(f"{path}: not the name of a checkpoint (step-GGGGGGGG.ckpt or "
                              ".dcp); refused")
    if path.name.endswith(SHARD_SUFFIX):
        return read_verified_shards(path, expected_checksum=expected_checksum,
                                    check_parts=check_parts)
    return read_verified(path, expected_checksum=expected_checksum)


def checkpoint_in(checkpoints: Path, name: str) -> Path:
    """``checkpoints/name`` when ``name`` (from ``latest.json`` or the supervisor) is a plain
    checkpoint name: an absolute path or one with ``/`` or ``..`` never leads out of the run."""
    safepath.check_name(name, where=f"{checkpoints}: checkpoint", error=CheckpointError)
    if checkpoint_step(name) is None:
        raise CheckpointError(f"{checkpoints / name}: not the name of a checkpoint "
                              "(step-GGGGGGGG.ckpt or .dcp); refused")
    return checkpoints / name


def apply_retention(directory: Path, *, latest_step: int, keep: int,
                    retire: Callable[[Path], None] | None = None) -> list[str]:
    """Delete checkpoints older than the newest ``keep`` at or before ``latest_step`` (each with
    ``retire``, :func:`remove_checkpoint` by default).

    Files after ``latest_step`` (written by an attempt that crashed before publishing them) are
    left alone: the run will reach and rewrite them.
    """
    steps = sorted(
        (step, entry.name)
        for entry in directory.iterdir()
        if (step := checkpoint_step(entry.name)) is not None and step <= latest_step
    )
    removed = []
    for _, name in steps[: max(0, len(steps) - max(keep, MIN_KEEP))]:
        (retire or remove_checkpoint)(directory / name)
        removed.append(name)
    return removed


def remove_checkpoint(path: Path) -> None:
    """Delete a checkpoint file, or a sharded checkpoint's directory (a link in its place is
    removed itself, never followed)."""
    safepath.remove_entry(path)


def clean_temporaries(directory: Path) -> list[str]:
    """Remove temporary files a crashed writer left behind (``.NAME.*.tmp``), and the recycled
    parts of a sharded checkpoint (``.recycled.dcp``, made again by the next retention)."""
    removed = []
    if directory.is_dir():
        for entry in directory.iterdir():
            if entry.name == SHARD_RECYCLED or (entry.name.startswith(".")
                                                and entry.name.endswith(".tmp")):
                remove_checkpoint(entry)
                removed.append(entry.name)
    return removed


def recorded_checkpoints(paths: RunPaths, attested: Iterable[int] = (),
                         attempts: Iterable[int] | None = None) -> set[int]:
    """Steps of the checkpoints the run's logs record as committed.

    A checkpoint event is appended before ``latest.json`` may name a file (step 3 above), so an
    event means "this checkpoint was committed"; ``attested`` adds the resume points the supervisor
    verified itself (``blocking`` logs its event just after publishing).

    Only the logs of ``attempts`` count (default: those ``supervisor.json`` records; none when it
    is unreadable), each read without following a link out of the run and within the line limit
    (``root=paths.root``): a folder planted under ``logs/`` is no evidence that a checkpoint was
    committed, and must not make a forged checkpoint file count.

    A framework's own checkpoint (an event with ``written_by``, which an ECRL integration logs
    when Lightning or Accelerate saves, :mod:`ecrl.runtime.integrations`) is not one of these: it
    is no file under ``checkpoints/``, and the framework loads it itself.
    """
    steps = set(attested)
    if attempts is None:
        try:
            state = read_json_record(paths.supervisor, SupervisorState, root=paths.root)
        except RunFormatError:
            return steps
        attempts = [a.attempt for a in state.attempts]
    for attempt in attempts:
        log = paths.checkpoint_log(attempt)
        with contextlib.suppress(RunFormatError, OSError):
            for _, event in JsonlReader(log, CheckpointEvent, torn_tail_ok=True, root=paths.root):
                if not event.extra.get("written_by"):
                    steps.add(event.global_step)
    return steps


@dataclass(frozen=True, kw_only=True, slots=True)
class ResumeChoice:
    """Where the next attempt resumes, and why (recorded in ``supervisor.json``)."""

    pointer: LatestPointer | None
    """The checkpoint to load (None: a fresh start)."""
    reason: str
    """``latest``, ``fresh``, ``rebuilt`` (latest.json was missing or unreadable) or
    ``fallback`` (the checkpoint it named did not verify)."""
    problem: str | None = None
    """What was wrong, one line (``rebuilt`` and ``fallback``)."""
    rejected: tuple[str, ...] = ()
    """Newer checkpoint files that were passed over, each with its one-line reason."""

    @property
    def repaired(self) -> bool:
        """latest.json must be rewritten to name :attr:`pointer`."""
        return self.reason in ("rebuilt", "fallback")

    def describe(self, paths: RunPaths) -> str | None:
        """The one line to show the user (None when nothing unusual happened)."""
        if not self.repaired or self.pointer is None:
            return None
        where = f"{self.pointer.path} (step {self.pointer.global_step})"
        if self.reason == "rebuilt":
            return (f"{paths.latest} {self.problem}; rebuilt it from the newest checkpoint that "
                    f"verifies: {where}")
        return f"{self.problem}; resuming from the newest valid earlier checkpoint, {where}"


def _pointer_problem(paths: RunPaths, pointer: LatestPointer) -> str | None:
    """Why the checkpoint ``pointer`` names cannot be used; None when it verifies."""
    try:
        checked = read_checkpoint(paths.checkpoints / pointer.path,
                                  expected_checksum=pointer.checksum)
    except CheckpointError as exc:
        return str(exc)
    if checked.meta.get("global_step") != pointer.global_step:
        return (f"{checked.path}: holds step {checked.meta.get('global_step')}, "
                f"{paths.latest} says {pointer.global_step}")
    return None


def choose_resume(paths: RunPaths, *, locate: Callable[[int], tuple[int, int]],
                  attested: Iterable[int] = (), attempts: Iterable[int] | None = None,
                  restart_hint: str = "") -> ResumeChoice:
    """The checkpoint the next attempt must load (module docstring: the rule).

    ``locate`` maps a global step to ``(epoch, cursor_step)`` (the run's geometry), to rebuild a
    pointer from a file; ``attempts`` are those whose logs may record committed checkpoints
    (:func:`recorded_checkpoints`). Raises :class:`CheckpointError` when the logs record committed
    checkpoints but none is left that verifies; ``restart_hint`` ends that message.
    """
    problem: str | None = None
    bound: int | None = None
    try:
        pointer = read_latest(paths)
    except RunFormatError as exc:
        pointer, problem = None, f"is unreadable ({exc})"
    if pointer is not None and (
            "/" in pointer.path or checkpoint_step(pointer.path) != pointer.global_step):
        # Never follow a pointer out of checkpoints/ or to a file of another step: such a
        # pointer is no evidence about any file, so it is rebuilt like a missing one.
        problem = (f"names {pointer.path!r}, which is not the checkpoint file of step "
                   f"{pointer.global_step} in {paths.checkpoints}")
        pointer = None
    if pointer is not None:
        problem = _pointer_problem(paths, pointer)
        if problem is None:
            return ResumeChoice(pointer=pointer, reason="latest")
        bound = pointer.global_step
    elif problem is None and paths.checkpoints.is_dir() and any(
            checkpoint_step(e.name) is not None for e in paths.checkpoints.iterdir()):
        problem = "is missing"
    recorded = recorded_checkpoints(paths, attested, attempts)
    files = sorted(((step, entry.name) for entry in (
        paths.checkpoints.iterdir() if paths.checkpoints.is_dir() else ())
        if (step := checkpoint_step(entry.name)) is not None
        and (bound is None or step < bound)), reverse=True)
    rejected: list[str] = []
    for step, name in files:
        if step not in recorded:
            continue  # written by an attempt that died before committing it
        try:
            checked = read_checkpoint(paths.checkpoints / name)
        except CheckpointError as exc:
            rejected.append(str(exc))
            continue
        meta = checked.meta
        if meta.get("global_step") != step or not isinstance(meta.get("world_size"), int):
            rejected.append(f"{checked.path}: its header does not describe step {step}")
            continue
        epoch, cursor = locate(step)
        rebuilt = LatestPointer(path=name, global_step=step, epoch=epoch, cursor_step=cursor,
                                world_size=int(meta["world_size"]),
                                time=float(meta.get("time", time.time())),
                                checksum=checked.checksum)
        return ResumeChoice(pointer=rebuilt, reason="rebuilt" if bound is None else "fallback",
                            problem=problem, rejected=tuple(rejected))
    if pointer is None and not recorded:
        return ResumeChoice(pointer=None, reason="fresh")
    newest = max(recorded, default=None) if pointer is None else pointer.global_step
    why = problem if pointer is not None else f"{paths.latest} {problem or 'is missing'}"
    raise CheckpointError(
        f"no valid checkpoint is left in {paths.checkpoints} although the run committed "
        f"checkpoints up to step {newest} ({why}"
        + (f"; {len(rejected)} earlier checkpoint(s) do not verify" if rejected else "")
        + "): ECRL never restarts such a run from step 0; restore a checkpoint file and run "
        f"`ecrl run --out {paths.root}` again" + (f", or {restart_hint}" if restart_hint else ""))
