"""One supervisor per run directory (per node): an exclusive ``flock`` held for the run. A
standalone launch of a library script (no ``ecrl launch``) takes the same lock for its attempt
(:mod:`ecrl.runtime._attempt`), so two launches never write one run at once.

The lock is taken as soon as the directory exists, before ``run.json``: so a second process
starting a run in the same ``--out`` at the same moment is told that another ECRL process is
starting or running a run there (:func:`in_use`), never that the directory, which holds
nothing but the first one's lock yet, is not a run directory."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from typing import IO

from ecrl.contract.errors import ConfigError

__all__ = ["LOCK_FILE", "take_lock", "held_elsewhere", "in_use"]

LOCK_FILE = ".supervisor.lock"


def in_use(root: Path, holder: str = "another ECRL process") -> ConfigError:
    """The one line for a run directory whose lock another process holds."""
    return ConfigError(f"{holder} is starting or running a run in {root}: wait for it to end, "
                       "or stop it first")


def take_lock(root: Path, name: str = LOCK_FILE,
              holder: str = "another ECRL process") -> IO[bytes]:
    """The open, locked file ``root/name``; close it to release the run. Raises
    :func:`in_use`'s :class:`ConfigError` naming ``holder`` when another process holds it."""
    handle = open(root / name, "ab")  # noqa: SIM115 - held for the run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise in_use(root, holder) from None
    return handle


def held_elsewhere(root: Path, name: str = LOCK_FILE) -> bool:
    """Whether another process holds ``root/name`` now; creates nothing, follows no symlink."""
    try:
        fd = os.open(root / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)  # releases the lock this probe may have taken
    return False
