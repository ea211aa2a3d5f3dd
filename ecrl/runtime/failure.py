"""Deterministic failure injection (torch-free).

A failure is injected after a configured global step, once the step's update, its record and
any checkpoint boundary have completed (seed ``000_…`` §4.6): the chosen rank writes
``logs/attempt-NNN/failure.json`` and exits at once with ``os._exit(137)``, the status of a
SIGKILLed process, without flushing, closing or saying goodbye to its peers. The peers then fail
in their next collective and torchrun tears the group down.

A problem that no restart can fix (a corrupt checkpoint, data that changed under the run) is the
opposite case: the rank writes ``fatal.json`` with a one-line message and exits with code 3, and
the supervisor stops instead of relaunching (:func:`write_fatal`, :func:`read_fatal`).

An unexpected exception in a rank is judged by :func:`fatal_reason`: a full disk, an allocation
larger than the machine's memory or a data file that cannot be decoded is fatal on its first
occurrence (a restart would hit it again); anything else is a crash and is retried, unless the
same exception ends two consecutive attempts at the same step (the supervisor compares the
:class:`RankError` it reads from each attempt's ``torchrun.log`` with :func:`rank_errors`).

Each step of ``--fail-at`` fails once over the whole run. A resumed attempt re-runs the steps
after its checkpoint, so the supervisor reads the markers of earlier attempts and passes only the
failures that have not fired yet to the next attempt (:func:`remaining`).
"""

from __future__ import annotations

import errno
import json
import os
import re
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from ecrl.contract.atomicio import atomic_write_text
from ecrl.contract.runformat import RunPaths, loads, read_small_file

__all__ = ["FAILURE_EXIT_CODE", "FATAL_EXIT_CODE", "FailurePlan", "FiredFailure", "inject",
           "read_fired", "remaining", "write_fatal", "read_fatal", "disk_error", "disk_remedy",
           "fatal_reason", "RankError", "rank_errors", "RestartableError", "read_marker",
           "machine_memory", "script_error"]

FAILURE_EXIT_CODE = 137
FATAL_EXIT_CODE = 3
MARKER = "failure.json"
FATAL_MARKER = "fatal.json"
MARKER_LIMIT = 64 << 10
"""A rank's marker file is a few hundred bytes; anything larger was not written by a rank."""


class RestartableError(RuntimeError):
    """An error a relaunch can fix (a helper process of the rank vanished): the rank reports it
    in one line, and the attempt fails without ``fatal.json``, so the supervisor relaunches."""


@dataclass(frozen=True, kw_only=True, slots=True)
class FailurePlan:
    """The failures one attempt must inject."""

    steps: frozenset[int]
    """Global steps after which to fail."""
    rank: int
    """The rank that exits."""

    def due(self, step: int, rank: int) -> bool:
        return rank == self.rank and step in self.steps


@dataclass(frozen=True, kw_only=True, slots=True)
class FiredFailure:
    """A failure that was injected: after which step, on which rank, in which attempt."""

    attempt: int
    global_step: int
    rank: int


def inject(paths: RunPaths, *, attempt: int, step: int, rank: int) -> NoReturn:
    """Leave the marker, then die like a killed process."""
    marker = {"global_step": step, "rank": rank, "time": time.time(),
              "exit_code": FAILURE_EXIT_CODE}
    atomic_write_text(paths.attempt_dir(attempt) / MARKER, json.dumps(marker) + "\n")
    print(f"ecrl: injected failure after step {step} on rank {rank} (exit "
          f"{FAILURE_EXIT_CODE})", file=sys.stderr, flush=True)
    os._exit(FAILURE_EXIT_CODE)


def read_marker(paths: RunPaths, path: os.PathLike[str] | str) -> dict[str, Any] | None:
    """The JSON object of a rank's marker file under ``paths.root`` (``failure.json``,
    ``fatal.json``, the endings' markers); None when it is missing, not JSON or not an object,
    and when it is not a regular file of at most :data:`MARKER_LIMIT` bytes reached without a
    link (:func:`~ecrl.contract.runformat.read_small_file`): someone else may be able to write
    the run directory, and a FIFO there must not block the supervisor nor a link read outside."""
    try:
        data = loads(read_small_file(path, limit=MARKER_LIMIT, root=paths.root))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_fired(paths: RunPaths, attempt: int) -> FiredFailure | None:
    """The failure ``attempt`` injected, if any."""
    data = read_marker(paths, paths.attempt_dir(attempt) / MARKER)
    try:
        return FiredFailure(attempt=attempt, global_step=int(data["global_step"]),
                            rank=int(data["rank"])) if data is not None else None
    except (KeyError, TypeError, ValueError):
        return None


def remaining(planned: Iterable[int], fired: Iterable[FiredFailure]) -> list[int]:
    """Planned failure steps that have not fired in any attempt yet, ascending."""
    done = {f.global_step for f in fired}
    return sorted(set(planned) - done)


def write_fatal(paths: RunPaths, *, attempt: int, rank: int, message: str) -> None:
    marker = {"rank": rank, "message": message, "time": time.time()}
    atomic_write_text(paths.attempt_dir(attempt) / FATAL_MARKER, json.dumps(marker) + "\n")


def read_fatal(paths: RunPaths, attempt: int) -> str | None:
    """The message of the unrecoverable error ``attempt`` reported, if any."""
    data = read_marker(paths, paths.attempt_dir(attempt) / FATAL_MARKER)
    return str(data["message"]) if data is not None and "message" in data else None


_DISK_ERRORS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                errno.EROFS: "read-only file system", errno.EACCES: "permission denied"}
_NOT_WRITABLE = (errno.EROFS, errno.EACCES)
_SIZE_ADVICE = "reduce --image-size or --global-batch, or use a smaller --model"


def disk_remedy(exc: BaseException) -> str:
    """What the user must do about :func:`disk_error`'s error before the run can continue:
    free space, or make a read-only or forbidden run directory writable."""
    if isinstance(exc, OSError) and exc.errno in _NOT_WRITABLE:
        return "the run directory is not writable: make it writable (or copy the run to a " \
               "writable place)"
    return "free some space"


def disk_error(exc: BaseException, where: object = None) -> str | None:
    """``no space left on device: PATH`` (or quota, read-only) for such an OSError, else None.

    A failed ``write`` or ``fsync`` names no file; ``where`` (the file or directory the caller was
    writing) stands in for it.
    """
    if isinstance(exc, OSError) and exc.errno in _DISK_ERRORS:
        path = exc.filename if exc.filename is not None else where
        return f"{_DISK_ERRORS[exc.errno]}: {path if path is not None else '(path unknown)'}"
    return None


_CPU_ALLOC = re.compile(r"can't allocate memory: you tried to allocate (\d+) bytes")
_GPU_ALLOC = re.compile(r"Tried to allocate ([\d.]+) ([KMGT]i?B).*?total capacity of ([\d.]+) "
                        r"([KMGT]i?B)", re.S)
_UNIT = {"KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
         "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_BAD_DATA = ("UnidentifiedImageError", "DecompressionBombError", "UnpicklingError")


def machine_memory() -> int | None:
    """Bytes of physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return None


def _exception_line(exc: BaseException) -> str:
    kind = type(exc)
    name = kind.__qualname__ if kind.__module__ == "builtins" else \
        f"{kind.__module__}.{kind.__qualname__}"
    text = " ".join(str(exc).split())
    return f"{name}: {text}" if text else name


def fatal_reason(exc: BaseException, where: object = None) -> str | None:
    """The one-line message of an exception no restart can fix; None for anything else.

    Fatal: a full disk, quota or read-only directory (the user must free space first); an
    allocation larger than the machine's memory or the GPU's capacity (it can never succeed);
    a data file that cannot be decoded (it will be just as broken after a restart).
    """
    disk = disk_error(exc, where)
    if disk is not None:
        return f"{disk} ({disk_remedy(exc)}, then run the same command again to continue)"
    line = _exception_line(exc)
    total = machine_memory()
    if isinstance(exc, MemoryError):
        limit = f"this machine has {total:,} bytes of memory" if total is not None \
            else "more than this process can get"
        return f"{line} ({limit}: {_SIZE_ADVICE})"
    text = str(exc)
    cpu = _CPU_ALLOC.search(text)
    if cpu is not None and total is not None and int(cpu.group(1)) > total:
        return (f"an allocation of {int(cpu.group(1)):,} bytes can never succeed on this machine, "
                f"which has {total:,} bytes of memory: {_SIZE_ADVICE}")
    gpu = _GPU_ALLOC.search(text)
    if gpu is not None and type(exc).__name__ == "OutOfMemoryError":
        want = float(gpu.group(1)) * _UNIT.get(gpu.group(2), 1)
        have = float(gpu.group(3)) * _UNIT.get(gpu.group(4), 1)
        if want > have:
            return (f"an allocation of {gpu.group(1)} {gpu.group(2)} can never succeed on a GPU "
                    f"of {gpu.group(3)} {gpu.group(4)}: {_SIZE_ADVICE}")
    if type(exc).__name__ in _BAD_DATA or (
            isinstance(exc, OSError) and "image file" in text):  # PIL: truncated, broken data
        return f"a data file cannot be read: {line} (repair the file, then run the same command " \
               "again; removing it changes the data set, which needs a new --out)"
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class RankError:
    """The exception a rank died of, as its traceback in ``torchrun.log`` ends."""

    rank: int | None
    """None when the line carried no ``[rankN]:`` prefix (before the process group existed)."""
    exception: str
    """The traceback's last line: ``module.Type: message``."""
    where: str | None
    """The innermost ``File "…", line N`` of the traceback, if any."""
    reported: bool = False
    """The rank's own ``ecrl trainer (rank N): …`` line, not a traceback."""


_PREFIX = re.compile(r"^\[rank(\d+)\]:(?: |$)")
_ROOT_CAUSE = re.compile(r"^\s*rank\s*:\s*(\d+)")
_LAUNCHER_ERRORS = ("ChildFailedError", "SignalException")


def rank_errors(text: str) -> list[RankError]:
    """Every rank's own last exception in a ``torchrun.log``, the root cause's rank first.

    Rank processes write their uncaught tracebacks with a ``[rankN]: `` prefix on every line
    (once the process group exists); torchrun's own ``ChildFailedError`` traceback, which names
    no cause, is left out. ``ecrl trainer (rank N): error: …`` lines count as the rank's report.
    """
    streams: dict[int | None, list[str]] = {}
    root: int | None = None
    in_root_cause = False
    for raw in text.splitlines():
        match = _PREFIX.match(raw)
        rank = int(match.group(1)) if match else None
        line = raw[match.end():] if match else raw
        streams.setdefault(rank, []).append(line)
        in_root_cause = in_root_cause or raw.startswith("Root Cause")
        cause = _ROOT_CAUSE.match(raw) if in_root_cause else None
        if cause is not None and root is None:
            root = int(cause.group(1))
    own: dict[int | None, RankError] = {}
    traced: dict[int | None, RankError] = {}
    for rank, lines in streams.items():
        error = _last_error(lines, rank)
        if error is not None:
            (own if error.reported else traced)[error.rank] = error
    # A rank's own one-line report says more than its traceback (which it then did not print).
    found = list({**traced, **own}.values())
    found.sort(key=lambda e: (e.rank != root, e.rank is None, e.rank or 0))
    return found


_OWN_REPORT = re.compile(r"^ecrl trainer \(rank (\d+)\): (?:error: )?(.*)$")


def _last_error(lines: list[str], rank: int | None) -> RankError | None:
    for line in reversed(lines):
        own = _OWN_REPORT.match(line)
        if own is not None:
            return RankError(rank=int(own.group(1)), exception=own.group(2), where=None,
                             reported=True)
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call")]
    for start in reversed(starts):
        where = None
        for at, line in enumerate(lines[start + 1:], start + 1):
            if line.startswith("  File ") and (where is None or not any(
                    lib in line for lib in ("site-packages", "<frozen", "/lib/python"))):
                where = line.strip()  # the innermost frame of our (or the user's) own code
            elif line and not line[0].isspace():
                if any(name in line.split(":", 1)[0] for name in _LAUNCHER_ERRORS):
                    break  # torchrun's own traceback: it says nothing of the cause
                worker = _IN_WORKER.search(line)
                if worker is not None:
                    inner = _worker_error(lines[at:], worker.group(1))
                    if inner is not None:
                        return RankError(rank=rank, exception=inner[0], where=inner[1] or where)
                return RankError(rank=rank, exception=line.strip(), where=where)
    return None


_IN_WORKER = re.compile(r"Caught \w+ in (DataLoader worker process \d+)")

_SCRIPT_ERRORS = (TypeError, AttributeError, NameError, ImportError, SyntaxError)
"""Errors in a script's own code: they recur on every restart, whatever the step."""


def script_error(exc: BaseException) -> str | None:
    """The one line for an error in a user's script that no restart can fix (a wrong call, a
    missing attribute or name, an import), the real one when a ``DataLoader`` worker raised it;
    None for anything else. A peer's death surfaces in the survivors as a ``RuntimeError`` of
    the process group, never as one of these."""
    if not isinstance(exc, _SCRIPT_ERRORS):
        return None
    lines = str(exc).splitlines()
    worker = _IN_WORKER.search(lines[0]) if lines else None
    found = _worker_error(lines, worker.group(1)) if worker is not None else None
    if found is not None:
        message, where = found
        return message + (f", {where}" if where else "")
    return _exception_line(exc)


def _worker_error(lines: list[str], worker: str) -> tuple[str, str | None] | None:
    """The real error of a ``DataLoader`` worker, from the "Original Traceback" that torch puts
    in the message it re-raises (whose own first line names only the type and the worker)."""
    try:
        start = next(i for i, line in enumerate(lines) if line.startswith("Original Traceback"))
    except StopIteration:
        return None
    where = None
    for line in lines[start + 1:]:
        if line.startswith("  File ") and (where is None or not any(
                lib in line for lib in ("site-packages", "<frozen", "/lib/python"))):
            where = line.strip()
        elif line and not line[0].isspace():
            return f"{line.strip()} (in {worker})", where
    return None
