"""The supervisor behind ``ecrl run``: launch torchrun, classify each exit, resume, record.

One run directory, many attempts. For each attempt the supervisor reads ``latest.json`` (and
verifies the checkpoint it names, so a corrupt one is reported instead of loaded), picks the
attempt's world size from ``--world-sizes``, passes the failures that have not fired yet, and
launches ``python -m torch.distributed.run … -m ecrl.runtime.trainer.trainer``. While torchrun runs
it tails rank 0's step log for progress; when torchrun exits it classifies the exit:

- ``completed``: exit 0 and the final step logged by every rank → the run is done;
- injected failure (the failing rank left ``failure.json``) → relaunch;
- ``fatal.json`` (a problem no restart can fix, e.g. a corrupt checkpoint) → stop, report it;
- any other exit (a crash) → relaunch, with the tail of ``torchrun.log`` shown;
- Ctrl-C, SIGTERM or SIGHUP (a closed terminal) → torchrun is stopped (it stops the ranks), the
  attempt and the run are recorded as ``stopped``; ``ecrl run`` again with the same ``--out``
  continues.

Printing is never a reason to stop: once stdout or stderr is gone (``ecrl run … | head``, a
closed terminal) the supervisor stops printing to it and goes on supervising.

``supervisor.json`` is rewritten atomically after every change. The supervisor never edits a
checkpoint. It does not import torch unless the data set must be read to learn its size.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any

from ecrl.contract import semantics
from ecrl.contract.ckptfile import CheckpointError
from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import (
    JsonlReader,
    LatestPointer,
    RunManifest,
    RunPaths,
    StepRecord,
    SupervisorAttempt,
    SupervisorState,
    loads,
    read_json_record,
    write_json_record,
)
from ecrl.runtime._proc import signal_on_parent_death
from ecrl.runtime.checkpoint.deadline import DEADLINE_EXIT_CODE, resolve_deadline
from ecrl.runtime.checkpoint.persist import CrashHook, ResumeChoice, choose_resume, read_latest
from ecrl.runtime.endings import Ending, read_ending
from ecrl.runtime.failure import (
    FiredFailure,
    RankError,
    disk_error,
    rank_errors,
    read_fatal,
    read_fired,
    remaining,
)
from ecrl.runtime.launchenv import AttemptEnv
from ecrl.runtime.manifest import RUN_FIELDS, build_manifest, check_same_run
from ecrl.runtime.runconfig import RunConfig
from ecrl.runtime.supervision.standby import Standby

__all__ = ["EXIT_OK", "EXIT_FAILED", "EXIT_STOPPED", "Supervisor", "plan_manifest",
           "attempt_steps", "TORCHRUN_LOG"]

EXIT_OK, EXIT_FAILED, EXIT_STOPPED = 0, 1, 130
TORCHRUN_LOG = "torchrun.log"
LOCK_FILE = ".supervisor.lock"


def _check_out(given: str, root: Path) -> None:
    """--out must be a directory, or creatable: checked before anything is written."""
    if root.exists() and not root.is_dir():
        raise ConfigError(f"--out {given} is a file, not a directory: choose a new or empty "
                          "directory")
    parent = root
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK) or _is_pseudo(parent):
        raise ConfigError(f"--out {given}: {parent} is not a directory ECRL can create files "
                          "in: choose a writable place")


def _is_pseudo(path: Path) -> bool:
    """A kernel file system (/proc, /sys) where no run directory can be created."""
    with contextlib.suppress(OSError):
        return os.statvfs(path).f_blocks == 0
    return False


def _after_step(step: int | None) -> str:
    return "before completing a step" if step is None else f"after step {step}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _torchrun_preexec() -> None:
    signal_on_parent_death(signal.SIGTERM)


def _describe_ending(ending: Ending) -> str:
    """One line: who hung or died, and what the just-in-time rescue saved."""
    parts = []
    if ending.status == "hung":
        who = ", ".join(map(str, ending.stopped_ranks)) or "unknown"
        bound = max((float(v.get("bound_s", 0)) for v in ending.hung.values()), default=0.0)
        parts.append(f"hung: rank {who} stopped stepping (detected within the {bound:.1f} s "
                     "bound)")
    jit = ending.jit
    if jit is not None:
        if jit.get("saved"):
            parts.append(f"jit: rank {jit.get('rank')} saved step {jit.get('global_step')} "
                         f"({jit.get('source')} state) after {jit.get('reason')}")
        else:
            parts.append(f"jit: nothing saved ({jit.get('why_not')}) after {jit.get('reason')}")
    elif ending.status == "jit":
        parts.append("jit")
    return "; ".join(parts)


def _dataset_size(config: RunConfig) -> int:
    if config.dataset == "fake":
        return config.fake_size()
    from ecrl.runtime.trainer.datasets import build_dataset, check_data_dir

    data_dir = Path(config.data_dir) if config.data_dir else None
    check_data_dir(config.dataset, data_dir)  # before anything slow, with the clear message
    return len(build_dataset(config.dataset, data_dir=data_dir, size=None,
                             image_size=config.image_size))


def plan_manifest(config: RunConfig) -> RunManifest:
    """The ``run.json`` this configuration describes (reads the data set to learn D)."""
    size = _dataset_size(config)
    return build_manifest(
        seed=config.seed, dataset=config.dataset, dataset_size=size,
        global_batch=config.global_batch,
        steps_per_epoch=config.geometry(size).steps_per_epoch,
        target_steps=config.target_steps(size), log_ids=config.log_ids, model=config.model,
        strategy=config.strategy, ckpt_every=config.effective_ckpt_every,
        fail_at=config.fail_at, world_sizes=config.world_sizes,
        extra={"config": config.to_dict()})


@dataclass(slots=True)
class _Tail:
    """New complete lines of a growing JSON-lines file."""

    path: Path
    offset: int = 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                out.append(loads(line))
        return out


def attempt_steps(paths: RunPaths, attempt: int, world_size: int) -> tuple[int | None, int | None]:
    """(first step any rank ran, last step every rank of the attempt logged), from the logs."""
    per_rank: list[set[int]] = []
    first: int | None = None
    for rank in range(world_size):
        path = paths.rank_log(attempt, rank)
        steps: set[int] = set()
        if path.exists():
            reader = JsonlReader(path, StepRecord, torn_tail_ok=True)
            with contextlib.suppress(RunFormatError):
                for _, data in reader.raw():
                    steps.add(int(data["global_step"]))
        per_rank.append(steps)
        if steps:
            first = min(steps) if first is None else min(first, min(steps))
    common = set.intersection(*per_rank) if per_rank else set()
    return first, (max(common) if common else None)


@dataclass(slots=True)
class _Progress:
    """Prints ``step, loss, steps/s, restarts`` at most once per ``interval`` seconds."""

    emit: Callable[[str], None]
    target: int
    interval: float = 1.0
    last_print: float = 0.0
    last_step: int | None = None
    last_loss: float | None = None
    printed_step: int | None = None
    window: list[tuple[float, int]] = field(default_factory=list)

    def update(self, records: list[dict[str, Any]], *, attempt: int, world: int,
               restarts: int, force: bool = False) -> None:
        for r in records:
            self.last_step = int(r["global_step"])
            self.last_loss = r.get("loss")
            self.window.append((float(r["time"]), self.last_step))
        now = time.monotonic()
        if self.last_step is None or self.last_step == self.printed_step or not (
                force or now - self.last_print >= self.interval):
            return
        self.printed_step = self.last_step
        self.window = self.window[-200:]
        rate = ""
        if len(self.window) >= 2 and self.window[-1][0] > self.window[0][0]:
            steps = self.window[-1][1] - self.window[0][1]
            rate = f" · {steps / (self.window[-1][0] - self.window[0][0]):.1f} steps/s"
        loss = f"{self.last_loss:.4f}" if isinstance(self.last_loss, float) else "n/a"
        of = f"/{self.target}" if self.target else ""  # ecrl launch: unknown until run.json
        self.emit(f"  step {self.last_step + 1}{of} · loss {loss}{rate} · restarts "
                  f"{restarts} [attempt {attempt}, W={world}]")
        self.last_print = now
        self.window = self.window[-1:]


@dataclass(frozen=True, kw_only=True, slots=True)
class _Outcome:
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


@dataclass(slots=True)
class _Emitter:
    """Prints lines to stdout or stderr until the stream breaks, then silently drops them."""

    stream: str
    broken: bool = False

    def __call__(self, line: str) -> None:
        if self.broken:
            return
        handle = sys.stdout if self.stream == "stdout" else sys.stderr
        try:
            print(line, file=handle, flush=True)
        except (OSError, ValueError):  # EPIPE, EIO from a hung-up terminal, a closed file
            self.broken = True
            # The interpreter flushes the stream again at exit: let that land in /dev/null
            # instead of printing "Exception ignored … BrokenPipeError" and exiting 120.
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, handle.fileno())
                os.close(devnull)


class _DiskFull(Exception):
    """The supervisor could not write one of its files: no space, quota, read-only."""


@dataclass(slots=True)
class Supervisor:
    """Runs one ``ecrl run``; :meth:`run` returns the exit code."""

    config: RunConfig
    out: Callable[[str], None] = field(default_factory=lambda: _Emitter("stdout"))
    err: Callable[[str], None] = field(default_factory=lambda: _Emitter("stderr"))
    poll_s: float = 0.25
    name: str = "run"
    """The command, in messages (``ecrl run``, ``ecrl launch``)."""
    program: tuple[str, ...] = ("-m", "ecrl.runtime.trainer.trainer")
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

    # --- setup ---------------------------------------------------------------------------------

    def _open_run(self) -> bool:
        """Create or reopen the run directory; False when the run is already complete."""
        root = Path(self.config.out).resolve()
        _check_out(self.config.out, root)
        self.paths = RunPaths.of(root)
        if self.paths.manifest.exists():
            existing = read_json_record(self.paths.manifest, RunManifest)
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
            state = (read_json_record(self.paths.supervisor, SupervisorState)
                     if self.paths.supervisor.exists()
                     else SupervisorState(attempts=[], restarts=0, status="running"))
            if state.status == "completed":
                # Before any checkpoint is looked at: a finished run needs none of them.
                self.out(f"ecrl run: {root} is already complete ({existing.target_steps} steps); "
                         "nothing to do")
                return False
            self.manifest, self.state = existing, state
            # No valid checkpoint left for a run that committed some: stop before any write.
            self._choice = self._resume_point()
            attempts = [self._stale(a) if a.status == "running" else a for a in state.attempts]
            config = self.config.to_dict()
            self.manifest = replace(existing, extra={**existing.extra, "config": config})
            self._write(self.paths.manifest, self.manifest)
            self.state = replace(state, attempts=attempts, status="running",
                                 extra=self._fired_in_stale(state))
            self.out(f"ecrl run: resuming {root} ({_count(len(attempts), 'earlier attempt')})")
        else:
            planned = plan_manifest(self.config)
            if root.exists() and any(root.iterdir()):
                raise ConfigError(f"--out {root} exists and is not an ECRL run directory: choose "
                                  "a new or empty directory")
            try:
                root.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(f"--out {self.config.out}: cannot create the directory "
                                  f"({exc.strerror}): choose a writable place") from None
            self._take_lock()
            planned = replace(planned, extra={**planned.extra, **self.marker})
            self.manifest = planned
            self._write(self.paths.manifest, planned)
            self.state = SupervisorState(attempts=[], restarts=0, status="running",
                                         extra={"injected_failures": []})
        self._save()
        return True

    def _stale(self, a: SupervisorAttempt) -> SupervisorAttempt:
        """An attempt left 'running' by a supervisor that was killed outright: its torchrun died
        with it (parent-death signal), so it failed; the logs say how far it got."""
        first, last = attempt_steps(self.paths, a.attempt, a.world_size)
        logs = self.paths.rank_logs(a.attempt).values()
        end = max((p.stat().st_mtime for p in logs), default=None)
        return replace(a, status="failed", first_step=first, last_step=last, end_time=end)

    def _fired_in_stale(self, state: SupervisorState) -> dict[str, Any]:
        """``extra`` with the injected failures that attempts left 'running' fired: a supervisor
        that died (or could not write supervisor.json) before recording them must not make the
        same failure fire twice."""
        fired = list(state.extra.get("injected_failures", []))
        for a in state.attempts:
            marker = read_fired(self.paths, a.attempt) if a.status == "running" else None
            if marker is not None and all(f.get("attempt") != a.attempt for f in fired):
                fired.append({"attempt": a.attempt, "global_step": marker.global_step,
                              "rank": marker.rank})
        return {**state.extra, "injected_failures": fired}

    def _take_lock(self, name: str = LOCK_FILE, holder: str = "another ecrl run") -> None:
        handle = open(self.paths.root / name, "ab")  # noqa: SIM115 - held for the run
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise ConfigError(f"{self.paths.root} is in use by {holder}; wait for it or "
                              "stop it first") from None
        self._lock = handle

    def _save(self) -> None:
        self._write(self.paths.supervisor, self.state)

    def _write(self, path: Path, record: Any) -> None:
        """Atomically replace one of the run's JSON files; a full disk leaves the previous
        version whole (atomicio) and ends the run (:meth:`run`)."""
        try:
            write_json_record(path, record, hook=self._crash.for_write("supervisor", path))
        except OSError as exc:
            message = disk_error(exc, path)
            if message is None:
                raise
            raise _DiskFull(message) from None

    def _fired(self) -> list[FiredFailure]:
        return [FiredFailure(**f) for f in self.state.extra.get("injected_failures", [])]

    # --- one attempt ---------------------------------------------------------------------------

    def _resume_point(self) -> ResumeChoice:
        """Where the next attempt resumes: persist.choose_resume (raises CheckpointError when
        committed progress has no valid checkpoint left; never loads anything)."""
        attested = [int(p["global_step"]) for p in
                    self.state.extra.get("resume_points", {}).values()
                    if isinstance(p, dict) and isinstance(p.get("global_step"), int)]
        geometry = semantics.Geometry(dataset_size=self.manifest.dataset_size,
                                      global_batch=self.manifest.global_batch)
        return choose_resume(
            self.paths, locate=geometry.locate, attested=attested,
            restart_hint=f"start the run over in a new directory: `{self.config.command_line()}`")

    def _command(self, attempt: int, world: int) -> list[str]:
        c = self.config
        if c.nnodes == 1 and not c.rdzv_endpoint:
            # --standalone: a private rendezvous on a free port, so parallel runs never collide.
            launch = ["--standalone", "--nnodes", "1"]
        else:
            launch = ["--nnodes", str(c.nnodes), "--rdzv-backend", c.rdzv_backend or "c10d",
                      "--rdzv-endpoint", str(c.rdzv_endpoint),
                      # One rendezvous per attempt: an agent of a dead attempt still up on
                      # another node can never join the next one.
                      "--rdzv-id", f"{c.rdzv_id or 'ecrl-' + self.paths.root.name}-{attempt}"]
            if c.rdzv_conf:
                launch += ["--rdzv-conf", c.rdzv_conf]
        # torchrun polls its ranks every monitor interval: a failed rank is noticed (and the
        # attempt ended) that much later, time every recovery loses; 0.1 s costs no measurable CPU.
        return [sys.executable, "-m", "torch.distributed.run", *launch,
                "--nproc-per-node", str(world // c.nnodes), "--max-restarts", "0",
                "--monitor-interval", "0.1", *self.program]

    def _attempt_env(self, attempt: int, pointer: LatestPointer | None,
                     fail_at: list[int]) -> AttemptEnv:
        c = self.config
        return AttemptEnv(
            run_dir=str(self.paths.root), attempt=attempt,
            resume_step=None if pointer is None else pointer.global_step,
            resume_path=None if pointer is None else pointer.path,
            resume_checksum=None if pointer is None else pointer.checksum,
            fail_at=tuple(fail_at), fail_rank=c.fail_rank,
            # Only the checkpoint settings the user gave: the script's own choices stand for the
            # others (ecrl.runtime.settings; the built-in trainer passes its configuration).
            checkpoint=c.checkpoint_given, world_sizes=tuple(self.manifest.world_sizes),
            deadline=self._deadline)

    def _environment(self, world: int, variables: Mapping[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS",
                       str(self.config.threads_per_rank(world // self.config.nnodes)))
        env.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS
        env["PYTHONUNBUFFERED"] = "1"
        env.update(variables)
        return env

    def _torchrun_log(self, attempt: int) -> Path:
        return self.paths.attempt_dir(attempt) / TORCHRUN_LOG

    def _start_torchrun(self, attempt: int, world: int, variables: Mapping[str, str],
                        log_path: Path) -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log:
            # A session of its own keeps the terminal's Ctrl-C away from torchrun (the supervisor
            # decides how to stop it); the parent-death signal stops it if we are killed outright.
            return subprocess.Popen(self._command(attempt, world),
                                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self._environment(world, variables),
                                    start_new_session=True, preexec_fn=_torchrun_preexec)

    def _standby_enabled(self) -> bool:
        return self.config.warm_standby and self.config.nnodes == 1

    def _launch(self, attempt: int, world: int, pointer: LatestPointer | None,
                fail_at: list[int]) -> int:
        paths = self.paths
        paths.attempt_dir(attempt).mkdir(parents=True, exist_ok=True)
        progress = _Progress(emit=self.out, target=self.manifest.target_steps)
        tail = _Tail(paths.rank_log(attempt, 0))
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
        while True:
            try:
                code: int | None = proc.wait(timeout=self.poll_s)
            except subprocess.TimeoutExpired:
                code = None
            records = tail.read()
            progress.update(records, attempt=attempt, world=world,
                            restarts=self.state.restarts, force=code is not None)
            if code is not None:
                return code
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

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stop is None:
            self.err(f"ecrl run: {signal.Signals(signum).name} received, stopping the job…")
        self._stop = signum

    @contextlib.contextmanager
    def _signals(self) -> Iterator[None]:
        # SIGHUP: the terminal was closed; stop the job cleanly, like Ctrl-C, so that the run is
        # recorded as stopped and continues later, instead of dying with torchrun orphaned.
        previous = {s: signal.signal(s, self._on_signal)
                    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
        try:
            yield
        finally:
            for s, handler in previous.items():
                signal.signal(s, handler)

    def _next_attempt(self) -> int:
        numbers = [a.attempt for a in self.state.attempts] + self.paths.attempts()
        return max(numbers) + 1 if numbers else 0

    def _finish(self, status: str) -> None:
        self.state = replace(self.state, status=status)
        self._save()
        if self._lock is not None:
            self._lock.close()

    def _header(self) -> str:
        m = self.manifest
        return (f"ecrl run: {self.paths.root} · {m.dataset['name']} D={m.dataset_size} · "
                f"{m.model} · B={m.global_batch} · {m.target_steps} steps · strategy "
                f"{m.strategy} every {m.ckpt_every} · world sizes "
                f"{','.join(map(str, m.world_sizes))}")

    def run(self) -> int:
        try:
            return self._run()
        except _DiskFull as exc:
            # No relaunch: the next attempt would hit the same wall. Nothing half-written is
            # left: every file the supervisor writes is replaced atomically or not at all.
            self.err(f"ecrl run: error: {exc} (the previous version of the file is intact); "
                     f"free some space, then run `ecrl run --out {self.paths.root}` to continue")
            if self._lock is not None:
                self._lock.close()
            return EXIT_FAILED
        finally:
            if self._standby is not None:  # an attempt that will not run
                self._standby.stop()

    def _run(self) -> int:
        # A duration counts from this command's start, not from each attempt's.
        self._deadline = resolve_deadline(self.config.deadline)
        if not self._open_run():
            return EXIT_OK
        self.out(self._header())
        relaunches = 0
        with self._signals():
            while True:
                if self._stop is not None:
                    self._finish("stopped")
                    return EXIT_STOPPED
                try:
                    choice = self._choice or self._resume_point()
                except (CheckpointError, RunFormatError) as exc:
                    self.err(f"ecrl run: error: {exc}")
                    self._finish("failed")
                    return EXIT_FAILED
                self._choice = None
                if self._deadline is not None and time.time() >= self._deadline:
                    self.out(f"ecrl {self.name}: the deadline has passed; run `ecrl {self.name} "
                             f"--out {self.paths.root}` again to continue")
                    self._finish("deadline")
                    return DEADLINE_EXIT_CODE
                outcome = self._attempt(choice)
                code = self._conclude(outcome, relaunches)
                if code is not None:
                    return code
                relaunches += 1

    def _attempt(self, choice: ResumeChoice) -> _Outcome:
        """Launch one attempt from ``choice``, wait for it, record and classify its end."""
        pointer = choice.pointer
        if choice.repaired and pointer is not None:
            # The supervisor holds the run's lock and no rank runs: repairing the pointer keeps
            # latest.json naming the checkpoint the run really continues from.
            self.err(f"ecrl run: {choice.describe(self.paths)}")
            self._write(self.paths.latest, pointer)
        target = self.manifest.target_steps
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
        how = "fresh start" if pointer is None else f"resume after step {pointer.global_step}"
        start = 0 if pointer is None else pointer.global_step + 1
        span = f"steps {start}..{target - 1}" if target else f"from step {start}"
        self.out(f"[attempt {attempt}] world size {world}, {how}, {span}"
                 + (f", failures at {fail_at}" if fail_at else ""))
        code = self._launch(attempt, world, pointer, fail_at)
        first, last = attempt_steps(self.paths, attempt, world)
        outcome = _Outcome(attempt=attempt, exit_code=code, last_step=last,
                           fired=read_fired(self.paths, attempt),
                           fatal=read_fatal(self.paths, attempt), status="failed")
        ending = read_ending(self.paths, attempt, world)
        # Read again: `ecrl launch` learns the target only once the script wrote run.json.
        if code == 0 and last == self.manifest.target_steps - 1:
            outcome = replace(outcome, status="completed")
        elif self._stop is not None:
            outcome = replace(outcome, status="stopped")
        elif ending is not None and outcome.fatal is None:
            outcome = replace(outcome, status=ending.status, ending=ending)
        extra = dict(self.state.extra)
        if outcome.ending is not None:
            extra["endings"] = {**extra.get("endings", {}),
                               str(attempt): outcome.ending.to_dict()}
        if outcome.status == "failed" and outcome.fired is None and outcome.fatal is None:
            outcome = replace(outcome, error=self._rank_error(attempt))
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

    def _conclude(self, outcome: _Outcome, relaunches: int) -> int | None:
        """Report how an attempt ended; the exit code when the run ends, None to relaunch."""
        attempt, last = outcome.attempt, outcome.last_step
        if outcome.status == "completed":
            self._finish("completed")
            self._print_summary()
            return EXIT_OK
        if outcome.status == "stopped":
            self.out(f"[attempt {attempt}] stopped after step {last}; run `ecrl {self.name} --out "
                     f"{self.paths.root}` again to continue")
            self._finish("stopped")
            return EXIT_STOPPED
        if outcome.fatal is not None:
            self.err(f"ecrl run: error: {outcome.fatal}")
            self._finish("failed")
            return EXIT_FAILED
        if outcome.status == "deadline":
            self.out(f"[attempt {attempt}] stopped after step {last} before the deadline, its "
                     f"checkpoint committed; run `ecrl {self.name} --out {self.paths.root}` "
                     "again to continue")
            self._finish("deadline")
            return DEADLINE_EXIT_CODE
        latest = read_latest(self.paths)
        after = ("no checkpoint yet" if latest is None
                 else f"latest checkpoint: step {latest.global_step}")
        if outcome.ending is not None:
            self.out(f"[attempt {attempt}] {_describe_ending(outcome.ending)}; {after}")
        elif outcome.fired is not None:
            self.out(f"[attempt {attempt}] injected failure after step "
                     f"{outcome.fired.global_step} (rank {outcome.fired.rank}, exit 137); {after}")
        else:
            self.err(f"[attempt {attempt}] crashed (torchrun exit {outcome.exit_code}) "
                     f"{_after_step(last)}; {after}")
            self._show_crash(attempt, outcome.error)
            if self._repeated(outcome):
                self.err(f"ecrl run: error: the same error ended attempts {attempt - 1} and "
                         f"{attempt} {_after_step(last)}, so a restart cannot fix it; fix the "
                         f"cause, then run `ecrl run --out {self.paths.root}` to continue")
                self._finish("failed")
                return EXIT_FAILED
        limit = self.config.effective_max_restarts
        if relaunches >= limit:
            self.err(f"ecrl run: restart limit reached (--max-restarts {limit}); the run stops "
                     f"{_after_step(last)}")
            self._finish("failed")
            return EXIT_FAILED
        return None

    def _print_summary(self) -> None:
        from ecrl.runtime.supervision.summary import render_summary, summarize

        self.out(f"ecrl {self.name}: done; run directory {self.paths.root}")
        for line in render_summary(summarize(str(self.paths.root))):
            self.out(f"  {line}")

    def _rank_error(self, attempt: int) -> RankError | None:
        path = self.paths.attempt_dir(attempt) / TORCHRUN_LOG
        try:
            errors = rank_errors(path.read_text(errors="replace"))
        except OSError:
            return None
        return errors[0] if errors else None

    def _repeated(self, outcome: _Outcome) -> bool:
        """The same exception ended the previous attempt at the same step, from the same
        checkpoint: a restart replays the same inputs, so it would fail again."""
        if outcome.error is None:
            return False
        crashes = self.state.extra.get("crashes", {})
        now, before = crashes.get(str(outcome.attempt)), crashes.get(str(outcome.attempt - 1))
        return isinstance(before, dict) and isinstance(now, dict) and all(
            before.get(k) == now.get(k) for k in ("exception", "last_step", "resumed_from_step"))

    def _show_crash(self, attempt: int, error: RankError | None) -> None:
        path = self.paths.attempt_dir(attempt) / TORCHRUN_LOG
        if error is None:
            self._show_log_tail(attempt)
            return
        who = "a rank" if error.rank is None else f"rank {error.rank}"
        self.err(f"  {who}: {error.exception}")
        self.err(f"  ({error.where + '; ' if error.where else ''}full traceback in {path})")

    def _show_log_tail(self, attempt: int, lines: int = 15) -> None:
        path = self._torchrun_log(attempt)
        with contextlib.suppress(OSError):
            text = path.read_text(errors="replace").splitlines()
            # The ranks' own one-line reports say more than torchrun's summary of them; failing
            # that, the first traceback (a rank's; torchrun's own comes after it).
            shown = [line for line in text
                     if line.startswith(("ecrl trainer (rank", "ecrl (rank"))][-lines:]
            if not shown and "Traceback (most recent call last):" in text:
                start = text.index("Traceback (most recent call last):")
                end = next((i for i in range(start + 1, len(text))
                            if text[i] and not text[i][0].isspace()), len(text) - 1)
                shown = text[start : end + 1][-lines:]
            shown = shown or text[-lines:]
            self.err(f"  from {path}:")
            for line in shown:
                self.err(f"  | {line}")
