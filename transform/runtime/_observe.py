"""Watching a program's checkpoints from inside its process: what each save cost the training
thread, and what each write put on disk (``ecrl bench transform`` times saves and counts bytes
with it). Nothing here is needed to resume, and an observer cannot change what the program does:
an exception it raises is reported in one line and otherwise ignored.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Saved", "Written", "Event", "observe", "notify"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Saved:
    """A save, seen on the training thread when ``_checkpoint()`` returns to the program."""

    number: int
    """The process's saves, counted from 1."""
    hint: int
    """The hint that saved (its id in the plan)."""
    seconds: float
    """Time on the training thread: collecting and serializing the live values and handing them
    to the writer (with ``ECRL_TRANSFORM_SYNC=1``, the durable write too)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Written:
    """A state written whole, seen on the thread that wrote it (the background writer's)."""

    number: int
    """The save it holds (a state superseded while it waited is never written)."""
    bytes: int
    """Bytes written for it: ``resume.ckpt`` and the blobs that were not on disk yet."""


Event = Saved | Written

_observers: list[Callable[[Event], None]] = []


def observe(callback: Callable[[Event], None]) -> Callable[[], None]:
    """Call ``callback`` with every :class:`Saved` and :class:`Written` of the transformed
    programs in this process, from now on; returns a function that stops it."""
    _observers.append(callback)

    def stop() -> None:
        if callback in _observers:
            _observers.remove(callback)

    return stop


def notify(event: Event) -> None:
    for callback in list(_observers):
        try:
            callback(event)
        except Exception as exc:  # an observer never changes what the program does
            sys.stderr.write(f"ecrl-transform: an observer of checkpoints failed: "
                             f"{type(exc).__name__}: {exc}\n")
