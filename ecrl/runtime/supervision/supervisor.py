"""The supervisor behind ``ecrl run``: launch torchrun, classify each exit, resume, record.

One run directory, many attempts. For each attempt the supervisor reads ``latest.json`` (and
verifies the checkpoint it names, so a corrupt one is reported instead of loaded), picks the
attempt's world size from ``--world-sizes``, passes the failures that have not fired yet, and
launches torchrun (:mod:`.command`) on ``-m ecrl.runtime.trainer`` (``ecrl launch``: the
user's script, :mod:`.launcher`). While torchrun runs it follows rank 0's step log
(:mod:`.progress`); when torchrun exits, :mod:`.policy` classifies the exit and says whether the
run relaunches or ends. Ctrl-C, SIGTERM or SIGHUP (:mod:`.signals`) stop torchrun (it stops the
ranks) and record the attempt and the run as ``stopped``; ``ecrl run`` again with the same
``--out`` continues.

The supervisor prints nothing: it reports :mod:`.events` to its :class:`.events.Reporter`
(``ecrl run`` passes the console of :mod:`ecrl.apps.console`).

``supervisor.json`` is rewritten atomically after every change (:mod:`.rundir`). The supervisor
never edits a checkpoint. Until its first attempt it does not import torch (unless the data set
must be read to learn its size); then it imports torchrun (``ecrl run``: and the trainer) once and
forks every attempt's agent from itself (:func:`.command.start_torchrun`).
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from ecrl.contract import semantics
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import (
    LatestPointer,
    RunManifest,
    RunPaths,
    SupervisorAttempt,
    SupervisorState,
    read_json_record,
)
from ecrl.runtime._attempt import set_aside, set_aside_strays
from ecrl.runtime._proc import ChildProcess, kill_process_group
from ecrl.runtime.checkpoint.deadline import DEADLINE_EXIT_CODE, resolve_deadline
from ecrl.runtime.checkpoint.persist import CrashHook, ResumeChoice, choose_resume, read_latest
from ecrl.runtime.endings import read_ending
from ecrl.runtime.failure import FiredFailure, read_fatal, read_fired, remaining
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.manifest import RUN_FIELDS, check_same_run
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.runlock import LOCK_FILE, held_elsewhere, in_use, take_lock
from ecrl.runtime.supervision import command, policy
from ecrl.runtime.supervision.command import TORCHRUN_LOG, TRAINER
from ecrl.runtime.supervision.events import (
    AttemptEnded,
    AttemptStarted,
    CrashReport,
    DeadlinePassed,
    Event,
    PointerRepaired,
    RepeatedCrash,
    Reporter,
    RestartLimitReached,
    RunAlreadyComplete,
    RunCompleted,
    RunFailed,
    RunOpened,
    RunResumed,
    Silent,
    StopRequested,
    StrayLogsSetAside,
)
from ecrl.runtime.supervision.follower import Follower
from ecrl.runtime.supervision.hung import kill_remaining_workers, survivors_done
from ecrl.runtime.supervision.policy import EXIT_FAILED, EXIT_OK, EXIT_STOPPED, Outcome
from ecrl.runtime.supervision.progress import ProgressMeter, StepTail, attempt_steps
from ecrl.runtime.supervision.rundir import (
    DiskFull,
    check_logs,
    check_out,
    fired_in_stale,
    plan_manifest,
    stale_attempt,
    with_strays,
    write_record,
)
from ecrl.runtime.supervision.signals import stop_signals
from ecrl.runtime.supervision.standby import Standby

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_STOPPED", "Supervisor", "plan_manifest",
           "attempt_steps", "TORCHRUN_LOG", "LOCK_FILE", "DiskFull"]


@dataclass(slots=True)
class Supervisor:
    """Runs one ``ecrl run``; :meth:`run` returns the exit code."""

    config: RunConfig
    reporter: Reporter = field(default_factory=Silent)
    """Where the supervisor's :mod:`.events` go (:class:`ecrl.apps.console.Console` prints them)."""
    poll_s: float = 0.25
    name: str = "run"
    """The command, in messages (``ecrl run``, ``ecrl launch``)."""
    program: tuple[str, ...] = TRAINER
    """What torchrun runs on every rank (``ecrl launch``: the user's script and its arguments)."""
    marker: dict[str, Any] = field(default_factory=dict)
    """Extra keys for a new run's ``run.json`` (``ecrl demo`` marks the directories it owns)."""
    paths: RunPaths = field(init=False)
    manifest: RunManifest = field(init=False)
    state: SupervisorState = field(init=False)
    _stop: int | None = field(default=None, init=False)
    _lock: IO[bytes] | None = field(default=None, init=False)
    _choice: ResumeChoice | None = field(default=None, init=False)
    _crash: CrashHook = field(default_factory=lambda: CrashHook.from_env(attempt=None),
                              init=False)
    _deadline: float | None = field(default=None, init=False)
    _standby: Standby | None = field(default=None, init=False)
    _hung_killed: list[int] | None = field(default=None, init=False)
    """The current attempt's hung ranks this supervisor killed (:mod:`.hung`); None: none yet."""
    _follower: Follower | None = field(default=None, init=False)
    """``--verify-follow``: the verifier following the run."""

    def _report(self, event: Event) -> None:
        self.reporter.report(event)

    # --- setup ---------------------------------------------------------------------------------

    def _open_run(self) -> bool:
        """Create or reopen the run directory; False when the run is already complete."""
        root = Path(self.config.out).resolve()
        check_out(self.config.out, root)
        self.paths = RunPaths.of(root)
        if self.paths.manifest.exists():
            existing = read_json_record(self.paths.manifest, RunManifest, root=root)
            # Settings not given now are the run's own: `ecrl run --out DIR` alone continues it.
            # The deadline belongs to one invocation (a job's time limit), never to the run.
            stored = {k: v for k, v in existing.extra.get("config", {}).items()
                      if k not in ("out", "deadline")}
            given = {k: v for k, v in self.config.to_dict().items() if k in self.config.explicit}
            self.config = RunConfig.from_dict({**stored, **given, "out": str(root)},
                                              explicit=self.config.explicit)
            check_same_run(existing, plan_manifest(self.config), where=self.paths.manifest,
                           fields=RUN_FIELDS, planned_by="the settings given have",
                           fresh="a new --out")
            self._take_lock()
            state = (read_json_record(self.paths.supervisor, SupervisorState, root=root)
                     if self.paths.supervisor.exists()
                     else SupervisorState(attempts=[], restarts=0, status="running"))
            if state.status == "completed":
                # Before any checkpoint is looked at: a finished run needs none of them.
                self._report(RunAlreadyComplete(command=self.name, root=root,
                                                target_steps=existing.target_steps))
                return False
            self.manifest, self.state = existing, state
            # Nothing under logs/ is read before it is known to hold no link or special file.
            strays = self._check_logs(state)
            # No valid checkpoint left for a run that committed some: stop before any write.
            self._choice = self._resume_point()
            attempts = [self._stale(a) if a.status == "running" else a for a in state.attempts]
            config = self.config.to_dict()
            self.manifest = replace(existing, extra={**existing.extra, "config": config})
            self._write(self.paths.manifest, self.manifest)
            self.state = replace(state, attempts=attempts, status="running",
                                 extra=with_strays(fired_in_stale(self.paths, state), strays))
            self._report(RunResumed(command=self.name, root=root,
                                    earlier_attempts=len(attempts)))
            self._report_strays(strays)
        else:
            planned = plan_manifest(self.config)
            self._refuse_foreign(root)
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--out {self.config.out}: cannot create the directory "
                                  f"({exc.strerror}): choose a writable place") from None
            self._take_lock()
            # Two fresh starts into one --out: the one that took the lock second stopped above;
            # one that got it only after the other's whole run ended finds that run here.
            self._refuse_foreign(root)
            planned = replace(planned, extra={**planned.extra, **self.marker})
            self.manifest = planned
            self._write(self.paths.manifest, planned)
            self.state = SupervisorState(attempts=[], restarts=0, status="running",
                                         extra={"injected_failures": []})
        self._save()
        return True

    def _check_logs(self, state: SupervisorState) -> list[dict[str, str]]:
        """Refuse a continuation whose logs hold a link or special file (:func:`check_logs`), and
        set aside the attempt folders ``supervisor.json`` does not record, so that the next
        attempt is numbered after the recorded ones and never shares a folder with a stray."""
        recorded = [a.attempt for a in state.attempts]
        check_logs(self.paths, recorded)
        return set_aside_strays(self.paths, recorded) if self._owns_logs() else []

    def _report_strays(self, moved: list[dict[str, str]]) -> None:
        """One line for the folders set aside (``supervisor.json`` alone would hide them)."""
        if moved:
            self._report(StrayLogsSetAside(command=self.name, moved=tuple(
                (m["folder"], m["moved_to"]) for m in moved)))

    def _owns_logs(self) -> bool:
        """Whether every attempt folder under logs/ is this supervisor's (not with several
        nodes: the others create theirs in the shared directory)."""
        return True

    def _refuse_foreign(self, root: Path) -> None:
        """A fresh start needs ``root`` absent or empty (but for the lock file); another ECRL
        process starting or running a run there is told apart from someone else's files."""
        entries = sorted(e.name for e in root.iterdir()) if root.exists() else []
        if not [e for e in entries if e != LOCK_FILE]:
            return
        if LOCK_FILE in entries and (self._lock is None and held_elsewhere(root)):
            raise in_use(root)
        if self.paths.manifest.exists():
            raise ConfigError(f"another ECRL process started a run in {root} while this one was "
                              f"starting: run `ecrl {self.name} --out {root}` again to continue "
                              "it, or choose a new --out")
        raise ConfigError(f"--out {root} exists and is not an ECRL run directory: choose "
                          "a new or empty directory")

    def _stale(self, a: SupervisorAttempt) -> SupervisorAttempt:
        return stale_attempt(self.paths, a)

    def _take_lock(self, name: str = LOCK_FILE, holder: str = "another ECRL process") -> None:
        self._lock = take_lock(self.paths.root, name, holder)

    def _save(self) -> None:
        self._write(self.paths.supervisor, self.state)

    def _write(self, path: Path, record: Any) -> None:
        """Atomically replace one of the run's JSON files; a full disk leaves the previous
        version whole and ends the run (:meth:`run`)."""
        write_record(path, record, self._crash)

    def _fired(self) -> list[FiredFailure]:
        return [FiredFailure(**f) for f in self.state.extra.get("injected_failures", [])]

    # --- one attempt ---------------------------------------------------------------------------

    def _resume_point(self) -> ResumeChoice:
        """Where the next attempt resumes: persist.choose_resume (raises CheckpointError when
        committed progress has no valid checkpoint left; never loads anything)."""
        # A framework's own resume (ecrl launch of a Lightning or Accelerate script) attests no
        # checkpoint of ECRL's.
        attested = [int(p["global_step"]) for p in
                    self.state.extra.get("resume_points", {}).values()
                    if isinstance(p, dict) and isinstance(p.get("global_step"), int)
                    and p.get("reason") != "framework"]
        geometry = semantics.Geometry(dataset_size=self.manifest.dataset_size,
                                      global_batch=self.manifest.global_batch)
        return choose_resume(
            self.paths, locate=geometry.locate, attested=attested,
            attempts=[a.attempt for a in self.state.attempts],
            restart_hint=f"start the run over in a new directory: `{self.config.command_line()}`")

    def _framework_checkpoints(self) -> tuple[int, str] | None:
        """The newest checkpoint a framework wrote itself, ``(step, framework)``, when the
        script resumes from its framework's own checkpoints (``ecrl launch``)."""
        return None

    def _framework_resumed(self, pointer: Any) -> str | None:
        """The framework whose own checkpoint an attempt started without ECRL's resumes from."""
        newest = None if pointer is not None else self._framework_checkpoints()
        return None if newest is None else newest[1]

    def _command(self, attempt: int, world: int) -> list[str]:
        return command.torchrun_command(self.config.supervisor, self.paths, attempt, world,
                                        self.program)

    def _attempt_env(self, attempt: int, pointer: LatestPointer | None,
                     fail_at: list[int]) -> AttemptEnv:
        return command.attempt_env(self.config, self.paths, attempt, pointer, fail_at,
                                   self.manifest.world_sizes, self._deadline)

    def _torchrun_log(self, attempt: int) -> Path:
        return self.paths.attempt_dir(attempt) / TORCHRUN_LOG

    def _start_torchrun(self, attempt: int, world: int, variables: Mapping[str, str],
                        log_path: Path) -> ChildProcess:
        env = command.environment(self.config.trainer, world // self.config.nnodes, variables)
        return command.start_torchrun(self._command(attempt, world), env, log_path)

    def _standby_enabled(self) -> bool:
        return self.config.warm_standby and self.config.nnodes == 1

    def _launch(self, attempt: int, world: int, pointer: LatestPointer | None,
                fail_at: list[int]) -> int:
        paths = self.paths
        paths.attempt_dir(attempt).mkdir(parents=True, exist_ok=True)
        meter = ProgressMeter(target=self.manifest.target_steps)
        tail = StepTail(paths.rank_log(attempt, 0), root=paths.root)
        variables = self._attempt_env(attempt, pointer, fail_at).to_environ()
        proc = None
        if self._standby is not None:
            proc = self._standby.take(attempt, world, variables, self._torchrun_log(attempt))
            # supervisor.json says which attempts started from a standby.
            used = {**self.state.extra.get("warm_standby", {}), str(attempt): proc is not None}
            self.state = replace(self.state, extra={**self.state.extra, "warm_standby": used})
            self._save()
        if proc is None:
            proc = self._start_torchrun(attempt, world, variables, self._torchrun_log(attempt))
        # The next attempt's torchrun starts once this one trains (not while its ranks start up:
        # both would compete for the same cores).
        standby_due = self._standby_enabled()
        stopping_since: float | None = None
        self._hung_killed = None
        while True:
            try:
                code: int | None = proc.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                code = None
            records = tail.read()
            progress = meter.update(records, attempt=attempt, world=world,
                                    restarts=self.state.restarts, force=code is not None)
            if progress is not None:
                self._report(progress)
            if code is not None:
                # What outlived the attempt's torchrun in its session (a killed rank's data
                # loader workers wait up to 5 s to notice) ends with it, not beside the next.
                kill_process_group(proc.pid)
                return code
            if self._hung_killed is None and survivors_done(paths, attempt):
                self._hung_killed = kill_remaining_workers(proc.pid)
            if standby_due and records and self._stop is None:
                standby_due = False
                self._prepare_standby(attempt + 1)
            if self._stop is not None and stopping_since is None:
                proc.send_signal(signal.SIGTERM)  # torchrun stops its ranks
                stopping_since = time.monotonic()
            elif stopping_since is not None and time.monotonic() - stopping_since > 60:
                proc.kill()

    def _prepare_standby(self, attempt: int) -> None:
        if self._standby is None:
            self._standby = Standby(self.paths.root, self._start_torchrun)
        self._standby.prepare(attempt, self.manifest.world_size_of(attempt))

    # --- the run -------------------------------------------------------------------------------

    def _on_signal(self, signum: int) -> None:
        if self._stop is None:
            self._report(StopRequested(signal_name=signal.Signals(signum).name))
        self._stop = signum

    def _next_attempt(self) -> int:
        # After the recorded attempts only: a folder planted under logs/ must neither leave a gap
        # in supervisor.json's numbering nor receive the new attempt's records.
        numbers = [a.attempt for a in self.state.attempts]
        attempt = max(numbers) + 1 if numbers else 0
        if self._owns_logs():
            moved = set_aside(self.paths, attempt)
            if moved is not None:
                stray = [{"folder": f"logs/{self.paths.attempt_dir(attempt).name}",
                          "moved_to": f"logs/{moved}"}]
                self.state = replace(self.state, extra=with_strays(self.state.extra, stray))
                self._report_strays(stray)
        return attempt

    def _finish(self, status: str) -> None:
        self.state = replace(self.state, status=status)
        self._save()
        if self._lock is not None:
            self._lock.close()

    def _opened(self) -> RunOpened:
        return RunOpened(command=self.name, root=self.paths.root, manifest=self.manifest,
                         config=self.config, program=tuple(self.program))

    def run(self) -> int:
        try:
            return self._run()
        except DiskFull as exc:
            # No relaunch: the next attempt would hit the same wall. Nothing half-written is
            # left: every file the supervisor writes is replaced atomically or not at all.
            self._report(RunFailed(message=exc.explain(self.name, self.paths.root),
                                  command=self.name))
            if self._lock is not None:
                self._lock.close()
            return EXIT_FAILED
        finally:
            if self._standby is not None:  # an attempt that will not run
                self._standby.stop()
            if self._follower is not None:  # it ends by itself once the run's status is final
                self._follower.verdict()

    def _run(self) -> int:
        # A duration counts from this command's start, not from each attempt's.
        self._deadline = resolve_deadline(self.config.deadline)
        if not self._open_run():
            return EXIT_OK
        self._report(self._opened())
        if self.config.verify_follow:
            self._follower = Follower(self.paths.root)
            self._follower.start()
        relaunches = 0
        with stop_signals(self._on_signal):
            while True:
                if self._stop is not None:
                    self._finish("stopped")
                    return EXIT_STOPPED
                try:
                    choice = self._choice or self._resume_point()
                except (CheckpointError, RunFormatError) as exc:
                    self._report(RunFailed(message=str(exc), command=self.name))
                    self._finish("failed")
                    return EXIT_FAILED
                self._choice = None
                if self._deadline is not None and time.time() >= self._deadline:
                    self._report(DeadlinePassed(command=self.name, root=self.paths.root))
                    self._finish("deadline")
                    return DEADLINE_EXIT_CODE
                outcome = self._attempt(choice)
                code = self._conclude(outcome, relaunches)
                if code is not None:
                    return code
                relaunches += 1

    def _attempt(self, choice: ResumeChoice) -> Outcome:
        """Launch one attempt from ``choice``, wait for it, record and classify its end."""
        pointer = choice.pointer
        if choice.repaired and pointer is not None:
            # The supervisor holds the run's lock and no rank runs: repairing the pointer keeps
            # latest.json naming the checkpoint the run really continues from.
            self._report(PointerRepaired(description=choice.describe(self.paths)))
            self._write(self.paths.latest, pointer)
        attempt = self._next_attempt()
        world = self.manifest.world_size_of(attempt)
        fail_at = remaining(self.manifest.fail_at, self._fired())
        record = SupervisorAttempt(
            attempt=attempt, world_size=world,
            resumed_from_step=None if pointer is None else pointer.global_step,
            first_step=None, last_step=None, exit_code=None, status="running",
            start_time=time.time(), end_time=None)
        extra = dict(self.state.extra)
        if pointer is not None:
            # The supervisor's own testimony (it verified the checksum just before): evidence
            # of the resume point for ecrl-verify should the writer have died after publishing
            # latest.json but before logging the checkpoint event.
            point: dict[str, Any] = {"global_step": pointer.global_step, "path": pointer.path,
                                     "checksum": pointer.checksum, "reason": choice.reason}
            if choice.problem is not None:
                point["problem"] = choice.problem
            if choice.rejected:
                point["rejected"] = list(choice.rejected)
            extra["resume_points"] = {**extra.get("resume_points", {}), str(attempt): point}
        self.state = replace(self.state, attempts=[*self.state.attempts, record],
                             restarts=len(self.state.attempts), extra=extra)
        self._save()
        self._report(AttemptStarted(attempt=attempt, world_size=world,
                                    resumed_from_step=record.resumed_from_step,
                                    target_steps=self.manifest.target_steps, fail_at=fail_at,
                                    framework=self._framework_resumed(pointer)))
        code = self._launch(attempt, world, pointer, fail_at)
        first, last = attempt_steps(self.paths, attempt, world)
        # The target after the launch: `ecrl launch` learns it once the script wrote run.json.
        outcome = policy.classify(
            attempt=attempt, exit_code=code, last_step=last,
            target_steps=self.manifest.target_steps, stopping=self._stop is not None,
            fired=read_fired(self.paths, attempt), fatal=read_fatal(self.paths, attempt),
            ending=read_ending(self.paths, attempt, world))
        extra = dict(self.state.extra)
        if outcome.ending is not None:
            ending = outcome.ending.to_dict()
            if self._hung_killed:
                ending["hung_ranks_killed"] = len(self._hung_killed)
            extra["endings"] = {**extra.get("endings", {}), str(attempt): ending}
        if outcome.crashed:
            log = self.paths.attempt_dir(attempt) / TORCHRUN_LOG
            outcome = replace(outcome, error=policy.rank_error(log))
            if outcome.error is not None:
                extra["crashes"] = {**extra.get("crashes", {}), str(attempt): {
                    "rank": outcome.error.rank, "exception": outcome.error.exception,
                    "last_step": last, "resumed_from_step": record.resumed_from_step}}
        if outcome.fired is not None and outcome.status in ("failed", "jit", "hung"):
            fired = {"attempt": attempt, "global_step": outcome.fired.global_step,
                     "rank": outcome.fired.rank}
            extra["injected_failures"] = [*extra.get("injected_failures", []), fired]
        record = replace(record, first_step=first, last_step=last, exit_code=code,
                         status=outcome.status, end_time=time.time())
        self.state = replace(self.state, attempts=[*self.state.attempts[:-1], record],
                             extra=extra)
        self._save()
        return outcome

    def _conclude(self, outcome: Outcome, relaunches: int) -> int | None:
        """Report how an attempt ended; the exit code when the run ends, None to relaunch."""
        attempt, last = outcome.attempt, outcome.last_step
        settled = outcome.status in ("completed", "stopped", "deadline") or (
            outcome.fatal is not None)
        latest = None if settled else read_latest(self.paths)
        own = None if settled or latest is not None else self._framework_checkpoints()
        crash = None
        if not settled and outcome.ending is None and outcome.fired is None:
            if outcome.error is not None:
                crash = CrashReport(log=self.paths.attempt_dir(attempt) / TORCHRUN_LOG,
                                    error=outcome.error)
            else:
                log = self._torchrun_log(attempt)
                crash = CrashReport(log=log, error=None, tail=policy.log_tail(log))
        self._report(AttemptEnded(
            command=self.name, root=self.paths.root, attempt=attempt, status=outcome.status,
            exit_code=outcome.exit_code, last_step=last, fired=outcome.fired,
            ending=outcome.ending, fatal=outcome.fatal,
            latest_step=latest.global_step if latest is not None else own[0] if own else None,
            latest_by=own[1] if own else None, crash=crash))
        limit = self.config.effective_max_restarts
        end = policy.after_attempt(
            outcome, relaunches=relaunches, max_restarts=limit,
            repeated_crash=policy.repeated(outcome, self.state.extra.get("crashes", {})))
        if end is None:
            return None
        if end.why == "fatal":
            self._report(RunFailed(message=str(outcome.fatal), command=self.name))
        elif end.why == "repeated":
            self._report(RepeatedCrash(root=self.paths.root, attempt=attempt, last_step=last,
                                       command=self.name))
        elif end.why == "restart_limit":
            self._report(RestartLimitReached(limit=limit, last_step=last))
        self._finish(end.status)
        if end.why == "completed":
            self._report_completed()
            unfired = self._unfired_failures()
            if unfired:
                # The run is complete, but the recoveries asked of it never happened: a run that
                # was to prove them must not end 0 (a script with no ecrl.Checkpointer and no
                # framework integration injects nothing).
                self._report(RunFailed(command=self.name, message=(
                    f"the run completed, but --fail-at {', '.join(map(str, unfired))} never "
                    "fired: the script injects no failures (ecrl.Checkpointer and the framework "
                    "integrations do: docs/library.md), so no recovery was exercised")))
                return EXIT_FAILED
        return end.exit_code

    def _unfired_failures(self) -> list[int]:
        """Planned failures the run passed without firing. One after the last step is not among
        them: a framework's loop has no next step to fire it in."""
        last = self.manifest.target_steps - 1
        return [s for s in remaining(self.manifest.fail_at, self._fired()) if s < last]

    def _report_completed(self) -> None:
        from ecrl.runtime.supervision.summary import summarize

        summary = summarize(str(self.paths.root))
        if self._follower is not None:
            summary = replace(summary, verify=self._follower.verdict())
        self._report(RunCompleted(command=self.name, root=self.paths.root, summary=summary))

