"""How an attempt ended, from the markers its ranks leave (torch-free: the supervisor reads it).

- ``jit.json``: a survivor's just-in-time rescue (:mod:`ecrl.runtime.checkpoint.jit`): which
  rank, the step it saved (or why it saved nothing), and what ended the attempt;
- ``hung-rank-RRR.json``: each rank whose watchdog fired
  (:mod:`ecrl.runtime.checkpoint.watchdog`); the ranks of the attempt that wrote none are the
  ones that stopped stepping;
- ``deadline.json``: rank 0 committed the final checkpoint before the deadline
  (:mod:`ecrl.runtime.checkpoint.deadline`).

Markers are read with :func:`ecrl.runtime.failure.read_marker` (bounded, no link followed, no
FIFO waited on): someone else may be able to write the run directory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract.runformat import RunPaths
from ecrl.runtime.failure import read_marker

__all__ = ["JIT_MARKER", "JIT_CLAIM", "HUNG_MARKER", "DEADLINE_MARKER", "Ending", "read_ending",
           "hung_markers"]

JIT_MARKER = "jit.json"
JIT_CLAIM = "jit.claim"
"""Created (``O_EXCL``) by the one survivor that saves; ``jit.json`` follows once it is done."""
HUNG_MARKER = "hung-rank-{rank:03d}.json"
DEADLINE_MARKER = "deadline.json"
_HUNG = re.compile(r"^hung-rank-(\d{3,})\.json$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Ending:
    """``deadline``, ``hung`` or ``jit``, with what the markers say."""

    status: str
    jit: dict[str, Any] | None = None
    """The rescue record, when a survivor wrote one."""
    hung: dict[int, dict[str, Any]] = field(default_factory=dict)
    """Rank → its watchdog's record, for every rank that saw the hang."""
    stopped_ranks: tuple[int, ...] = ()
    """Ranks that stopped stepping (wrote no hang record)."""
    deadline: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.jit is not None:
            out["jit"] = self.jit
        if self.hung:
            out["hung"] = {str(r): v for r, v in sorted(self.hung.items())}
            out["stopped_ranks"] = list(self.stopped_ranks)
        if self.deadline is not None:
            out["deadline"] = self.deadline
        return out


def read_ending(paths: RunPaths, attempt: int, world_size: int) -> Ending | None:
    """The attempt's ending per its markers; None when it left none."""
    directory = paths.attempt_dir(attempt)
    deadline = read_marker(paths, directory / DEADLINE_MARKER)
    if deadline is not None:
        return Ending(status="deadline", deadline=deadline)
    hung: dict[int, dict[str, Any]] = {}
    for entry in hung_markers(directory):
        record = read_marker(paths, entry)
        match = _HUNG.match(entry.name)
        if record is not None and match is not None:
            hung[int(match.group(1))] = record
    jit = read_marker(paths, directory / JIT_MARKER)
    if hung:
        stopped = tuple(r for r in range(world_size) if r not in hung)
        return Ending(status="hung", jit=jit, hung=hung, stopped_ranks=stopped)
    if jit is not None:
        return Ending(status="jit", jit=jit)
    return None


def hung_markers(directory: Path) -> list[Path]:
    """The ``hung-rank-RRR.json`` markers in an attempt's folder."""
    try:
        return sorted(e for e in directory.iterdir() if _HUNG.match(e.name))
    except OSError:
        return []
