"""A run without ``supervisor.json``: its attempts as their own ranks recorded them.

A run launched by anything but ``ecrl launch`` (plain ``torchrun``, a framework's launcher, a
scheduler's requeue) has no supervisor to record its attempts, but each attempt's rank 0 wrote
``logs/attempt-NNN/attempt.json`` before its first step record: the checkpoint it resumed from
(verified against its checksum when loaded) or a fresh start, and its world size; rewritten as
``completed`` once the attempt logged the run's last step and closed its log. That is what the
committed lineage rests on (:mod:`verifier.lineage`), so the attempts are rebuilt from those
records into the shape ``supervisor.json`` has. What only a supervisor knows — exit codes, how an
attempt ended, whether the last one is still running — is left unknown, never invented:

- ``exit_code`` and ``first_step`` are null (the logs give the first step);
- an attempt that completed is ``completed``; an earlier one that did not is ``ended`` (it ended
  without completing the run, how is not recorded); the last one that did not is ``running`` (it
  may still be running, or it died: the run is unfinished either way).
"""

from __future__ import annotations

import os

from ecrl.contract.errors import RunFormatError
from ecrl.contract.runformat import (
    AttemptRecord,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    read_json_record,
)
from verifier.errors import Unusable

__all__ = ["RECORDED_BY", "from_attempt_records"]

RECORDED_BY = "attempts"
"""``extra["recorded_by"]`` of a state rebuilt here (``supervisor.json`` never has it)."""


def from_attempt_records(paths: RunPaths) -> SupervisorState:
    """The attempts of a run without ``supervisor.json``, from their ``attempt.json`` records.

    A log folder without a record and without step logs (a launch that died before its first
    step, before it knew what it resumed from) is left out: the lineage's check of attempt
    numbers reports it as a stray folder. One with step logs but no record cannot be placed in
    the lineage: :class:`Unusable`."""
    attempts: list[SupervisorAttempt] = []
    points: dict[str, dict[str, object]] = {}
    numbers = paths.attempts()
    if not any(os.path.lexists(paths.attempt_record(n)) for n in numbers):
        raise Unusable(
            f"{paths.supervisor}: file is missing, and no attempt recorded itself "
            "(logs/attempt-NNN/attempt.json; an ECRL older than the run format's attempt records "
            "wrote none): the verifier cannot tell which checkpoint each attempt resumed from")
    records: list[AttemptRecord] = []
    for number in numbers:
        path = paths.attempt_record(number)
        if not os.path.lexists(path):
            if paths.rank_logs(number):
                raise Unusable(
                    f"{path}: file is missing, and there is no supervisor.json: attempt {number} "
                    "logged steps without recording which checkpoint it resumed from, so its "
                    "place in the lineage is unknown")
            continue
        try:
            record = read_json_record(path, AttemptRecord, root=paths.root)
        except RunFormatError as exc:
            raise Unusable(str(exc)) from None
        if record.attempt != number:
            raise Unusable(f"{path}: says attempt {record.attempt}, in the folder of attempt "
                           f"{number}")
        records.append(record)
    for i, record in enumerate(records):
        last = i == len(records) - 1
        status = "completed" if record.status == "completed" else \
            ("running" if last else "ended")
        attempts.append(SupervisorAttempt(
            attempt=record.attempt, world_size=record.world_size,
            resumed_from_step=record.resumed_from_step, first_step=None,
            last_step=record.last_step, exit_code=None, status=status,
            start_time=record.start_time, end_time=record.end_time))
        if record.resumed_from_step is not None:
            points[str(record.attempt)] = {"global_step": record.resumed_from_step,
                                           "checksum": record.resumed_from_checksum}
    final = attempts[-1]
    return SupervisorState(
        attempts=attempts, restarts=len(attempts) - 1,
        status="completed" if final.status == "completed" else "running",
        extra={"recorded_by": RECORDED_BY, "resume_points": points})
