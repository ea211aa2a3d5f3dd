"""The supervisor's side of the run directory: ``--out`` checks, the planned ``run.json``,
attempts a killed supervisor left behind, and atomic writes that survive a full disk."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import (
    RunManifest,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    check_entry,
    write_json_record,
)
from ecrl.runtime.checkpoint.persist import CrashHook
from ecrl.runtime.failure import disk_error, disk_remedy, machine_memory, read_fired
from ecrl.runtime.manifest import build_manifest
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.settings import FAKE_CLASSES, TINY_GPT
from ecrl.runtime.supervision.progress import attempt_steps

__all__ = ["DiskFull", "check_out", "check_fits", "memory_limit", "plan_manifest",
           "stale_attempt", "fired_in_stale", "write_record", "check_logs", "with_strays"]


class DiskFull(Exception):
    """The supervisor could not write one of its files: no space, quota, read-only or
    forbidden; ``str()`` says which file and why, ``remedy`` what the user must do."""

    def __init__(self, message: str, remedy: str = "free some space") -> None:
        super().__init__(message)
        self.remedy = remedy

    def explain(self, command: str, root: Path) -> str:
        """The one line that ends the run."""
        return (f"{self} (the previous version of the file is intact); {self.remedy}, then run "
                f"`ecrl {command} --out {root}` to continue")


def check_out(given: str, root: Path) -> None:
    """--out must be a directory, or creatable: checked before anything is written."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {given} is a file, not a directory: choose a new or empty "
                          "directory")
    parent = root
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or _is_pseudo(parent):
        raise ConfigError(f"--out {given}: {parent} is not a directory ECRL can create files "
                          "in: choose a writable place")


def _is_pseudo(path: Path) -> bool:
    """A kernel file system (/proc, /sys) where no run directory can be created."""
    with contextlib.suppress(OSError):
        return os.statvfs(path).f_blocks == 0
    return False


def _dataset_shape(config: RunConfig) -> tuple[int, int]:
    """D and the number of classes of the run's data set (reads a data set on disk)."""
    if config.dataset == "fake":
        classes = TINY_GPT["vocab"] if config.model == "tiny-gpt" else FAKE_CLASSES
        return config.fake_size(), classes
    from ecrl.runtime.trainer.datasets import build_dataset, check_data_dir

    data_dir = Path(config.data_dir) if config.data_dir else None
    check_data_dir(config.dataset, data_dir)  # before anything slow, with the clear message
    dataset = build_dataset(config.dataset, data_dir=data_dir, size=None,
                            image_size=config.image_size)
    return len(dataset), dataset.num_classes


def memory_limit() -> tuple[int, str] | None:
    """The memory this machine's processes can have, and what sets it: the cgroup's limit
    (cgroup v2 ``memory.max``) when lower than the physical memory. None when unknown."""
    limits: list[tuple[int, str]] = []
    physical = machine_memory()
    if physical is not None:
        limits.append((physical, "memory of this machine"))
    with contextlib.suppress(ValueError, OSError):
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw != "max":
            limits.append((int(raw), "memory limit of this cgroup (/sys/fs/cgroup/memory.max)"))
    return min(limits) if limits else None


def check_fits(config: RunConfig, num_classes: int, *, limit: tuple[int, str] | None = None
               ) -> None:
    """Refuse, before anything is launched or written, a run whose ranks can never fit in
    memory: one rank's input batch and model state alone (:meth:`TrainerSettings.rank_memory`,
    a lower bound) exceed ``limit`` (default :func:`memory_limit`)."""
    limit = limit if limit is not None else memory_limit()
    if limit is None:
        return
    trainer = config.trainer
    local = max(config.global_batch // m.dp_size for m in config.supervisor.meshes)
    side = trainer.input_side
    batch, model = trainer.rank_memory(local, num_classes)
    if batch + model <= limit[0]:
        return
    raise ConfigError(
        f"one rank needs at least {batch + model:,} bytes, more than the {limit[0]:,} bytes of "
        f"{limit[1]}: its input batch of {local} x 3 x {side} x {side} float32 is {batch:,} "
        f"bytes and {config.model} with {trainer.model_parameters(num_classes):,} parameters "
        f"at --image-size {config.image_size} needs {model:,} bytes for weights, gradients and "
        "momentum: use a smaller --image-size, --global-batch or --model, or more ranks")


def plan_manifest(config: RunConfig) -> RunManifest:
    """The ``run.json`` this configuration describes (reads the data set to learn D); refuses a
    run that cannot fit in memory (:func:`check_fits`)."""
    if config.tp > 1 and config.model != "tiny-gpt":
        raise ConfigError(f"--tp {config.tp} needs --model tiny-gpt (the built-in model with a "
                          f"tensor-parallel plan), not {config.model}")
    if TINY_GPT["heads"] % config.tp:
        raise ConfigError(f"--tp {config.tp} must divide tiny-gpt's {TINY_GPT['heads']} "
                          "attention heads (each tensor-parallel rank holds whole heads)")
    size, classes = _dataset_shape(config)
    check_fits(config, classes)
    return build_manifest(
        seed=config.seed, dataset=config.dataset, dataset_size=size,
        global_batch=config.global_batch,
        steps_per_epoch=config.geometry(size).steps_per_epoch,
        target_steps=config.target_steps(size), log_ids=config.log_ids, model=config.model,
        strategy=config.strategy, ckpt_every=config.effective_ckpt_every,
        fail_at=config.fail_at, world_sizes=config.world_sizes,
        meshes=None if config.parallel == "ddp"
        else [m.record() for m in config.supervisor.meshes],
        extra={"config": config.to_dict()})


def stale_attempt(paths: RunPaths, a: SupervisorAttempt) -> SupervisorAttempt:
    """An attempt left 'running' by a supervisor that was killed outright: its torchrun died
    with it (parent-death signal), so it failed; the logs say how far it got."""
    first, last = attempt_steps(paths, a.attempt, a.world_size)
    logs = paths.rank_logs(a.attempt).values()
    end = max((p.stat().st_mtime for p in logs), default=None)
    return replace(a, status="failed", first_step=first, last_step=last, end_time=end)


def fired_in_stale(paths: RunPaths, state: SupervisorState) -> dict[str, Any]:
    """``extra`` with the injected failures that attempts left 'running' fired: a supervisor
    that died (or could not write supervisor.json) before recording them must not make the
    same failure fire twice."""
    fired = list(state.extra.get("injected_failures", []))
    for a in state.attempts:
        marker = read_fired(paths, a.attempt) if a.status == "running" else None
        if marker is not None and all(f.get("attempt") != a.attempt for f in fired):
            fired.append({"attempt": a.attempt, "global_step": marker.global_step,
                          "rank": marker.rank})
    return {**state.extra, "injected_failures": fired}


def check_logs(paths: RunPaths, attempts: list[int]) -> None:
    """Before a continuation reads anything under ``logs/``: ``logs/`` and each recorded
    attempt's folder are real folders, and every entry of such a folder is a regular file or a
    folder. Someone else may be able to write the run directory: a link there would make the
    supervisor read outside the run, a FIFO would block it for good, a device read without end.
    Raises :class:`RunFormatError` (one line) otherwise."""
    for folder in (paths.logs, *(paths.attempt_dir(a) for a in attempts)):
        why = check_entry(folder, directory=True)
        if why is not None:
            raise RunFormatError(str(folder), None, f"{why}, not a folder: a run directory's "
                                 "logs are never followed through links; restore the run's own "
                                 "folder or start the run over in a new --out")
        if not folder.is_dir():
            continue
        if folder == paths.logs:
            continue
        for entry in sorted(folder.iterdir()):
            why = check_entry(entry)
            if why is not None and check_entry(entry, directory=True) is not None:
                raise RunFormatError(str(entry), None, f"{why}, not a regular file: ECRL never "
                                     "reads a link or special file in a run directory; remove it "
                                     "(or start the run over in a new --out)")


def with_strays(extra: Mapping[str, Any], moved: list[dict[str, str]]) -> dict[str, Any]:
    """``supervisor.json``'s ``extra`` with the stray folders set aside (``stray_logs``)."""
    if not moved:
        return dict(extra)
    return {**extra, "stray_logs": [*extra.get("stray_logs", []), *moved]}


def write_record(path: Path, record: Any, crash: CrashHook) -> None:
    """Atomically replace one of the run's JSON files; a full disk leaves the previous version
    whole (atomicio) and raises :class:`DiskFull` with the message to show."""
    try:
        write_json_record(path, record, hook=crash.for_write("supervisor", path))
    except OSError as exc:
        message = disk_error(exc, path)
        if message is None:
            raise
        raise DiskFull(message, disk_remedy(exc)) from None
