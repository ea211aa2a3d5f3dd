"""What the supervisor tells the person watching: events as data, no text.

The supervisor reports each event to a :class:`Reporter` (``reporter.report(event)``) and never
prints. The applications render them (``ecrl run``, ``ecrl launch`` and ``ecrl demo`` pass
:class:`ecrl.apps.console.Console`, which prints the lines people and tests know); a library user
passes their own reporter, or none (:class:`Silent`). A reporter must not raise: the supervisor
keeps supervising whatever happens to the reader.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ecrl.contract.runformat import RunManifest
from ecrl.runtime.endings import Ending
from ecrl.runtime.failure import FiredFailure, RankError
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervision.summary import RunSummary

__all__ = ["Reporter", "Silent", "Event", "RunOpened", "RunAlreadyComplete", "RunResumed",
           "PointerRepaired", "StopRequested", "AttemptStarted", "StepProgress", "CrashReport",
           "AttemptEnded", "RunCompleted", "RunFailed", "RepeatedCrash", "RestartLimitReached",
           "DeadlinePassed", "ScriptEndedShort", "StrayLogsSetAside"]


@dataclass(frozen=True, kw_only=True, slots=True)
class RunOpened:
    """The run directory is ready and its first attempt is about to start."""

    command: str
    """``run`` or ``launch``."""
    root: Path
    manifest: RunManifest
    """``run.json`` (``ecrl launch``: a placeholder until the script writes it)."""
    config: RunConfig
    program: tuple[str, ...]
    """What torchrun runs on every rank."""
    node_rank: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunAlreadyComplete:
    """``--out`` holds a completed run: nothing is launched."""

    command: str
    root: Path
    target_steps: int | None
    """The run's target (None where the supervisor does not read run.json: ``ecrl launch``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunResumed:
    """``--out`` holds an unfinished run, which continues."""

    command: str
    root: Path
    earlier_attempts: int


@dataclass(frozen=True, kw_only=True, slots=True)
class PointerRepaired:
    """``latest.json`` named an unusable checkpoint; the supervisor points it at the one used."""

    description: str | None
    """The resume choice in words (``ResumeChoice.describe``)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StrayLogsSetAside:
    """Attempt folders under ``logs/`` that ``supervisor.json`` does not record (planted, or
    copied in) were renamed out of the run format, kept as evidence (``stray_logs``)."""

    command: str
    moved: tuple[tuple[str, str], ...]
    """``(folder, moved_to)`` for each, relative to the run directory."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StopRequested:
    """A first Ctrl-C, SIGTERM or SIGHUP: the job is being stopped."""

    signal_name: str


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptStarted:
    attempt: int
    world_size: int
    resumed_from_step: int | None
    """The checkpoint it resumes from; None for a fresh start."""
    target_steps: int
    """0 while unknown (``ecrl launch`` before the script wrote run.json)."""
    fail_at: Sequence[int]
    """The injected failures still to fire."""
    framework: str | None = None
    """With no ECRL checkpoint to resume from: the framework (``lightning``, ``accelerate``)
    whose own checkpoints the script resumes from itself (``ecrl launch`` of a framework's
    script; the attempt's ``attempt.json`` then says from which step)."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepProgress:
    """Rank 0's newest step, at most about once a second."""

    step: int
    target_steps: int
    """0 while unknown."""
    loss: float | None
    steps_per_s: float | None
    """Over the steps since the previous report; None until two steps were seen."""
    restarts: int
    attempt: int
    world_size: int


@dataclass(frozen=True, kw_only=True, slots=True)
class CrashReport:
    """Why an attempt crashed, as far as ``torchrun.log`` tells."""

    log: Path
    error: RankError | None
    """The failing rank's own exception, when its traceback or report was found."""
    tail: tuple[str, ...] | None = None
    """Otherwise the lines of the log that say most (the ranks' reports, a traceback, the end);
    None when the log could not be read."""


@dataclass(frozen=True, kw_only=True, slots=True)
class AttemptEnded:
    """How an attempt ended, as the supervisor classified it (:mod:`.policy`)."""

    command: str
    root: Path
    attempt: int
    status: str
    """completed, failed, stopped, deadline, jit or hung."""
    exit_code: int
    last_step: int | None
    """The last step every rank of the attempt logged."""
    fired: FiredFailure | None
    ending: Ending | None
    fatal: str | None
    latest_step: int | None
    """The newest committed checkpoint's step after the attempt (None: none yet)."""
    crash: CrashReport | None = None
    latest_by: str | None = None
    """When ``latest_step`` is a checkpoint the script's framework wrote itself: which."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RunCompleted:
    command: str
    root: Path
    summary: RunSummary | None
    """The run's account (None on a node other than 0, whose summary is node 0's)."""
    node_rank: int = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class RunFailed:
    """The run stops on an error no relaunch can fix (a rank's fatal report, no usable
    checkpoint, a full disk)."""

    message: str
    command: str = "run"
    """``run`` or ``launch``: the command the user continues the run with."""


@dataclass(frozen=True, kw_only=True, slots=True)
class RepeatedCrash:
    """The same exception ended two attempts in a row at the same step: the run stops."""

    root: Path
    attempt: int
    last_step: int | None
    command: str = "run"


@dataclass(frozen=True, kw_only=True, slots=True)
class RestartLimitReached:
    limit: int
    last_step: int | None


@dataclass(frozen=True, kw_only=True, slots=True)
class DeadlinePassed:
    """The deadline passed before the next attempt could start."""

    command: str
    root: Path


@dataclass(frozen=True, kw_only=True, slots=True)
class ScriptEndedShort:
    """``ecrl launch``: the script exited 0 before its target step."""

    wrote_log: bool
    last_step: int | None
    target_steps: int


Event = (RunOpened | RunAlreadyComplete | RunResumed | PointerRepaired | StrayLogsSetAside
         | StopRequested
         | AttemptStarted | StepProgress | AttemptEnded | RunCompleted | RunFailed | RepeatedCrash
         | RestartLimitReached | DeadlinePassed | ScriptEndedShort)


class Reporter(Protocol):
    """Receives the supervisor's events, in order, from the supervisor's thread."""

    def report(self, event: Event) -> None: ...


class Silent:
    """A reporter that drops every event (a library user's default)."""

    def report(self, event: Event) -> None:
        pass
