"""The attempt a library user's process belongs to: run directory, attempt number, rank.

Under ``ecrl launch``/``ecrl run`` everything comes from the supervisor's ``ECRL_*`` environment
(:class:`ecrl.runtime.launchenv.AttemptEnv`). Standalone (plain ``python``/``torchrun``) the user
names the run directory and each launch is a new attempt: the number after the highest one on
disk, decided by rank 0 and broadcast, so that every rank writes the same attempt's logs.
"""

from __future__ import annotations

import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ecrl.contract.errors import ConfigError, EcrlError
from ecrl.contract.runformat import RunPaths
from ecrl.runtime.failure import RestartableError, write_fatal
from ecrl.runtime.launchenv import AttemptEnv

__all__ = ["Attempt", "dist_rank_world", "install_error_hook", "resolve_attempt"]


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


_CACHE: dict[str, Attempt] = {}
_LOCK = threading.Lock()


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
        else:
            number = 0
            if rank == 0:
                existing = paths.attempts()
                number = existing[-1] + 1 if existing else 0
            number = _broadcast(number)
        attempt = Attempt(paths=paths, attempt=number, rank=rank, world_size=world, env=env)
        paths.attempt_dir(number).mkdir(parents=True, exist_ok=True)
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
        if not isinstance(exc, EcrlError):
            previous(kind, exc, tb)
            return
        env = AttemptEnv.from_environ()
        if env is not None:
            write_fatal(RunPaths.of(env.run_dir), attempt=env.attempt, rank=int(rank),
                        message=str(exc))
        print(f"ecrl (rank {rank}): error: {exc}", file=sys.stderr, flush=True)

    sys.excepthook = hook
