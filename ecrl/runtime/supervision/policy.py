"""The attempt policy: how an attempt ended, and whether the run relaunches or ends.

An attempt ends:

- ``completed``: exit 0 and the final step logged by every rank → the run is done;
- stopped by Ctrl-C, SIGTERM or SIGHUP → the run is recorded as ``stopped`` and continues later;
- with ``fatal.json`` (a problem no restart can fix, e.g. a corrupt checkpoint) → the run fails;
- ``deadline``: the ranks saved a final checkpoint before the deadline → the run waits for a
  later invocation;
- ``jit``, ``hung`` (:mod:`ecrl.runtime.endings`), an injected failure (the failing rank left
  ``failure.json``) or any other exit (a crash) → relaunch, unless the same exception ended the
  previous attempt at the same step from the same checkpoint (a restart replays the same inputs,
  so it would fail again) or the restart limit is reached.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ecrl.runtime.checkpoint.deadline import DEADLINE_EXIT_CODE
from ecrl.runtime.endings import Ending
from ecrl.runtime.failure import FiredFailure, RankError, rank_errors

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_STOPPED", "Outcome", "RunEnd", "classify",
           "rank_error", "log_tail", "repeated", "after_attempt"]

EXIT_OK, EXIT_FAILED, EXIT_STOPPED = 0, 1, 130


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    """How one attempt ended, as the supervisor classifies it."""

    attempt: int
    exit_code: int
    last_step: int | None
    status: str
    """completed, failed, stopped, or (:mod:`ecrl.runtime.endings`) jit, hung, deadline."""
    fired: FiredFailure | None
    """The injected failure that ended it, if one did."""
    fatal: str | None
    """The message of an error no restart can fix, if a rank reported one."""
    error: RankError | None = None
    """A crash: the failing rank's own exception, from ``torchrun.log``."""
    ending: Ending | None = None
    """What the ranks' jit, hang and deadline markers say."""

    @property
    def crashed(self) -> bool:
        """Failed for a reason neither injected nor reported as fatal."""
        return self.status == "failed" and self.fired is None and self.fatal is None


def classify(*, attempt: int, exit_code: int, last_step: int | None, target_steps: int,
             stopping: bool, fired: FiredFailure | None, fatal: str | None,
             ending: Ending | None) -> Outcome:
    """The attempt's status from its exit code, its logs and its ranks' markers."""
    outcome = Outcome(attempt=attempt, exit_code=exit_code, last_step=last_step, fired=fired,
                      fatal=fatal, status="failed")
    if exit_code == 0 and last_step == target_steps - 1:
        return replace(outcome, status="completed")
    if stopping:
        return replace(outcome, status="stopped")
    if ending is not None and fatal is None:
        return replace(outcome, status=ending.status, ending=ending)
    return outcome


def rank_error(log: Path) -> RankError | None:
    """The first rank's exception that ``torchrun.log`` shows, if any."""
    try:
        errors = rank_errors(log.read_text(errors="replace"))
    except OSError:
        return None
    return errors[0] if errors else None


def log_tail(log: Path, lines: int = 15) -> tuple[str, ...] | None:
    """The lines of ``torchrun.log`` that say most about a crash no rank explained (None when
    the log cannot be read)."""
    with contextlib.suppress(OSError):
        text = log.read_text(errors="replace").splitlines()
        # The ranks' own one-line reports say more than torchrun's summary of them; failing
        # that, the first traceback (a rank's; torchrun's own comes after it).
        shown = [line for line in text
                 if line.startswith(("ecrl trainer (rank", "ecrl (rank"))][-lines:]
        if not shown and "Traceback (most recent call last):" in text:
            start = text.index("Traceback (most recent call last):")
            end = next((i for i in range(start + 1, len(text))
                        if text[i] and not text[i][0].isspace()), len(text) - 1)
            shown = text[start : end + 1][-lines:]
        return tuple(shown or text[-lines:])
    return None


def repeated(outcome: Outcome, crashes: dict[str, Any]) -> bool:
    """The same exception ended the previous attempt at the same step, from the same
    checkpoint (``crashes``: supervisor.json's record of them)."""
    if outcome.error is None:
        return False
    now, before = crashes.get(str(outcome.attempt)), crashes.get(str(outcome.attempt - 1))
    return isinstance(before, dict) and isinstance(now, dict) and all(
        before.get(k) == now.get(k) for k in ("exception", "last_step", "resumed_from_step"))


@dataclass(frozen=True, kw_only=True, slots=True)
class RunEnd:
    """The run ends after this attempt."""

    status: str
    """supervisor.json's status: completed, stopped, failed, deadline."""
    exit_code: int
    why: str
    """completed, stopped, fatal, deadline, repeated or restart_limit."""


def after_attempt(outcome: Outcome, *, relaunches: int, max_restarts: int,
                  repeated_crash: bool) -> RunEnd | None:
    """How the run goes on after ``outcome``: a :class:`RunEnd`, or None to relaunch."""
    if outcome.status == "completed":
        return RunEnd(status="completed", exit_code=EXIT_OK, why="completed")
    if outcome.status == "stopped":
        return RunEnd(status="stopped", exit_code=EXIT_STOPPED, why="stopped")
    if outcome.fatal is not None:
        return RunEnd(status="failed", exit_code=EXIT_FAILED, why="fatal")
    if outcome.status == "deadline":
        return RunEnd(status="deadline", exit_code=DEADLINE_EXIT_CODE, why="deadline")
    if repeated_crash:
        return RunEnd(status="failed", exit_code=EXIT_FAILED, why="repeated")
    if relaunches >= max_restarts:
        return RunEnd(status="failed", exit_code=EXIT_FAILED, why="restart_limit")
    return None
