"""Following an attempt from its step logs: rank 0's new records, and how far every rank got."""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import (
    MAX_LINE_BYTES,
    JsonlReader,
    RunPaths,
    StepRecord,
    loads,
    open_regular,
)
from ecrl.runtime.supervision.events import StepProgress

__all__ = ["StepTail", "ProgressMeter", "attempt_steps"]


@dataclass(slots=True)
class StepTail:
    """New complete lines of a growing JSON-lines file.

    Opened like every run-format file (:func:`ecrl.contract.runformat.open_regular`: no link,
    FIFO or device; ``root`` the run directory) and read at most :data:`_TAIL_BYTES` per call; a
    stretch that long without a newline is no step record and is skipped."""

    path: Path
    offset: int = 0
    root: Path | None = None

    def read(self) -> list[dict[str, Any]]:
        try:
            fd = open_regular(self.path, root=self.root)
        except OSError:  # not there yet, or not a file ECRL reads (the verifier says which)
            return []
        try:
            data = os.pread(fd, _TAIL_BYTES, self.offset)
        finally:
            os.close(fd)
        end = data.rfind(b"\n") + 1
        if end == 0 and len(data) == _TAIL_BYTES:
            end = len(data)
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                out.append(loads(line))
        return out


_TAIL_BYTES = 2 * MAX_LINE_BYTES


def attempt_steps(paths: RunPaths, attempt: int, world_size: int) -> tuple[int | None, int | None]:
    """(first step any rank ran, last step every rank of the attempt logged), from the logs."""
    per_rank: list[set[int]] = []
    first: int | None = None
    for rank in range(world_size):
        path = paths.rank_log(attempt, rank)
        steps: set[int] = set()
        if path.exists():
            reader = JsonlReader(path, StepRecord, torn_tail_ok=True, root=paths.root)
            with contextlib.suppress(RunFormatError):
                for _, data in reader.raw():
                    steps.add(int(data["global_step"]))
        per_rank.append(steps)
        if steps:
            first = min(steps) if first is None else min(first, min(steps))
    common = set.intersection(*per_rank) if per_rank else set()
    return first, (max(common) if common else None)


@dataclass(slots=True)
class ProgressMeter:
    """Turns step records into a :class:`StepProgress` at most once per ``interval`` seconds
    (and once more at the attempt's end), with the rate since the previous one."""

    target: int
    interval: float = 1.0
    last_report: float = 0.0
    last_step: int | None = None
    last_loss: float | None = None
    reported_step: int | None = None
    window: list[tuple[float, int]] = field(default_factory=list)

    def update(self, records: list[dict[str, Any]], *, attempt: int, world: int,
               restarts: int, force: bool = False) -> StepProgress | None:
        for r in records:
            self.last_step = int(r["global_step"])
            self.last_loss = r.get("loss")
            self.window.append((float(r["time"]), self.last_step))
        now = time.monotonic()
        if self.last_step is None or self.last_step == self.reported_step or not (
                force or now - self.last_report >= self.interval):
            return None
        self.reported_step = self.last_step
        self.window = self.window[-200:]
        rate = None
        if len(self.window) >= 2 and self.window[-1][0] > self.window[0][0]:
            steps = self.window[-1][1] - self.window[0][1]
            rate = steps / (self.window[-1][0] - self.window[0][0])
        self.last_report = now
        self.window = self.window[-1:]
        return StepProgress(step=self.last_step, target_steps=self.target,
                            loss=self.last_loss if isinstance(self.last_loss, float) else None,
                            steps_per_s=rate, restarts=restarts, attempt=attempt,
                            world_size=world)
