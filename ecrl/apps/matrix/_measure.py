"""What a finished run measured: step time, checkpoint stall, restore time (torch-free).

Used by ``ecrl advise --from-run`` (the inputs of the checkpoint-interval models, measured instead
of typed in) and by the matrix, which stores them in every unit's record so that ``ecrl advise
--from-matrix`` can give per-strategy figures without reading the runs again.

- step time: the median of the ``step_s`` the trainer records for every step (rank 0, every
  attempt; replayed steps are real steps too). The median keeps warm-up steps and a loaded
  machine's hiccups out.
- checkpoint stall: the median ``stall_s`` of the checkpoint events — the training time one
  checkpoint costs (with ``overlapped``, the copy, not the background write).
- restore time: the verifier's ``restart_s`` (a failed attempt's end to the next attempt's first
  completed step: detection, relaunch, load and the first step) per restart, minus one step time.
  A run without restarts has no restore to measure; its first launch (start to first completed
  step, minus one step time) is then the estimate, as a relaunch does the same work plus a load.
"""

from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import (
    CheckpointEvent,
    JsonlReader,
    RunManifest,
    RunPaths,
    StepRecord,
    SupervisorState,
    is_run_dir,
    read_json_record,
)

if TYPE_CHECKING:
    from verifier import Metrics

__all__ = ["Measured", "measure_run"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Measured:
    """The advise inputs one run measured; times in seconds."""

    path: str
    strategy: str
    world_size: int
    """World size of the run's last attempt (its GPUs, for the job failure rate)."""
    ckpt_every: int
    step_s: float
    """Median step time."""
    steps: int
    """Step records the median is over."""
    ckpt_stall_s: float | None
    """Median stall per checkpoint (None: the run took no checkpoint)."""
    checkpoints: int
    restore_s: float
    """Per restart (or the first launch: see ``restore_from``)."""
    restore_from: str
    """``"N restarts"`` or ``"first launch"``: where ``restore_s`` comes from."""

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


def _records(paths: RunPaths, attempt: int) -> list[StepRecord]:
    path = paths.rank_log(attempt, 0)
    if not path.exists():
        return []
    with contextlib.suppress(RunFormatError):
        return [r for _, r in JsonlReader(path, StepRecord, torn_tail_ok=True)]
    return []


def measure_run(path: str | Path, *, metrics: Metrics | None = None) -> Measured:
    """The measured advise inputs of one run directory; a :class:`ConfigError` if it has none.

    ``metrics``: the verifier's metrics of this run when the caller has them already.
    """
    root = Path(path)
    if not is_run_dir(root):
        raise ConfigError(f"--from-run {root}: not a run directory (no run.json); give the --out "
                          "of an `ecrl run`")
    paths = RunPaths.of(root)
    try:
        manifest = read_json_record(paths.manifest, RunManifest)
        state = read_json_record(paths.supervisor, SupervisorState)
    except (RunFormatError, OSError) as exc:
        raise ConfigError(f"--from-run {root}: cannot read the run: {exc}") from None
    step_times: list[float] = []
    first_launch: float | None = None
    stalls: list[float] = []
    for a in state.attempts:
        records = _records(paths, a.attempt)
        for r in records:
            value = r.extra.get("step_s")
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                step_times.append(float(value))
        if a.attempt == 0 and records:
            first_launch = records[0].time - a.start_time
        log = paths.checkpoint_log(a.attempt)
        if log.exists():
            with contextlib.suppress(RunFormatError):
                stalls.extend(e.stall_s for _, e in JsonlReader(log, CheckpointEvent,
                                                                torn_tail_ok=True))
    if not step_times:
        raise ConfigError(f"--from-run {root}: its step records carry no step_s (not written by "
                          "ecrl run, or no step finished); give --step-time instead")
    step = statistics.median(step_times)
    restore, source = _restore(root, state.restarts, step, metrics)
    if restore is None:
        if first_launch is None:
            raise ConfigError(f"--from-run {root}: no step finished, so no restore time can be "
                              "measured")
        restore, source = max(0.0, first_launch - step), "first launch"
    return Measured(
        path=str(root), strategy=manifest.strategy,
        world_size=state.attempts[-1].world_size if state.attempts else manifest.world_sizes[0],
        ckpt_every=manifest.ckpt_every, step_s=step, steps=len(step_times),
        ckpt_stall_s=statistics.median(stalls) if stalls else None, checkpoints=len(stalls),
        restore_s=restore, restore_from=source)


def _restore(root: Path, restarts: int, step: float, metrics: Metrics | None
             ) -> tuple[float | None, str]:
    """Per-restart restore time from the verifier's goodput decomposition (None: no restart)."""
    if restarts < 1:
        return None, ""
    if metrics is None:
        from verifier import verify_run

        metrics = verify_run(root).metrics
    if metrics.restart_s is None or metrics.restarts < 1:
        return None, ""
    per = max(0.0, metrics.restart_s / metrics.restarts - step)
    return per, f"{metrics.restarts} restart{'s' if metrics.restarts != 1 else ''}"
