"""Verifying a run while it trains (``ecrl-verify --follow RUN``).

A run that is still training is an *unfinished* run (docs/verifier.md): its committed prefix —
every step up to the last durable checkpoint — is held to every obligation, and every complete
record after it (a tentative one) is checked record by record; a torn last line of the running
attempt is expected, not an error. So a snapshot of a live run directory already has a sound
verdict: ``FAIL`` only on an anomaly the logs prove (a duplicate sample in the committed prefix,
a record outside its window, a rank missing from a committed step, …), else ``UNKNOWN`` until
the run completes.

Following is therefore a loop over snapshots: whenever a file of the run changed (a record
flushed, a checkpoint published, an attempt started), the run is verified again — with the
worker processes of ``--jobs`` — and each anomaly not reported before is handed to
``on_anomaly`` at once, the state to ``on_progress``. The loop ends after the first
verification that started once ``supervisor.json`` said the run had ended (``completed``,
``failed``, ``stopped``, ``deadline``): the supervisor writes that status after every rank
exited, so that verification read the final logs and its verdict is the offline one. A run
launched without ``ecrl launch`` has no supervisor: it ends once its newest attempt's own record
(``attempt.json``) says it completed the run; one that stops short of that is followed until
Ctrl-C. Ctrl-C
ends it with the verdict so far: ``FAIL`` if an anomaly was found, else ``UNKNOWN``.

Each verification reads the whole run again: its cost grows with the logs (about a second per
million records and worker, docs/benchmarks.md), which bounds how soon a record's verdict can
follow its flush on a long run. An incremental scan is not built.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ecrl.contract.runformat import MAX_RECORD_BYTES, RunPaths, is_run_dir, read_small_file
from verifier._parallel import Submit
from verifier.anomalies import Anomaly
from verifier.check import verify_run, workers
from verifier.result import RunResult, VerifyResult

__all__ = ["follow", "FollowState", "ENDED"]

ENDED = frozenset({"completed", "failed", "stopped", "deadline"})
"""``supervisor.json`` statuses after which no rank of the run writes any more."""

INTERRUPTED = "--follow was interrupted before the run ended: only what was proved so far holds"


@dataclass(frozen=True, kw_only=True, slots=True)
class FollowState:
    """What following has established after one verification."""

    result: RunResult
    status: str | None
    """``supervisor.json``'s status when the verification started (None: not written yet)."""
    verifications: int
    anomalies: int
    """Distinct anomalies reported so far."""
    started: float
    """``time.time()`` when the verification started (a record flushed before was read)."""


def _field(path: Path, root: Path, key: str) -> object:
    """``key`` of the JSON object in ``path``, read as the verifier reads any file of a run
    directory (a regular file, no link followed, no FIFO waited on), or None. A run directory
    someone else can write must not make ``--follow`` hang or read outside it."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return json.loads(read_small_file(path, limit=MAX_RECORD_BYTES, root=root)).get(key)
    return None


def _status(root: Path) -> str | None:
    """``supervisor.json``'s status; for a run no supervisor watches (launched without ``ecrl
    launch``), ``completed`` once its newest attempt recorded that it completed the run
    (``attempt.json``: written after that attempt's rank 0 logged the last step, by which time
    every rank had flushed its records of it), else None."""
    supervisor = root / "supervisor.json"
    if os.path.lexists(supervisor):
        status = _field(supervisor, root, "status")
        return status if isinstance(status, str) else None
    attempts = RunPaths.of(root).attempts()
    if attempts and _field(RunPaths.of(root).attempt_record(attempts[-1]), root,
                           "status") == "completed":
        return "completed"
    return None


def _snapshot(root: Path) -> tuple[tuple[str, int, int], ...]:
    """Size and modification time of every file the verifier reads, to poll cheaply."""
    out = []
    for folder in (root, root / "checkpoints", *sorted((root / "logs").glob("attempt-*"))):
        with contextlib.suppress(OSError):
            for entry in os.scandir(folder):
                with contextlib.suppress(OSError):
                    if entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        out.append((entry.path, info.st_size, info.st_mtime_ns))
    return tuple(sorted(out))


def _key(anomaly: Anomaly) -> str:
    return json.dumps(anomaly.as_dict(), sort_keys=True, default=str)


def follow(path: str | Path, *, jobs: int = 1, poll_s: float = 0.5,
           on_anomaly: Callable[[RunResult, Anomaly], None] | None = None,
           on_progress: Callable[[FollowState], None] | None = None,
           submit: Submit | None = None, sleep: Callable[[float], None] = time.sleep
           ) -> VerifyResult:
    """Verify the run directory ``path`` until its supervisor says it ended (see the module
    docstring); returns the final result, or on Ctrl-C the result so far (``FAIL`` if an
    anomaly was found, else ``UNKNOWN``). Waits for ``run.json`` if the run has not started."""
    if submit is None and jobs > 1:
        with workers(jobs) as pool:
            return follow(path, poll_s=poll_s, on_anomaly=on_anomaly, on_progress=on_progress,
                          submit=pool, sleep=sleep)
    root = Path(path)
    seen: set[str] = set()
    result: RunResult | None = None
    last: tuple[tuple[str, int, int], ...] | None = None
    verifications = 0
    try:
        while True:
            # The status first: if it says ended, the files read after it are final.
            status = _status(root)
            if is_run_dir(root):
                snapshot = _snapshot(root)
                if snapshot != last:
                    last = snapshot
                    started = time.time()
                    result = verify_run(root, submit=submit)
                    verifications += 1
                    for anomaly in result.anomalies:
                        key = _key(anomaly)
                        if key not in seen:
                            seen.add(key)
                            if on_anomaly is not None:
                                on_anomaly(result, anomaly)
                    if on_progress is not None:
                        on_progress(FollowState(result=result, status=status,
                                                verifications=verifications,
                                                anomalies=len(seen), started=started))
                if status in ENDED and result is not None:
                    break
            sleep(poll_s)
    except KeyboardInterrupt:
        if result is None:
            return VerifyResult(path=str(root), runs=(), unknown=(
                f"{root}: {INTERRUPTED} (nothing was verified yet)",))
        if result.verdict != "FAIL":
            result = replace(result, verdict="UNKNOWN",
                             unknown=(*result.unknown, INTERRUPTED))
    assert result is not None
    return VerifyResult(path=str(root), runs=(result,))
