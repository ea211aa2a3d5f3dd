"""Deterministic failure injection (torch-free).

A failure is injected after a configured global step, once the step's update, its record and
any checkpoint boundary have completed (seed ``000_…`` §4.6): the chosen rank writes
``logs/attempt-NNN/failure.json`` and exits at once with ``os._exit(137)``, the status of a
SIGKILLed process, without flushing, closing or saying goodbye to its peers. The peers then fail
in their next collective and torchrun tears the group down.

A problem that no restart can fix (a corrupt checkpoint, data that changed under the run) is the
opposite case: the rank writes ``fatal.json`` with a one-line message and exits with code 3, and
the supervisor stops instead of relaunching (:func:`write_fatal`, :func:`read_fatal`).

Each step of ``--fail-at`` fails once over the whole run. A resumed attempt re-runs the steps
after its checkpoint, so the supervisor reads the markers of earlier attempts and passes only the
failures that have not fired yet to the next attempt (:func:`remaining`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NoReturn

from ecrl.contract.atomicio import atomic_write_text
from ecrl.contract.runformat import RunPaths

__all__ = ["FAILURE_EXIT_CODE", "FATAL_EXIT_CODE", "FailurePlan", "FiredFailure", "inject",
           "read_fired", "remaining", "write_fatal", "read_fatal"]

FAILURE_EXIT_CODE = 137
FATAL_EXIT_CODE = 3
MARKER = "failure.json"
FATAL_MARKER = "fatal.json"


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


def read_fired(paths: RunPaths, attempt: int) -> FiredFailure | None:
    """The failure ``attempt`` injected, if any."""
    try:
        data = json.loads((paths.attempt_dir(attempt) / MARKER).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return FiredFailure(attempt=attempt, global_step=int(data["global_step"]),
                        rank=int(data["rank"]))


def remaining(planned: Iterable[int], fired: Iterable[FiredFailure]) -> list[int]:
    """Planned failure steps that have not fired in any attempt yet, ascending."""
    done = {f.global_step for f in fired}
    return sorted(set(planned) - done)


def write_fatal(paths: RunPaths, *, attempt: int, rank: int, message: str) -> None:
    marker = {"rank": rank, "message": message, "time": time.time()}
    atomic_write_text(paths.attempt_dir(attempt) / FATAL_MARKER, json.dumps(marker) + "\n")


def read_fatal(paths: RunPaths, attempt: int) -> str | None:
    """The message of the unrecoverable error ``attempt`` reported, if any."""
    try:
        return str(json.loads((paths.attempt_dir(attempt) / FATAL_MARKER).read_text())["message"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError, TypeError):
        return None
