"""One supervisor per run directory (per node): an exclusive ``flock`` held for the run."""

from __future__ import annotations

import fcntl
from pathlib import Path
from typing import IO

from ecrl.contract.errors import ConfigError

__all__ = ["LOCK_FILE", "take_lock"]

LOCK_FILE = ".supervisor.lock"


def take_lock(root: Path, name: str = LOCK_FILE, holder: str = "another ecrl run") -> IO[bytes]:
    """The open, locked file ``root/name``; close it to release the run. Raises
    :class:`ConfigError` naming ``holder`` when another process holds it."""
    handle = open(root / name, "ab")  # noqa: SIM115 - held for the run
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise ConfigError(f"{root} is in use by {holder}; wait for it or stop it first") from None
    return handle
