"""The run directory: what the runtime writes and the verifier reads (torch-free).

::

    RUN/run.json                                 RunManifest
    RUN/supervisor.json                          SupervisorState (attempts, restarts, status)
    RUN/logs/attempt-NNN/rank-NNN.jsonl          StepRecord per line
    RUN/logs/attempt-NNN/checkpoint_rank0.jsonl  CheckpointEvent per line
    RUN/checkpoints/latest.json                  LatestPointer

Every record carries ``schema_version``; a reader rejects versions it does not know rather than
guess. Records are typed, frozen dataclasses; ``from_dict`` validates field names and types and
keeps unknown fields in ``extra`` (adding fields is allowed by the contract, renaming is not), and
``to_dict`` writes them back, so a round trip loses nothing.

JSON-lines files are appended one whole line per ``write`` and flushed, so the only damage a
killed process can do is a torn last line (no trailing newline). :class:`JsonlReader` tolerates
exactly that, where the caller says the file belongs to a failed attempt, and reports it as a
warning; every other defect is a :class:`~ecrl.contract.errors.RunFormatError` at ``file:line``.

The implementation is split by concern: :mod:`.records` (the typed records), :mod:`.jsonl`
(reading and writing them), :mod:`.layout` (the directory's paths); this module is their public
surface.

Someone else may be able to write a run directory: every reader opens its files through
:mod:`._safeio` (no link followed, no FIFO or device opened for reading, every read bounded:
lines by :data:`MAX_LINE_BYTES`, whole files by :data:`MAX_RECORD_BYTES`).
"""

from __future__ import annotations

from ecrl.contract.runformat._json import dumps, loads
from ecrl.contract.runformat._safeio import (
    MAX_LINE_BYTES,
    MAX_RECORD_BYTES,
    check_entry,
    open_regular,
    read_small_file,
)
from ecrl.contract.runformat.jsonl import (
    JsonlReader,
    JsonlWriter,
    TornLine,
    read_json_record,
    write_json_record,
)
from ecrl.contract.runformat.layout import RunPaths, find_runs, is_run_dir
from ecrl.contract.runformat.records import (
    ATTEMPT_STATUSES,
    EPOCH_COVERAGES,
    SAMPLER_KINDS,
    SCHEMA_VERSION,
    STRATEGIES,
    AttemptRecord,
    CheckpointEvent,
    LatestPointer,
    RunManifest,
    StepRecord,
    SupervisorAttempt,
    SupervisorState,
)

__all__ = [
    "SCHEMA_VERSION",
    "STRATEGIES",
    "EPOCH_COVERAGES",
    "SAMPLER_KINDS",
    "RunManifest",
    "SupervisorAttempt",
    "SupervisorState",
    "StepRecord",
    "CheckpointEvent",
    "LatestPointer",
    "AttemptRecord",
    "ATTEMPT_STATUSES",
    "TornLine",
    "JsonlReader",
    "JsonlWriter",
    "RunPaths",
    "read_json_record",
    "read_small_file",
    "open_regular",
    "check_entry",
    "MAX_LINE_BYTES",
    "MAX_RECORD_BYTES",
    "write_json_record",
    "find_runs",
    "is_run_dir",
    "dumps",
    "loads",
]
