"""Goodput and the wall-time decomposition, from the data the check already gathered.

Goodput is :mod:`ecrl.contract.goodput`'s, the one definition ``ecrl run``'s summary prints too:
``committed_steps / wall_s``, where ``wall_s`` runs from the first attempt's start to the last
attempt's end (less the wait after an attempt a person stopped), so restarts, replayed steps and
checkpoint stalls all count against it. For a run that has not finished, ``committed_steps`` is
its committed prefix (up to the last durable checkpoint) and an attempt without a recorded end
ends at its last record; the final attempt's later steps are ``tentative_steps``, not replayed
ones.
The checkpoint-time decomposition sums the phases each checkpoint event recorded; ``restart_s``
and ``lost_s`` split the rest of the failure cost (time between attempts, work after an
attempt's last committed step).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from ecrl.contract.goodput import AttemptSpan, goodput
from verifier.result import AttemptSummary, CheckpointPoint, Metrics
from verifier.schema import RunInputs

__all__ = ["AttemptTimes", "compute", "checkpoint_points", "loss_divergence"]

AttemptTimes = tuple[float | None, float | None, float | None]
"""(first record time, last record time, last committed record time) of an attempt."""


def checkpoint_points(inputs: RunInputs) -> list[CheckpointPoint]:
    return [CheckpointPoint(attempt=r.attempt, step=r.event.global_step,
                            stall_s=float(r.event.stall_s), write_s=float(r.event.write_s),
                            snapshot_s=float(r.event.snapshot_s),
                            time=_num(r.event.extra.get("time")))
            for k in sorted(inputs.checkpoints) for r in inputs.checkpoints[k]]


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def loss_divergence(loss: npt.NDArray[np.float64] | None,
                    reference: npt.NDArray[np.float64] | None
                    ) -> tuple[float | None, float | None, int | None]:
    """(max, mean) |loss - reference| over steps where both are known, and how many steps."""
    if loss is None or reference is None:
        return None, None, None
    n = min(loss.size, reference.size)
    a, b = loss[:n], reference[:n]
    both = np.isfinite(a) & np.isfinite(b)
    count = int(np.count_nonzero(both))
    if count == 0:
        return None, None, 0
    diff = np.abs(a[both] - b[both])
    return float(diff.max()), float(diff.mean()), count


def compute(inputs: RunInputs, summaries: Sequence[AttemptSummary],
            times: Mapping[int, AttemptTimes], *, committed_steps: int, records: int,
            loss: npt.NDArray[np.float64] | None = None,
            reference: npt.NDArray[np.float64] | None = None) -> Metrics:
    attempts = inputs.supervisor.attempts
    ends: list[float | None] = []
    for a in attempts:
        first, last, _ = times.get(a.attempt, (None, None, None))
        ends.append(a.end_time if a.end_time is not None else last)
    measured = goodput(committed_steps=committed_steps, spans=[
        AttemptSpan(start=a.start_time, end=end, stopped=a.status == "stopped")
        for a, end in zip(attempts, ends, strict=True)])
    restart = 0.0
    restart_known = len(attempts) > 1
    for a, prev_end in zip(attempts[1:], ends[:-1], strict=True):
        first = times.get(a.attempt, (None, None, None))[0]
        if first is None or prev_end is None:
            restart_known = False
            break
        restart += max(0.0, first - prev_end)
    lost = 0.0
    final = attempts[-1].attempt
    for s, end in zip(summaries, ends, strict=True):
        if s.attempt == final or end is None:
            continue
        commit = times.get(s.attempt, (None, None, None))[2]
        since = commit if commit is not None and s.committed is not None else s.start_time
        if since is not None:
            lost += max(0.0, end - since)
    events = [r.event for k in sorted(inputs.checkpoints) for r in inputs.checkpoints[k]]
    biggest, mean, compared = loss_divergence(loss, reference)
    return Metrics(
        committed_steps=committed_steps,
        restarts=len(attempts) - 1,
        replayed_steps=sum(s.replayed_steps for s in summaries),
        tentative_steps=sum(s.tentative_steps for s in summaries),
        wall_s=measured.wall_s,
        goodput=measured.steps_per_s,
        stall_s=float(sum(e.stall_s for e in events)),
        write_s=float(sum(e.write_s for e in events)),
        snapshot_s=float(sum(e.snapshot_s for e in events)),
        enqueue_s=float(sum(e.enqueue_s for e in events)),
        backpressure_s=float(sum(e.backpressure_s for e in events)),
        checkpoints=len(events),
        records=records,
        restart_s=restart if restart_known else None,
        lost_s=lost if len(attempts) > 1 else 0.0,
        loss_max_abs_diff=biggest,
        loss_mean_abs_diff=mean,
        loss_steps_compared=compared,
        replayed_per_failure=tuple(s.replayed_steps for s in summaries if s.attempt != final),
        endings=dict(Counter(s.status for s in summaries if s.attempt != final)),
    )
