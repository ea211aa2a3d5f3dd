"""Running a matrix: one ``ecrl run`` per unit, judged by the verifier, resumable (torch-free).

The output folder::

    manifest.json          the matrix (config, digest) and every unit's state
    config.toml            a copy of the config it ran
    data/NAME/             data sets the matrix wrote (``generate = N``)
    runs/UID/              each unit's run directory (``ecrl run --out``)
    units/UID.json         each finished unit's record: verdict, metrics, digest
    units/UID.log          the unit's ``ecrl run`` output
    summary.{csv,md,json}, units.csv, figures/*.png   (``_tables``, ``_figures``)

Resume. A unit is finished when its run completed *and* its record (``units/UID.json``, written
atomically after the verdict) exists; a rerun of ``ecrl matrix`` reuses those as they are. Any
other unit with a run directory is half-done: its run directory is deleted and the unit runs
again from scratch. Continuing the stopped run (``ecrl run --out SAME``) would be correct — the
verifier proves continued runs — but would count the interruption as one more restart and the
time ``ecrl matrix`` was not running as wall time, so that unit's restarts and goodput would no
longer be comparable with its suite's other variants. Before deleting, the matrix takes the run's
supervisor lock, so a supervisor still stopping after ``ecrl matrix`` was killed is waited for,
never raced.

Stopping. Ctrl-C or SIGTERM stops the running unit (its supervisor gets SIGINT and stops its
ranks), records nothing for it, and exits 130. If ``ecrl matrix`` is killed outright, the kernel
sends the unit's supervisor SIGTERM (a parent-death signal), which stops it the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from ecrl.contract.atomicio import atomic_write_text
from ecrl.contract.errors import ConfigError, RunFormatError
from ecrl.contract.runformat import RunPaths, SupervisorState, is_run_dir, read_json_record
from ecrl.runtime._proc import signal_on_parent_death
from ecrl.runtime.runconfig import RunConfig

from ._cifar import write_cifar
from ._config import MatrixConfig, Unit

__all__ = ["MatrixOutcome", "run_matrix", "unit_record_path", "read_records", "run_flags",
           "EXIT_OK", "EXIT_UNITS_FAILED", "EXIT_INTERRUPTED"]

EXIT_OK = 0
EXIT_UNITS_FAILED = 1
EXIT_INTERRUPTED = 130
LOCK_WAIT_S = 120.0
HEARTBEAT_S = 30.0
"""A long unit reports its step this often."""

Progress = Callable[[str], None]


@dataclass(frozen=True, kw_only=True, slots=True)
class MatrixOutcome:
    """What one ``ecrl matrix`` invocation did."""

    exit_code: int
    ran: tuple[str, ...]
    """uids of the units run by this invocation."""
    reused: tuple[str, ...]
    """uids of finished units found from an earlier invocation."""
    failed: tuple[str, ...]
    """uids whose run failed or whose verdict is not PASS."""
    interrupted: bool


def unit_record_path(out: Path, uid: str) -> Path:
    return out / "units" / f"{uid}.json"


def read_records(out: Path, config: MatrixConfig) -> dict[str, dict[str, Any]]:
    """The records of the finished units, by uid."""
    records: dict[str, dict[str, Any]] = {}
    for unit in config.units():
        path = unit_record_path(out, unit.uid)
        if path.exists():
            with contextlib.suppress(OSError, ValueError):
                records[unit.uid] = json.loads(path.read_text())
    return records


def run_flags(config: RunConfig) -> list[str]:
    """``ecrl run`` flags that reproduce ``config`` exactly."""
    flags: list[str] = []
    for name, value in config.to_dict().items():
        if value is None or value is False or value == []:
            continue
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif isinstance(value, list):
            flags += [flag, ",".join(map(str, value))]
        else:
            flags += [flag, str(value)]
    return flags


def _status(run_dir: Path) -> str | None:
    if not is_run_dir(run_dir):
        return None
    try:
        return read_json_record(RunPaths.of(run_dir).supervisor, SupervisorState).status
    except (RunFormatError, OSError):
        return None


def _finished(out: Path, unit: Unit) -> bool:
    record = unit_record_path(out, unit.uid)
    return record.exists() and _status(out / "runs" / unit.uid) == "completed"


@contextlib.contextmanager
def _matrix_lock(out: Path) -> Iterator[None]:
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / ".matrix.lock", "wb")  # noqa: SIM115 - held for the whole matrix
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigError(f"{out}: another `ecrl matrix` is running on this folder; wait for "
                              "it or use another --out") from None
        yield
    finally:
        handle.close()


def _remove_run(run_dir: Path) -> None:
    """Delete a half-done run once no supervisor holds it (one may still be stopping)."""
    lock = run_dir / ".supervisor.lock"
    if lock.exists():
        deadline = time.monotonic() + LOCK_WAIT_S
        with open(lock, "rb") as handle:
            while True:
                try:
                    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise ConfigError(f"{run_dir}: a supervisor still holds this run after "
                                          f"{LOCK_WAIT_S:.0f} s; stop it, then rerun "
                                          "`ecrl matrix`") from None
                    time.sleep(0.5)
    shutil.rmtree(run_dir)


def _check_folder(out: Path, config: MatrixConfig) -> dict[str, Any]:
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, ValueError):
            raise ConfigError(f"{manifest_path}: unreadable; use another --out") from None
        if manifest.get("digest") != config.digest():
            raise ConfigError(f"{out} holds the results of another matrix (its config, seeds or "
                              "the runtime's strategies differ); use another --out, or rerun "
                              "with the config it was made with")
        return dict(manifest)
    if out.exists() and any(p.name != ".matrix.lock" for p in out.iterdir()):
        raise ConfigError(f"{out} is not empty and holds no matrix; use another --out")
    return {}


def _write_manifest(out: Path, config: MatrixConfig, states: dict[str, dict[str, Any]]) -> None:
    manifest = {
        "format": 1,
        "config": config.path,
        "digest": config.digest(),
        "seeds": list(config.seeds),
        "strategies": list(config.strategies),
        "reference_strategy": config.reference_strategy,
        "suites": [s.name for s in config.suites()],
        "units": [{"uid": u.uid, **states.get(u.uid, {"state": "pending"})}
                  for u in config.units()],
    }
    atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=2) + "\n")


def _data_dirs(out: Path, config: MatrixConfig, progress: Progress) -> dict[str, str]:
    dirs: dict[str, str] = {}
    for d in config.datasets:
        if d.generate:
            root = out / "data" / d.name
            kind = str(d.settings["dataset"])
            progress(f"data set {d.name}: {d.generate} {kind} images in the CIFAR format "
                     f"({root})")
            dirs[d.name] = str(write_cifar(root, kind, d.generate).resolve())
    return dirs


class _Interrupt(Exception):
    pass


def _on_signal(signum: int, frame: Any) -> None:
    raise _Interrupt(signum)


def _launch(cmd: list[str], log: IO[bytes]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        start_new_session=True,  # a Ctrl-C reaches the unit through us, once
        preexec_fn=lambda: signal_on_parent_death(signal.SIGTERM))


def _stop(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=LOCK_WAIT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()


def _format_s(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds >= 3600:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    if seconds >= 60:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{seconds:.0f}s"


class _Eta:
    """Remaining time from the units this invocation ran: per model and kind, else overall."""

    def __init__(self) -> None:
        self.done: list[tuple[str, bool, float]] = []

    def add(self, unit: Unit, seconds: float) -> None:
        self.done.append((unit.model, unit.schedule is None, seconds))

    def guess(self, unit: Unit) -> float | None:
        for match in (lambda m, r: m == unit.model and r == (unit.schedule is None),
                      lambda m, r: m == unit.model, lambda m, r: True):
            seen = [s for m, r, s in self.done if match(m, r)]
            if seen:
                return sum(seen) / len(seen)
        return None

    def remaining(self, units: list[Unit]) -> str:
        guesses = [self.guess(u) for u in units]
        if not units:
            return "0s"
        if any(g is None for g in guesses):
            return "unknown until a unit has finished"
        return _format_s(sum(g for g in guesses if g is not None))


def run_matrix(config: MatrixConfig, out: Path, *, progress: Progress,
               python: str = sys.executable) -> MatrixOutcome:
    """Run every unit that is not finished yet; write each finished unit's record."""
    from ._report import write_outputs

    out = out.resolve()
    with _matrix_lock(out):
        manifest = _check_folder(out, config)
        states: dict[str, dict[str, Any]] = {u["uid"]: {k: v for k, v in u.items() if k != "uid"}
                                             for u in manifest.get("units", [])}
        shutil.copyfile(config.path, out / "config.toml")
        units = config.units()
        todo = [u for u in units if not _finished(out, u)]
        reused = tuple(u.uid for u in units if u not in todo)
        for uid in reused:
            states.setdefault(uid, {})["state"] = "finished"
        for state in states.values():
            if state.get("state") == "running":  # we hold the lock: its invocation is gone
                state["state"] = "stopped"
        _write_manifest(out, config, states)
        progress(f"{len(config.suites())} suites × {len(config.variants)} variants "
                 f"({', '.join(config.variants)}) × {len(config.seeds)} seed(s): {len(units)} "
                 f"units, {len(reused)} finished before, {len(todo)} to run → {out}")
        data_dirs = _data_dirs(out, config, progress) if todo else {}

        ran: list[str] = []
        failed: list[str] = []
        eta = _Eta()
        started = time.monotonic()
        interrupted = False
        handlers = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            for i, unit in enumerate(todo):
                states[unit.uid] = {"state": "running", "start_time": time.time()}
                _write_manifest(out, config, states)
                position = f"[matrix {len(reused) + i + 1}/{len(units)}]"
                progress(f"{position} {unit.uid}: running · elapsed "
                         f"{_format_s(time.monotonic() - started)} · ETA "
                         f"{eta.remaining(todo[i:])}")
                t0 = time.monotonic()

                def beat(line: str, prefix: str = position) -> None:
                    progress(f"{prefix} {line}")

                record = _run_unit(config, unit, out, data_dirs, python, beat)
                seconds = time.monotonic() - t0
                eta.add(unit, seconds)
                ran.append(unit.uid)
                ok = record["exit_code"] == 0 and record["verdict"] == "PASS"
                if not ok:
                    failed.append(unit.uid)
                states[unit.uid] = {"state": "finished" if record["complete"] else "failed",
                                    "verdict": record["verdict"],
                                    "exit_code": record["exit_code"],
                                    "start_time": record["start_time"],
                                    "end_time": record["end_time"]}
                _write_manifest(out, config, states)
                goodput = record["metrics"].get("goodput")
                progress(f"{position} {unit.uid}: {record['verdict']}"
                         + (f" (ecrl run exit {record['exit_code']})" if record["exit_code"]
                            else "")
                         + f", restarts {record['metrics'].get('restarts')}, goodput "
                         + (f"{goodput:.3g} steps/s" if goodput else "n/a")
                         + f", {_format_s(seconds)} · ETA {eta.remaining(todo[i + 1:])}")
                if record["exit_code"]:
                    progress(f"{position} {unit.uid}: {_last_line(out, unit)} (log: units/"
                             f"{unit.uid}.log)")
        except _Interrupt:
            interrupted = True
        finally:
            for s, handler in handlers.items():
                signal.signal(s, handler)
        if interrupted:
            for state in states.values():
                if state.get("state") == "running":
                    state["state"] = "stopped"
            _write_manifest(out, config, states)
            progress("interrupted: finished units are kept; rerun the same command to run the "
                     "rest")
            return MatrixOutcome(exit_code=EXIT_INTERRUPTED, ran=tuple(ran), reused=reused,
                                 failed=tuple(failed), interrupted=True)
        records = read_records(out, config)
        failed += [uid for uid in reused if records.get(uid, {}).get("verdict") != "PASS"]
        write_outputs(config, out, records)
        progress(f"done: {len(ran)} units run, {len(reused)} reused, {len(failed)} not PASS; "
                 f"tables in {out}/summary.md, figures in {out}/figures/")
        return MatrixOutcome(exit_code=EXIT_UNITS_FAILED if failed else EXIT_OK, ran=tuple(ran),
                             reused=reused, failed=tuple(failed), interrupted=False)


def _last_step(run_dir: Path) -> str | None:
    """``step S/T (attempt A)`` from the newest attempt's rank-0 log, for the heartbeat."""
    try:
        state = json.loads((run_dir / "supervisor.json").read_text())
        target = json.loads((run_dir / "run.json").read_text())["target_steps"]
        attempt = state["attempts"][-1]["attempt"]
        path = RunPaths.of(run_dir).rank_log(attempt, 0)
        with open(path, "rb") as handle:
            handle.seek(max(0, path.stat().st_size - 4096))
            lines = handle.read().splitlines()
        step = json.loads(lines[-1] if lines[-1].endswith(b"}") else lines[-2])["global_step"]
    except (OSError, ValueError, KeyError, IndexError):
        return None
    return f"step {step + 1}/{target} (attempt {attempt})"


def _last_line(out: Path, unit: Unit) -> str:
    """The last line ``ecrl run`` printed: its one-line error when it refused or failed."""
    try:
        lines = (out / "units" / f"{unit.uid}.log").read_text(errors="replace").splitlines()
    except OSError:
        return "no output"
    return next((line.strip() for line in reversed(lines) if line.strip()), "no output")


def _run_unit(config: MatrixConfig, unit: Unit, out: Path, data_dirs: dict[str, str],
              python: str, heartbeat: Progress) -> dict[str, Any]:
    """Run one unit from scratch, verify it, and write its record (only if the run completed)."""
    run_dir = out / "runs" / unit.uid
    if run_dir.exists():
        _remove_run(run_dir)
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    record_path = unit_record_path(out, unit.uid)
    record_path.unlink(missing_ok=True)
    record_path.parent.mkdir(parents=True, exist_ok=True)
    run_config = unit.run_config(str(run_dir), data_dirs.get(unit.dataset))
    cmd = [python, "-m", "ecrl.apps.cli", "run", *run_flags(run_config)]
    start = time.time()
    with open(out / "units" / f"{unit.uid}.log", "wb") as log:
        log.write(("$ " + " ".join(cmd) + "\n").encode())
        log.flush()
        proc = _launch(cmd, log)
        try:
            while True:
                try:
                    code = proc.wait(timeout=HEARTBEAT_S)
                    break
                except subprocess.TimeoutExpired:
                    where = _last_step(run_dir)
                    heartbeat(f"{unit.uid}: {where or 'starting'}")
        except BaseException:
            _stop(proc)
            raise
    end = time.time()
    record = _judge(config, unit, out, run_dir, code)
    record.update(start_time=start, end_time=end, duration_s=end - start,
                  command=cmd[1:])
    # Written last and atomically: its presence with a completed run means finished; a failed
    # run's record stays for the table but the unit runs again next time.
    atomic_write_text(record_path, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def _judge(config: MatrixConfig, unit: Unit, out: Path, run_dir: Path, code: int
           ) -> dict[str, Any]:
    from verifier import VerifierError, verify

    from ._measure import measure_run

    reference = out / "runs" / unit.reference if unit.reference else None
    verdict, unknown, counts, metrics = "UNKNOWN", ["no run directory"], {}, {}
    measured: dict[str, Any] | None = None
    if is_run_dir(run_dir):
        try:
            result = verify(run_dir, reference=reference if reference and is_run_dir(reference)
                            else None)
            run = result.runs[0]
            verdict, unknown = run.verdict, list(run.unknown)
            counts, metrics = dict(run.anomaly_counts), run.metrics.as_dict()
            with contextlib.suppress(ConfigError):
                measured = measure_run(run_dir, metrics=run.metrics).as_dict()
        except VerifierError as exc:
            unknown = [str(exc)]
    digest = None
    summary = run_dir / "final" / "summary.json"
    with contextlib.suppress(OSError, ValueError):
        digest = json.loads(summary.read_text()).get("params_digest")
    status = _status(run_dir)
    world_sizes: list[int] = []
    with contextlib.suppress(RunFormatError, OSError):
        state = read_json_record(RunPaths.of(run_dir).supervisor, SupervisorState)
        world_sizes = [a.world_size for a in state.attempts]
    return {
        "uid": unit.uid, "suite": unit.uid.split("/")[0], "dataset": unit.dataset,
        "model": unit.model, "schedule": unit.schedule, "variant": unit.variant,
        "strategy": unit.strategy, "seed": unit.seed, "reference": unit.reference,
        "fail_at": list(unit.settings.get("fail_at", [])),
        "run_dir": str(run_dir.relative_to(out)), "exit_code": code, "status": status,
        "complete": code == 0 and status == "completed",
        "verdict": verdict, "unknown": unknown, "anomaly_counts": counts, "metrics": metrics,
        "measured": measured, "params_digest": digest, "world_sizes": world_sizes,
    }


def default_out(config_path: str) -> Path:
    stem = Path(config_path).stem
    return Path(os.getcwd()) / f"{stem}-results"
