"""The attempt a library user's process belongs to: run directory, attempt number, rank.

Under ``ecrl launch``/``ecrl run`` everything comes from the supervisor's ``ECRL_*`` environment
(:class:`ecrl.runtime.launchenv.AttemptEnv`). Standalone (plain ``python``/``torchrun``) the user
names the run directory and each launch is a new attempt: the number after the run's own attempts
(:func:`standalone_attempt`; a stray folder is set aside, as the supervisor does), decided by rank 0
and broadcast, so that every rank writes the same attempt's logs.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import IO

from ecrl.contract.errors import ConfigError, EcrlError, RunFormatError
from ecrl.contract.runformat import (
    AttemptRecord,
    RunPaths,
    SupervisorState,
    check_entry,
    read_json_record,
    write_json_record,
)
from ecrl.runtime.failure import RestartableError, script_error, write_fatal
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.runlock import take_lock

__all__ = ["Attempt", "dist_rank_world", "install_error_hook", "record_attempt",
           "record_completed", "record_fresh_if_unrecorded", "resolve_attempt", "set_aside",
           "set_aside_strays", "standalone_attempt"]


def dist_rank_world() -> tuple[int, int]:
    """``(rank, world_size)`` of the default process group, or ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@dataclass(frozen=True, kw_only=True, slots=True)
class Attempt:
    paths: RunPaths
    attempt: int
    rank: int
    world_size: int
    env: AttemptEnv | None
    """The supervisor's view of the attempt; None when running standalone."""


def set_aside(paths: RunPaths, attempt: int) -> str | None:
    """Rename ``logs/attempt-NNN``, which no recorded attempt wrote, to ``logs/stray-attempt-NNN``
    (``.2``, ``.3``, … when taken); the new name, or None when there is no such folder.

    A stray folder was planted, or copied in: a new attempt numbered after it would leave a gap
    in the record, and one given its number would append its records to the stray ones. Its
    contents are kept (evidence), under a name no reader of the run format looks at."""
    folder = paths.attempt_dir(attempt)
    if not os.path.lexists(folder):
        return None
    target = paths.logs / f"stray-{folder.name}"
    n = 1
    while os.path.lexists(target):
        n += 1
        target = paths.logs / f"stray-{folder.name}.{n}"
    os.rename(folder, target)  # a link is renamed itself, never followed
    return target.name


def set_aside_strays(paths: RunPaths, recorded: list[int]) -> list[dict[str, str]]:
    """:func:`set_aside` every ``logs/attempt-NNN`` folder that ``supervisor.json`` does not
    record; what was moved, for ``supervisor.json``."""
    known = set(recorded)
    moved = []
    names = sorted(os.listdir(paths.logs)) if check_entry(paths.logs, directory=True) is None \
        and paths.logs.is_dir() else []
    numbers = [int(n[8:]) for n in names if n.startswith("attempt-") and n[8:].isdigit()]
    for number in numbers:
        if number not in known:
            name = set_aside(paths, number)
            if name is not None:
                moved.append({"folder": f"logs/{paths.attempt_dir(number).name}",
                              "moved_to": f"logs/{name}"})
    return moved


def standalone_attempt(paths: RunPaths) -> tuple[int, list[dict[str, str]]]:
    """The number of a new standalone attempt, and the stray folders set aside for it.

    No supervisor records a standalone run's attempts, so its own are taken to be those
    ``supervisor.json`` records (when an ``ecrl launch`` ran it before) and the folders numbered
    0, 1, … after them without a gap; a folder beyond a gap was not written by an attempt of the
    run and is set aside as the supervisor sets aside the folders it does not record
    (:func:`set_aside_strays`), so it neither pushes the new attempt's number past a gap nor
    leaves the run unverifiable. (A folder planted exactly at the next number cannot be told
    from a real attempt without a record; ``ecrl launch`` keeps one.)"""
    numbers = set(paths.attempts())
    if os.path.lexists(paths.supervisor):
        try:
            state = read_json_record(paths.supervisor, SupervisorState, root=paths.root)
            numbers |= {a.attempt for a in state.attempts}
        except RunFormatError:
            pass
    number = 0
    while number in numbers:
        number += 1
    return number, set_aside_strays(paths, list(range(number)))


_CACHE: dict[str, Attempt] = {}
_LOCK = threading.Lock()
_RUN_LOCKS: dict[str, IO[bytes]] = {}
"""Run directory -> its lock, held by this process's standalone attempts until it exits."""


def _claim_standalone(paths: RunPaths) -> int:
    """Rank 0 of a standalone launch: lock the run directory for the attempt (the lock
    ``ecrl launch``'s supervisor takes, so neither that nor a second launch can run beside it),
    then create the new attempt's log folder."""
    paths.root.mkdir(parents=True, exist_ok=True)
    key = str(paths.root.resolve())
    if key not in _RUN_LOCKS:
        _RUN_LOCKS[key] = take_lock(paths.root, holder="another launch (or an ecrl launch)")
    number, _ = standalone_attempt(paths)
    paths.logs.mkdir(exist_ok=True)
    # Not exist_ok: under the lock nothing else numbers attempts, so a folder that appeared in
    # between is a bug to hear of, never one to write into.
    paths.attempt_dir(number).mkdir()
    return number


def record_attempt(attempt: Attempt, *, resumed: tuple[int, str | None] | None) -> None:
    """Rank 0: ``logs/attempt-NNN/attempt.json`` (atomic), before the attempt's first step
    record: the checkpoint it resumed from (``(step, checksum)``, verified when loaded) or a
    fresh start (None), and its world size. Lets ``ecrl-verify`` prove a run that no ``ecrl
    launch`` supervised (docs/run-format.md)."""
    if attempt.rank != 0:
        return
    write_json_record(attempt.paths.attempt_record(attempt.attempt), AttemptRecord(
        attempt=attempt.attempt, world_size=attempt.world_size,
        resumed_from_step=None if resumed is None else resumed[0],
        resumed_from_checksum=None if resumed is None else resumed[1],
        launcher="standalone" if attempt.env is None else "ecrl launch", status="running",
        start_time=time.time(), end_time=None, last_step=None))


def record_fresh_if_unrecorded(attempt: Attempt) -> None:
    """Rank 0, at the first step record: a fresh start when no checkpointer recorded the
    attempt (a script with a step log and no :class:`ecrl.Checkpointer`)."""
    if attempt.rank == 0 and not os.path.lexists(attempt.paths.attempt_record(attempt.attempt)):
        record_attempt(attempt, resumed=None)


def record_completed(attempt: Attempt, last_step: int) -> None:
    """Rank 0: rewrite ``attempt.json`` as completed once the attempt logged the run's last
    step and closed its log without an error."""
    if attempt.rank != 0:
        return
    path = attempt.paths.attempt_record(attempt.attempt)
    if not os.path.lexists(path):
        return
    record = read_json_record(path, AttemptRecord, root=attempt.paths.root)
    write_json_record(path, dataclasses.replace(record, status="completed", end_time=time.time(),
                                                last_step=last_step))


def _broadcast(value: int) -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return int(box[0])
    return value


def resolve_attempt(run_dir: str | os.PathLike[str] | None) -> Attempt:
    """The attempt of this process (the same object for every caller in the process)."""
    env = AttemptEnv.from_environ()
    rank, world = dist_rank_world()
    if world == 1 and "RANK" in os.environ:
        # torchrun's view, before (or without) init_process_group.
        rank, world = int(os.environ["RANK"]), int(os.environ.get("WORLD_SIZE", "1"))
    if env is not None:
        if run_dir is not None and Path(run_dir).resolve() != Path(env.run_dir).resolve():
            raise ConfigError(
                f"this script names run directory {run_dir}, but ecrl launch runs it with --out "
                f"{env.run_dir}: drop the run directory argument (the supervisor's wins) or pass "
                "the same one")
        key = env.run_dir
    elif run_dir is None:
        raise ConfigError("no run directory: pass one (StepLog('runs/my-run', …)) or start the "
                          "script with `ecrl launch --out DIR -- python script.py`")
    else:
        key = str(Path(run_dir).resolve())
    with _LOCK:
        found = _CACHE.get(key)
        if found is not None:
            return found
        paths = RunPaths.of(key)
        if env is not None:
            number = env.attempt
            paths.attempt_dir(number).mkdir(parents=True, exist_ok=True)
        else:
            number = 0
            if rank == 0:
                number = _claim_standalone(paths)
            number = _broadcast(number)
        attempt = Attempt(paths=paths, attempt=number, rank=rank, world_size=world, env=env)
        install_error_hook()
        _CACHE[key] = attempt
        return attempt


_HOOKED = False


def install_error_hook() -> None:
    """A user's mistake (an :class:`EcrlError`) ends the process with its one line and no
    traceback; under the supervisor it also leaves ``fatal.json`` so that the attempt is not
    relaunched (a restart cannot fix it). Other exceptions keep the usual report. Installed once
    per process, by the first library object built."""
    global _HOOKED
    if _HOOKED:
        return
    _HOOKED = True
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        rank = os.environ.get("RANK", "0")
        if isinstance(exc, RestartableError):  # the supervisor relaunches
            print(f"ecrl (rank {rank}): {exc}", file=sys.stderr, flush=True)
            return
        env = AttemptEnv.from_environ()
        if not isinstance(exc, EcrlError):
            previous(kind, exc, tb)
            # An error in the script's own code recurs on every relaunch: the supervisor is told
            # to stop at once, with the real error (a DataLoader worker's, not its wrapper's).
            reason = script_error(exc)
            if reason is not None and env is not None:
                write_fatal(RunPaths.of(env.run_dir), attempt=env.attempt, rank=int(rank),
                            message=f"{reason} (an error in the script: fix it, then run the "
                                    "same command again)")
            return
        if env is not None:
            write_fatal(RunPaths.of(env.run_dir), attempt=env.attempt, rank=int(rank),
                        message=str(exc))
        print(f"ecrl (rank {rank}): error: {exc}", file=sys.stderr, flush=True)

    sys.excepthook = hook
