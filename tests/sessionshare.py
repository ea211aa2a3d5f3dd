"""What a whole ``pytest`` session makes once and every xdist worker shares.

A module- or session-scoped fixture is made again by every worker that runs one of its tests; the
expensive ones (real runs, transformed programs and their reference runs) are made once under a
file lock in a directory all workers see, and the others wait and reuse them.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def session_dir(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """``name`` under a directory every worker of this session shares."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # shared by every worker of this session
    return base / name


@contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def made_once(root: Path, name: str, make: Callable[[Path], T]) -> T:
    """``make(root / name)`` once for the whole session, also across xdist workers; its
    (picklable) result is kept beside it. A ``make`` that raises is retried by the next worker
    that needs it, as a per-worker fixture would be."""
    directory = root / name
    result_file = root / f"{name}.pickle"
    with locked(root / f"{name}.lock"):
        if not result_file.exists():
            shutil.rmtree(directory, ignore_errors=True)  # what a failed make left behind
            value = make(directory)
            result_file.write_bytes(pickle.dumps(value))
    loaded: T = pickle.loads(result_file.read_bytes())
    return loaded
