"""What a run achieved, from its run directory (torch-free): steps, restarts, replay, goodput.

This is the runtime's own account, printed by ``ecrl run`` and ``ecrl demo``. The verifier
(``ecrl-verify``) computes its metrics independently from the same files and is the authority on
correctness; this summary checks nothing.

Goodput is :mod:`ecrl.contract.goodput`'s, the same number ``ecrl-verify`` prints: committed steps
over the wall time from the first attempt's start to the last attempt's end (relaunches and
replays included); a run stopped on Friday and continued on Monday did not spend the weekend
training, so the wait after a stop counts nowhere.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
import time
from dataclasses import dataclass

from ecrl.contract.errors import RunFormatError
from ecrl.contract.goodput import AttemptSpan, goodput
from ecrl.contract.runformat import (
    CheckpointEvent,
    JsonlReader,
    RunManifest,
    RunPaths,
    SupervisorState,
    read_json_record,
    read_small_file,
)
from ecrl.runtime.settings import SETTINGS_FILE, ResolvedCheckpoint

__all__ = ["RunSummary", "summarize", "render_summary"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunSummary:
    status: str
    target_steps: int
    committed_steps: int
    """Steps of the committed lineage (0..committed_steps-1)."""
    attempts: int
    restarts: int
    world_sizes: list[int]
    """World size of each attempt."""
    injected_failures: list[int]
    """Steps after which a failure was injected."""
    replayed_steps: int
    """Steps a failed attempt ran after the checkpoint its successor resumed from."""
    attempt_wall_s: list[float]
    """Wall time of each attempt, from its launch to its end (or to now, if it is running)."""
    wall_s: float
    """First start to last end, less the waits after stopped attempts (``ecrl.contract.goodput``);
    0 when unknown."""
    goodput: float
    """Committed steps per second of :attr:`wall_s`, relaunches and replays included (0 when
    unknown)."""
    checkpoints: int
    stall_s_total: float
    stall_s_median: float | None
    write_s_median: float | None
    settings: ResolvedCheckpoint | None = None
    """The checkpoint settings in effect in the last attempt that recorded them, with where each
    came from (flag, script, default); None when no rank recorded them."""
    verify: str | None = None
    """``--verify-follow``: the verdict of ``ecrl-verify --follow`` on the run (None: not
    asked for)."""


_SETTINGS_LIMIT = 64 << 10
"""A settings record is a few hundred bytes; anything larger was not written by a rank."""


def checkpoint_settings(paths: RunPaths, attempts: list[int]) -> ResolvedCheckpoint | None:
    """What the newest of ``attempts`` that started a Checkpointer recorded (rank 0's
    ``checkpoint-settings.json``), or None."""
    for attempt in reversed(attempts):
        path = paths.attempt_dir(attempt) / SETTINGS_FILE
        with contextlib.suppress(OSError, ValueError):
            found = ResolvedCheckpoint.from_record(
                json.loads(read_small_file(path, limit=_SETTINGS_LIMIT, root=paths.root)))
            if found is not None:
                return found
    return None


def summarize(root: str) -> RunSummary:
    paths = RunPaths.of(root)
    manifest = read_json_record(paths.manifest, RunManifest, root=paths.root)
    state = read_json_record(paths.supervisor, SupervisorState, root=paths.root)
    attempts = state.attempts
    replayed = 0
    for this, successor in itertools.pairwise(attempts):
        if this.last_step is not None:
            resumed = -1 if successor.resumed_from_step is None else successor.resumed_from_step
            replayed += max(0, this.last_step - resumed)
    committed = 0
    if attempts:
        last = attempts[-1]
        if last.last_step is not None:
            committed = last.last_step + 1
        elif last.resumed_from_step is not None:
            committed = last.resumed_from_step + 1
    now = time.time()
    # An attempt without an end time either runs now or was cut short with its supervisor; the
    # latter's time is unknown beyond its start, so it counts as zero rather than as "until now".
    walls = [max(0.0, (a.end_time if a.end_time is not None
                       else now if a is attempts[-1] and state.status == "running"
                       else a.start_time) - a.start_time) for a in attempts]
    running = state.status == "running"
    measured = goodput(committed_steps=committed, spans=[
        AttemptSpan(start=a.start_time,
                    end=a.end_time if a.end_time is not None
                    else now if a is attempts[-1] and running else None,
                    stopped=a.status == "stopped") for a in attempts])
    stalls: list[float] = []
    writes: list[float] = []
    for a in attempts:
        path = paths.checkpoint_log(a.attempt)
        if path.exists():
            with contextlib.suppress(RunFormatError):
                for _, event in JsonlReader(path, CheckpointEvent, torn_tail_ok=True,
                                            root=paths.root):
                    stalls.append(event.stall_s)
                    writes.append(event.write_s)
    return RunSummary(
        status=state.status, target_steps=manifest.target_steps, committed_steps=committed,
        attempts=len(attempts), restarts=state.restarts,
        world_sizes=[a.world_size for a in attempts],
        injected_failures=[int(f["global_step"])
                           for f in state.extra.get("injected_failures", [])],
        replayed_steps=replayed, attempt_wall_s=walls, wall_s=measured.wall_s or 0.0,
        goodput=measured.steps_per_s or 0.0,
        checkpoints=len(stalls), stall_s_total=sum(stalls),
        stall_s_median=statistics.median(stalls) if stalls else None,
        write_s_median=statistics.median(writes) if writes else None,
        settings=checkpoint_settings(paths, [a.attempt for a in attempts]),
    )


def render_summary(s: RunSummary) -> list[str]:
    def ms(value: float | None) -> str:
        return "n/a" if value is None else f"{value * 1e3:.1f} ms"

    sizes = " → ".join(map(str, s.world_sizes)) or "none"
    failures = (f"injected failures after steps {', '.join(map(str, s.injected_failures))}"
                if s.injected_failures else "no injected failures")
    per_attempt = ", ".join(f"{w:.1f}" for w in s.attempt_wall_s) or "none"
    settings = [f"settings:     {s.settings.describe()}"] if s.settings is not None else []
    return [
        f"steps:        {s.committed_steps}/{s.target_steps} committed ({s.status})",
        f"attempts:     {s.attempts} (world sizes {sizes}), restarts {s.restarts}, {failures}",
        f"replayed:     {s.replayed_steps} steps re-run after restarts",
        f"goodput:      {s.goodput:.2f} committed steps/s over {s.wall_s:.1f} s from the first "
        "launch to the last end (restarts and replays included; the wait between a stop and its "
        "continuation is not)",
        f"wall time:    {per_attempt} s per attempt",
        f"checkpoints:  {s.checkpoints} durable, training stall {ms(s.stall_s_median)} median "
        f"({s.stall_s_total:.2f} s total), write {ms(s.write_s_median)} median",
        *settings,
        *([f"verify:       {s.verify} (ecrl-verify --follow, beside the run)"]
          if s.verify is not None else []),
    ]
